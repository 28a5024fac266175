// MessageDelegate: one message — prose as Markdown, code blocks apart with a copy button;
// the streaming message shows tokens/s; assistant messages can be regenerated, user
// messages edited and resent (the actions show on hover, in the header row).
pragma ComponentBehavior: Bound
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

Item {
    id: message
    required property ChatController chats
    required property int index
    required property string role
    required property string content
    required property list<string> blocks
    required property bool generating
    required property double tokensPerSecond
    required property string finishReason
    required property int tokenCount
    // The chat waits for KV memory: an unstarted answer says so instead of "thinking".
    property bool waitingForMemory: false
    readonly property bool fromUser: role === "user"
    property bool editing: false

    implicitHeight: bubble.implicitHeight

    Rectangle {
        id: bubble
        anchors.right: message.fromUser ? parent.right : undefined
        anchors.left: message.fromUser ? undefined : parent.left
        width: message.fromUser && !message.editing
               ? Math.min(parent.width * 0.85, Math.max(body.implicitWidth, 260) + 2 * Theme.padding)
               : parent.width
        implicitHeight: body.implicitHeight + 2 * Theme.padding
        radius: Theme.radius
        color: message.fromUser ? Theme.userBubble : Theme.assistantBubble
        border.color: message.fromUser ? "transparent" : Theme.border

        HoverHandler { id: hover }

        ColumnLayout {
            id: body
            anchors.fill: parent
            anchors.margins: Theme.padding
            spacing: Theme.spacing

            RowLayout {
                Layout.fillWidth: true
                spacing: Theme.spacing
                Label {
                    text: message.fromUser ? qsTr("You") : qsTr("Model")
                    color: Theme.mutedText
                    font.pixelSize: Theme.smallFontSize
                    font.weight: Font.DemiBold
                }
                BusyIndicator {
                    visible: message.generating
                    running: visible
                    implicitWidth: 16
                    implicitHeight: 16
                }
                Label {
                    Layout.fillWidth: true
                    color: Theme.mutedText
                    font.pixelSize: Theme.smallFontSize
                    elide: Text.ElideRight
                    text: message.fromUser ? ""
                        : message.generating && message.tokenCount === 0
                          ? (message.waitingForMemory ? qsTr("waiting for memory…") : qsTr("thinking…"))
                        // Token counts exist for this session's messages; saved ones keep tok/s.
                        : (message.tokenCount > 0 ? qsTr("%1 tokens · ").arg(message.tokenCount) : "")
                          + (message.tokensPerSecond > 0 ? qsTr("%1 tok/s").arg(message.tokensPerSecond.toFixed(1)) : "")
                          + (message.finishReason === "cancelled" ? qsTr(" · stopped")
                             : message.finishReason === "interrupted" ? qsTr(" · interrupted") : "")
                }
                // Actions: always laid out (the row's height does not change), shown on hover.
                Row {
                    visible: !message.generating && !message.editing
                    opacity: hover.hovered ? 1 : 0
                    spacing: 0
                    ToolButton {
                        text: qsTr("Copy")
                        font.pixelSize: Theme.smallFontSize
                        implicitHeight: 22
                        onClicked: Clipboard.copy(message.content)
                    }
                    ToolButton {
                        visible: message.fromUser
                        text: qsTr("Edit")
                        font.pixelSize: Theme.smallFontSize
                        implicitHeight: 22
                        onClicked: message.editing = true
                    }
                    ToolButton {
                        visible: !message.fromUser
                        text: qsTr("Regenerate")
                        font.pixelSize: Theme.smallFontSize
                        implicitHeight: 22
                        onClicked: message.chats.regenerate(message.index)
                    }
                }
            }

            Repeater {
                model: message.editing ? [] : message.blocks
                // Odd parts are code blocks (see splitMarkdownCodeBlocks); both kinds are
                // declared and one shown, so the parts need no Loader.
                delegate: Item {
                    id: part
                    required property int index
                    required property string modelData
                    readonly property bool isCode: index % 2 === 1
                    Layout.fillWidth: true
                    visible: isCode || modelData.length > 0
                    implicitWidth: isCode ? 320 : prosePart.implicitWidth
                    implicitHeight: isCode ? codePart.implicitHeight : prosePart.implicitHeight
                    TextEdit {
                        id: prosePart
                        width: parent.width
                        visible: !part.isCode
                        readOnly: true
                        selectByMouse: true
                        // Markdown rendered with the theme's link and inline-code colours,
                        // line breaks kept (Markdown.html in markdown_blocks.h).
                        textFormat: TextEdit.RichText
                        wrapMode: TextEdit.Wrap
                        text: part.isCode ? "" : Markdown.html(part.modelData, Theme.link, Theme.inlineCode, Theme.monoFamily)
                        color: Theme.text
                        selectionColor: Theme.selection
                        selectedTextColor: Theme.text
                        font.pixelSize: Theme.fontSize
                        onLinkActivated: link => Qt.openUrlExternally(link)
                    }
                    CodeBlock {
                        id: codePart
                        objectName: part.isCode ? "codeBlock" : ""
                        width: parent.width
                        visible: part.isCode
                        code: part.isCode ? part.modelData : ""
                        language: part.isCode ? Markdown.codeLanguage(message.content, (part.index - 1) / 2) : ""
                    }
                }
            }

            // Edit and resend (user messages).
            ColumnLayout {
                Layout.fillWidth: true
                visible: message.editing
                TextArea {
                    id: editField
                    Layout.fillWidth: true
                    wrapMode: TextEdit.Wrap
                    font.pixelSize: Theme.fontSize
                    text: message.content
                }
                RowLayout {
                    Layout.alignment: Qt.AlignRight
                    Button {
                        text: qsTr("Cancel")
                        onClicked: message.editing = false
                    }
                    PrimaryButton {
                        text: qsTr("Send")
                        onClicked: {
                            message.editing = false
                            message.chats.editAndResend(message.index, editField.text)
                        }
                    }
                }
            }
        }
    }
}
