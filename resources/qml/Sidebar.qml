// Sidebar: new chat, search, the chats (newest first, a dot on those generating),
// rename in place, delete with undo, the API server's requests while the window serves the
// OpenAI API, and the settings button.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

Rectangle {
    id: sidebar
    required property ChatController chats
    required property TelemetryModel telemetry
    required property ApiServerController server
    signal settingsRequested()

    function focusSearch() {
        search.forceActiveFocus()
        search.selectAll()
    }

    color: Theme.sidebar

    ColumnLayout {
        anchors.fill: parent
        anchors.margins: Theme.padding
        spacing: Theme.spacing

        Button {
            id: newChat
            Layout.fillWidth: true
            text: qsTr("+  New chat")
            font.pixelSize: Theme.fontSize
            onClicked: sidebar.chats.newChat()
            ToolTip.visible: hovered
            ToolTip.text: qsTr("New chat (Ctrl+N)")
        }

        TextField {
            id: search
            Layout.fillWidth: true
            placeholderText: qsTr("Search chats (Ctrl+F)")
            font.pixelSize: Theme.fontSize
            text: sidebar.chats.searchText
            onTextEdited: sidebar.chats.searchText = text
            Keys.onEscapePressed: {
                text = ""
                sidebar.chats.searchText = ""
            }
        }

        ChatList {
            id: list
            Layout.fillWidth: true
            Layout.fillHeight: true
            chats: sidebar.chats
            telemetry: sidebar.telemetry

            Label {
                anchors.centerIn: parent
                width: parent.width - 2 * Theme.padding
                visible: list.count === 0
                horizontalAlignment: Text.AlignHCenter
                wrapMode: Text.Wrap
                color: Theme.mutedText
                font.pixelSize: Theme.fontSize
                text: sidebar.chats.searchText.length > 0 ? qsTr("No chat matches “%1”.").arg(sidebar.chats.searchText)
                                                          : qsTr("No chats yet.")
            }
        }

        // Undo for the last deletion.
        Rectangle {
            Layout.fillWidth: true
            visible: sidebar.chats.deletedTitle.length > 0
            implicitHeight: undoRow.implicitHeight + Theme.spacing
            radius: Theme.radius
            color: Theme.raised
            RowLayout {
                id: undoRow
                anchors.fill: parent
                anchors.leftMargin: Theme.spacing
                anchors.rightMargin: 2
                Label {
                    Layout.fillWidth: true
                    elide: Text.ElideRight
                    color: Theme.mutedText
                    font.pixelSize: Theme.smallFontSize
                    text: qsTr("Deleted “%1”").arg(sidebar.chats.deletedTitle)
                }
                Button {
                    flat: true
                    text: qsTr("Undo")
                    font.pixelSize: Theme.smallFontSize
                    onClicked: sidebar.chats.undoDelete()
                }
            }
        }

        ApiRequestList {
            Layout.fillWidth: true
            visible: sidebar.server.state !== ApiServerController.Off
            server: sidebar.server
        }

        Button {
            Layout.fillWidth: true
            flat: true
            text: qsTr("⚙  Settings")
            font.pixelSize: Theme.fontSize
            onClicked: sidebar.settingsRequested()
            ToolTip.visible: hovered
            ToolTip.text: qsTr("Settings (Ctrl+,)")
        }
    }
}
