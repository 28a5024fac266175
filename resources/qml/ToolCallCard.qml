// ToolCallCard: one tool call of the model — the tool, its server and arguments — and what
// became of it: asking (Allow once / Always for this tool / Deny), running, its result, its
// failure (an error or a timeout) or the user's refusal.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

Rectangle {
    id: card
    objectName: "toolCallCard"
    // {"id", "name", "server", "arguments", "state", "error"} (MessageModel's tool role).
    property var tool: ({})
    property string result: ""
    readonly property string callState: tool.state ?? ""
    readonly property string prettyArguments: {
        const text = tool.arguments ?? ""
        try {
            return JSON.stringify(JSON.parse(text), null, 2)
        } catch (e) {
            return text
        }
    }
    signal answered(string answer)

    implicitHeight: column.implicitHeight + 2 * Theme.padding
    radius: Theme.radius
    color: Theme.surface
    border.color: callState === "failed" ? Theme.errorText : callState === "asking" ? Theme.accent : Theme.border
    border.width: callState === "asking" ? 2 : 1

    ColumnLayout {
        id: column
        anchors.fill: parent
        anchors.margins: Theme.padding
        spacing: Theme.spacing

        RowLayout {
            Layout.fillWidth: true
            spacing: Theme.spacing
            Label {
                Layout.fillWidth: true
                textFormat: Text.StyledText
                text: qsTr("Tool call <b>%1</b>").arg(card.tool.name ?? "")
                      + (card.tool.server ? qsTr(" · %1").arg(card.tool.server) : "")
                color: Theme.text
                font.pixelSize: Theme.fontSize
                elide: Text.ElideRight
            }
            Label {
                objectName: "toolCallState"
                text: ({ "asking": qsTr("waiting for you"), "running": qsTr("running…"),
                         "done": qsTr("done"), "failed": qsTr("failed"), "denied": qsTr("denied") })[card.callState] ?? card.callState
                color: card.callState === "failed" ? Theme.errorText
                     : card.callState === "done" ? Theme.generating : Theme.mutedText
                font.pixelSize: Theme.smallFontSize
            }
        }
        Rectangle {
            Layout.fillWidth: true
            implicitHeight: argumentsText.implicitHeight + 2 * Theme.spacing
            radius: 6
            color: Theme.codeBackground
            Label {
                id: argumentsText
                objectName: "toolCallArguments"
                anchors.fill: parent
                anchors.margins: Theme.spacing
                text: card.prettyArguments
                wrapMode: Text.WrapAnywhere
                color: Theme.codeText
                font.family: Theme.monoFamily
                font.pixelSize: Theme.smallFontSize
            }
        }
        RowLayout {
            visible: card.callState === "asking"
            Layout.fillWidth: true
            spacing: Theme.spacing
            Label {
                Layout.fillWidth: true
                text: qsTr("Run this tool?")
                color: Theme.text
                font.pixelSize: Theme.fontSize
            }
            Button {
                objectName: "toolAllowOnce"
                text: qsTr("Allow once")
                highlighted: true
                onClicked: card.answered("once")
            }
            Button {
                objectName: "toolAllowAlways"
                text: qsTr("Always for this tool")
                onClicked: card.answered("always")
            }
            Button {
                objectName: "toolDeny"
                text: qsTr("Deny")
                onClicked: card.answered("deny")
            }
        }
        RowLayout {
            visible: card.callState === "running"
            spacing: Theme.spacing
            BusyIndicator { implicitWidth: 20; implicitHeight: 20; running: card.callState === "running" }
            Label {
                text: qsTr("Waiting for %1…").arg(card.tool.server ?? "")
                color: Theme.mutedText
                font.pixelSize: Theme.smallFontSize
            }
        }
        Label {
            objectName: "toolCallResult"
            visible: card.callState === "done"
            Layout.fillWidth: true
            wrapMode: Text.Wrap
            maximumLineCount: 12
            elide: Text.ElideRight
            font.pixelSize: Theme.smallFontSize
            font.family: Theme.monoFamily
            color: Theme.text
            text: card.result
        }
        Label {
            objectName: "toolCallNote"
            visible: card.callState === "failed" || card.callState === "denied"
            Layout.fillWidth: true
            wrapMode: Text.Wrap
            font.pixelSize: Theme.smallFontSize
            color: card.callState === "failed" ? Theme.errorText : Theme.text
            text: card.callState === "failed" ? qsTr("The call failed: %1").arg(card.tool.error ?? "")
                                              : qsTr("You denied this call; the model is told so.")
        }
    }
}
