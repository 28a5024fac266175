// ChatListItem: one chat in the sidebar — title, a dot while it generates, rename in
// place (double-click or ✎), delete (✕, undoable). Hovering highlights its KV.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

Rectangle {
    id: item
    required property ChatController chats
    required property TelemetryModel telemetry
    required property double chatId   // a qint64 role; ids stay far below 2^53
    required property string title
    required property bool generating
    readonly property bool current: chatId === chats.currentChatId
    readonly property bool hovered: hover.hovered
    property bool renaming: false

    implicitHeight: 38
    radius: Theme.radius
    color: current ? Theme.selection : (hovered ? Theme.hover : "transparent")

    HoverHandler {
        id: hover
        onHoveredChanged: item.telemetry.highlightedChatId = hovered ? item.chatId : 0
    }
    TapHandler {
        onTapped: item.chats.selectChat(item.chatId)
        onDoubleTapped: item.renaming = true
    }

    RowLayout {
        anchors.fill: parent
        anchors.leftMargin: Theme.padding
        anchors.rightMargin: 4
        spacing: Theme.spacing
        Rectangle {
            implicitWidth: 8
            implicitHeight: 8
            radius: 4
            color: item.generating ? Theme.generating : "transparent"
            border.color: item.generating ? Theme.generating : Theme.mutedText
            border.width: 1
            SequentialAnimation on opacity {
                running: item.generating
                loops: Animation.Infinite
                alwaysRunToEnd: true
                NumberAnimation { to: 0.35; duration: 600 }
                NumberAnimation { to: 1.0; duration: 600 }
            }
        }
        Label {
            Layout.fillWidth: true
            visible: !item.renaming
            text: item.title
            elide: Text.ElideRight
            color: Theme.text
            font.pixelSize: Theme.fontSize
            font.weight: item.current ? Font.DemiBold : Font.Normal
        }
        TextField {
            id: renameField
            Layout.fillWidth: true
            visible: item.renaming
            text: item.title
            font.pixelSize: Theme.fontSize
            onVisibleChanged: if (visible) { forceActiveFocus(); selectAll() }
            onAccepted: {
                item.chats.renameChat(item.chatId, text)
                item.renaming = false
            }
            Keys.onEscapePressed: item.renaming = false
            onActiveFocusChanged: if (!activeFocus) item.renaming = false
        }
        ToolButton {
            visible: item.hovered && !item.renaming
            text: "✎"
            font.pixelSize: Theme.fontSize
            implicitWidth: 28
            onClicked: item.renaming = true
            ToolTip.visible: hovered
            ToolTip.text: qsTr("Rename")
        }
        ToolButton {
            visible: item.hovered && !item.renaming
            text: "✕"
            font.pixelSize: Theme.fontSize
            implicitWidth: 28
            onClicked: item.chats.deleteChat(item.chatId)
            ToolTip.visible: hovered
            ToolTip.text: qsTr("Delete (can be undone)")
        }
    }
}
