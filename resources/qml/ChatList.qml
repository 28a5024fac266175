// ChatList: the sidebar's list of chats; its items reach the controller through it.
import QtQuick
import Granule
import QtQuick.Controls

ListView {
    id: list
    required property ChatController chats
    required property TelemetryModel telemetry

    clip: true
    spacing: 2
    model: chats.conversations
    boundsBehavior: Flickable.StopAtBounds
    ScrollBar.vertical: ScrollBar {}

    delegate: ChatListItem {
        width: ListView.view.width
        chats: (ListView.view as ChatList).chats
        telemetry: (ListView.view as ChatList).telemetry
    }
}
