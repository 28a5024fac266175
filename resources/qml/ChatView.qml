// ChatView: the open chat's messages, following the newest while it streams.
import QtQuick
import Granule
import QtQuick.Controls

ListView {
    id: view
    required property ChatController chats
    required property TelemetryModel telemetry
    // The open chat is queued behind the KV budget (its answer has not started).
    readonly property bool waitingForMemory: telemetry.frame.scheduler.waiting > 0
                                             && telemetry.isWaiting(chats.currentChatId)
    // Follow the bottom unless the user scrolled up to read.
    property bool following: true

    model: chats.messages
    clip: true
    spacing: Theme.padding
    topMargin: Theme.padding
    bottomMargin: Theme.padding
    boundsBehavior: Flickable.StopAtBounds
    ScrollBar.vertical: ScrollBar {}

    delegate: MessageDelegate {
        width: Math.min(ListView.view.width - 2 * Theme.padding, Theme.contentMaxWidth)
        x: (ListView.view.width - width) / 2
        chats: (ListView.view as ChatView).chats
        waitingForMemory: (ListView.view as ChatView).waitingForMemory
    }

    onMovementEnded: following = atYEnd
    onContentHeightChanged: if (following) positionViewAtEnd()
    onCountChanged: {
        following = true
        positionViewAtEnd()
    }
    Connections {
        target: view.chats
        function onCurrentChatChanged() {
            view.following = true
            view.positionViewAtEnd()
        }
    }
}
