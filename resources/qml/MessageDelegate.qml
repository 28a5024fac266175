// MessageDelegate: one message — prose as Markdown, code blocks apart with a copy button;
// the streaming message shows tokens/s; assistant messages can be regenerated, user
// messages edited and resent (the actions show on hover, in the header row); a turn with
// several versions shows ‹ 2/3 › to switch between them; each answer says why it stopped,
// and one cut at the length limit can be continued. A reasoning model's reasoning sits above
// the answer in a collapsible Thinking block.
pragma ComponentBehavior: Bound
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

Item {
    id: message
    required property ChatController chats
    required property int index
    required property string speaker  // the message's role: "user", "assistant", "system"
    required property string content
    required property list<string> blocks
    required property bool generating
    required property double tokensPerSecond
    required property string finishReason
    required property int tokenCount
    required property int version
    required property int versionCount
    required property double timeToFirstTokenMs
    required property bool viewStartsHere
    required property string reasoning
    required property double reasoningMs
    required property bool thinking
    // Tool use: a tool message is a card (ToolCallCard) instead of a bubble.
    required property var tool
    readonly property bool isToolCard: speaker === "tool"
    // Why the chat waits ("slot", "memory", or ""): an unstarted answer says so instead of
    // "thinking".
    property string waitingReason: ""
    // The last message of the chat (Continue is offered only there).
    property bool isLast: false
    // Tokens, tokens/s and time to first token, those known.
    readonly property string figures: {
        let text = tokenCount > 0 ? qsTr("%1 tokens").arg(tokenCount) : ""
        if (tokensPerSecond > 0)
            text += (text.length > 0 ? " · " : "") + qsTr("%1 tok/s").arg(tokensPerSecond.toFixed(1))
        if (timeToFirstTokenMs > 0)
            text += (text.length > 0 ? " · " : "")
                    + qsTr("first token %1 s").arg((timeToFirstTokenMs / 1000).toFixed(2))
        return text
    }
    readonly property string stopCaption: ({
        "eos": qsTr("end of text"), "stop": qsTr("stop string"), "length": qsTr("length limit"),
        "cancelled": qsTr("stopped"), "interrupted": qsTr("interrupted"), "error": qsTr("error"),
        "tool_calls": qsTr("called a tool")
    })[finishReason] ?? ""
    readonly property bool fromUser: speaker === "user"
    property bool editing: false

    implicitHeight: (isToolCard ? toolCard.implicitHeight : bubble.implicitHeight)
                    + (viewStartsHere ? viewMarker.implicitHeight + Theme.spacing : 0)

    function startEditing() {
        editing = true
        editField.text = content
        editField.forceActiveFocus()
        editField.cursorPosition = editField.length
    }

    // "The model's view begins here": older messages are no longer in its context.
    RowLayout {
        id: viewMarker
        visible: message.viewStartsHere
        width: parent.width
        spacing: Theme.spacing
        Rectangle { Layout.fillWidth: true; implicitHeight: 1; color: Theme.border }
        Label {
            text: qsTr("the model's view begins here")
            color: Theme.mutedText
            font.pixelSize: Theme.smallFontSize
        }
        Rectangle { Layout.fillWidth: true; implicitHeight: 1; color: Theme.border }
    }

    ToolCallCard {
        id: toolCard
        visible: message.isToolCard
        y: message.viewStartsHere ? viewMarker.implicitHeight + Theme.spacing : 0
        width: parent.width
        tool: message.isToolCard ? message.tool : ({})
        result: message.content
        onAnswered: (answer) => message.chats.answerToolCall(message.index, answer)
    }

    Rectangle {
        id: bubble
        visible: !message.isToolCard
        y: message.viewStartsHere ? viewMarker.implicitHeight + Theme.spacing : 0
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
                // ‹ 2/3 › between the versions of this turn.
                Row {
                    visible: message.versionCount > 1
                    spacing: 0
                    ToolButton {
                        objectName: "previousVersion"
                        text: "‹"
                        enabled: message.version > 1 && !message.chats.currentGenerating
                        implicitHeight: 22
                        implicitWidth: 22
                        onClicked: message.chats.switchVersion(message.index, -1)
                    }
                    Label {
                        anchors.verticalCenter: parent.verticalCenter
                        text: qsTr("%1/%2").arg(message.version).arg(message.versionCount)
                        color: Theme.mutedText
                        font.pixelSize: Theme.smallFontSize
                    }
                    ToolButton {
                        objectName: "nextVersion"
                        text: "›"
                        enabled: message.version < message.versionCount && !message.chats.currentGenerating
                        implicitHeight: 22
                        implicitWidth: 22
                        onClicked: message.chats.switchVersion(message.index, 1)
                    }
                }
                Label {
                    Layout.fillWidth: true
                    color: Theme.mutedText
                    font.pixelSize: Theme.smallFontSize
                    elide: Text.ElideRight
                    text: message.fromUser ? ""
                        : message.generating && message.tokenCount === 0
                          ? (message.waitingReason === "slot" ? qsTr("waiting for a free chat slot…")
                             : message.waitingReason === "memory" ? qsTr("waiting for memory…")
                             : qsTr("thinking…"))
                        : message.figures
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
                        onClicked: message.startEditing()
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

            ThinkingBlock {
                Layout.fillWidth: true
                visible: !message.fromUser && message.reasoning.length > 0
                reasoning: message.reasoning
                reasoningMs: message.reasoningMs
                thinking: message.thinking
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

            // Why the answer stopped, and Continue for one cut at the length limit.
            RowLayout {
                Layout.fillWidth: true
                visible: !message.fromUser && !message.generating && message.stopCaption.length > 0
                spacing: Theme.spacing
                Label {
                    objectName: "stopCaption"
                    text: message.stopCaption
                    color: message.finishReason === "error" ? Theme.errorText : Theme.mutedText
                    font.pixelSize: Theme.smallFontSize
                    font.italic: true
                }
                ToolButton {
                    objectName: "continueButton"
                    visible: message.finishReason === "length" && message.isLast
                    text: qsTr("Continue")
                    font.pixelSize: Theme.smallFontSize
                    implicitHeight: 22
                    onClicked: message.chats.continueReply(message.index)
                }
                // A reply that failed part-way (a cut stream, a server error) keeps its text,
                // marked by the caption; Retry asks again as a new version of the turn.
                ToolButton {
                    objectName: "retryButton"
                    visible: message.finishReason === "error" && message.isLast
                    text: qsTr("Retry")
                    font.pixelSize: Theme.smallFontSize
                    implicitHeight: 22
                    onClicked: message.chats.regenerate(message.index)
                }
                Item { Layout.fillWidth: true }
            }

            // Edit and resend (user messages).
            ColumnLayout {
                Layout.fillWidth: true
                visible: message.editing
                TextArea {
                    id: editField
                    objectName: "editField"
                    Layout.fillWidth: true
                    wrapMode: TextEdit.Wrap
                    font.pixelSize: Theme.fontSize
                    color: Theme.text
                    background: Rectangle {
                        radius: Theme.radius
                        color: Theme.surface
                        border.width: editField.activeFocus ? 2 : 1
                        border.color: editField.activeFocus ? Theme.accent : Theme.border
                    }
                    Keys.onEscapePressed: message.editing = false
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
