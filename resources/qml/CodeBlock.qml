// CodeBlock: one fenced code block of a message, monospace, selectable, with a copy button.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

Rectangle {
    id: block
    required property string code

    implicitHeight: codeText.implicitHeight + header.implicitHeight + Theme.spacing
    radius: 6
    color: Theme.codeBackground
    border.color: Theme.border

    RowLayout {
        id: header
        anchors.top: parent.top
        anchors.right: parent.right
        anchors.left: parent.left
        anchors.leftMargin: Theme.spacing
        Label {
            Layout.fillWidth: true
            text: qsTr("code")
            color: Theme.mutedText
            font.pixelSize: Theme.smallFontSize
        }
        ToolButton {
            id: copyButton
            objectName: "copyButton"
            property bool copied: false
            text: copied ? qsTr("Copied ✓") : qsTr("Copy")
            font.pixelSize: Theme.smallFontSize
            onClicked: {
                Clipboard.copy(block.code)
                copied = true
                resetCopied.restart()
            }
            Timer {
                id: resetCopied
                interval: 1500
                onTriggered: copyButton.copied = false
            }
        }
    }

    TextEdit {
        id: codeText
        anchors.top: header.bottom
        anchors.left: parent.left
        anchors.right: parent.right
        anchors.margins: Theme.spacing
        anchors.topMargin: 0
        readOnly: true
        selectByMouse: true
        wrapMode: TextEdit.WrapAnywhere
        textFormat: TextEdit.PlainText
        text: block.code
        color: Theme.codeText
        selectionColor: Theme.selection
        selectedTextColor: Theme.text
        font.family: Theme.monoFamily
        font.pixelSize: Theme.fontSize - 1
    }
}
