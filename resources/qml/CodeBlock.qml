// CodeBlock: one fenced code block of a message — its language in the header, the code
// monospace, selectable and highlighted (CodeHighlighter), with a copy button.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

Rectangle {
    id: block
    required property string code
    // The fence's info string ("python", "c++"); "" when the fence named none.
    property string language: ""

    implicitHeight: codeText.implicitHeight + header.height + Theme.spacing * 2
    radius: Theme.radius
    color: Theme.codeBackground
    border.color: Theme.border

    Rectangle {
        id: header
        anchors.top: parent.top
        anchors.left: parent.left
        anchors.right: parent.right
        anchors.margins: 1
        height: 30
        radius: Theme.radius
        color: Theme.codeHeader
        RowLayout {
            anchors.fill: parent
            anchors.leftMargin: Theme.padding
            anchors.rightMargin: Theme.spacing / 2
            Label {
                objectName: "codeLanguage"
                Layout.fillWidth: true
                text: block.language.length > 0 ? block.language : qsTr("text")
                color: Theme.mutedText
                font.pixelSize: Theme.smallFontSize
                font.family: Theme.monoFamily
            }
            ToolButton {
                id: copyButton
                objectName: "copyButton"
                property bool copied: false
                implicitHeight: 26
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
    }

    TextEdit {
        id: codeText
        objectName: "codeText"
        anchors.top: header.bottom
        anchors.left: parent.left
        anchors.right: parent.right
        anchors.leftMargin: Theme.padding
        anchors.rightMargin: Theme.padding
        anchors.topMargin: Theme.spacing
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

    CodeHighlighter {
        document: codeText.textDocument
        language: block.language
        dark: Theme.dark
    }
}
