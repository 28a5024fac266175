// Composer: the message box. Enter sends, Shift+Enter starts a new line; while the chat
// generates, Stop (or Esc) ends it.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

Rectangle {
    id: composer
    required property ChatController chats
    required property ModelController model

    function send() {
        if (input.text.trim().length === 0 || !(chats.modelReady || chats.currentEngine.length > 0))
            return
        chats.send(input.text)
        input.text = ""
    }
    function focusInput() { input.forceActiveFocus() }

    implicitHeight: row.implicitHeight + 2 * Theme.padding
    color: Theme.window

    RowLayout {
        id: row
        anchors.fill: parent
        anchors.margins: Theme.padding
        spacing: Theme.spacing

        ScrollView {
            Layout.fillWidth: true
            Layout.preferredHeight: Math.min(Math.max(input.implicitHeight, 44), 180)
            TextArea {
                id: input
                objectName: "messageInput"
                wrapMode: TextEdit.Wrap
                font.pixelSize: Theme.fontSize
                placeholderText: composer.chats.modelReady || composer.chats.currentEngine.length > 0 ? qsTr("Message…  (Enter sends, Shift+Enter new line)")
                                                           : qsTr("Open a model to start chatting")
                color: Theme.text
                background: Rectangle {
                    radius: Theme.radius
                    color: Theme.surface
                    border.color: input.activeFocus ? Theme.accent : Theme.border
                }
                Keys.onPressed: event => {
                    if ((event.key === Qt.Key_Return || event.key === Qt.Key_Enter)
                            && !(event.modifiers & Qt.ShiftModifier)) {
                        composer.send()
                        event.accepted = true
                    }
                }
            }
        }
        PrimaryButton {
            text: qsTr("Send")
            enabled: (composer.chats.modelReady || composer.chats.currentEngine.length > 0) && input.text.trim().length > 0
            onClicked: composer.send()
        }
        Button {
            text: qsTr("■ Stop")
            visible: composer.chats.currentGenerating
            font.pixelSize: Theme.fontSize
            onClicked: composer.chats.stop()
            ToolTip.visible: hovered
            ToolTip.text: qsTr("Stop generating (Esc)")
        }
    }
}
