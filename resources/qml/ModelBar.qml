// ModelBar: the loaded model, its block type and device; the button to open another
// GGUF; load progress while one loads.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

Rectangle {
    id: bar
    required property ModelController model
    required property ChatController chats
    signal openRequested()
    signal chatSettingsRequested()

    implicitHeight: column.implicitHeight + 2 * Theme.spacing
    color: Theme.surface

    ColumnLayout {
        id: column
        anchors.fill: parent
        anchors.leftMargin: Theme.padding
        anchors.rightMargin: Theme.padding
        anchors.topMargin: Theme.spacing
        anchors.bottomMargin: Theme.spacing
        spacing: 4

        RowLayout {
            spacing: Theme.spacing
            Layout.fillWidth: true

            Label {
                Layout.fillWidth: true
                elide: Text.ElideRight
                color: Theme.text
                font.pixelSize: Theme.titleFontSize
                font.weight: Font.DemiBold
                text: bar.model.ready ? bar.model.modelName
                    : bar.model.status === ModelController.Loading ? qsTr("Loading…")
                    : qsTr("No model loaded")
            }
            Label {
                visible: bar.model.ready
                color: Theme.mutedText
                font.pixelSize: Theme.fontSize
                text: [bar.model.blockType, bar.model.device,
                       qsTr("%1 tokens per chat").arg(bar.model.contextPerChat.toLocaleString(Qt.locale(), "f", 0))]
                      .filter(s => s.length > 0).join("  ·  ")
            }
            Button {
                text: qsTr("Chat settings")
                visible: bar.chats.currentChatId !== 0
                font.pixelSize: Theme.fontSize
                onClicked: bar.chatSettingsRequested()
                ToolTip.visible: hovered
                ToolTip.text: qsTr("System prompt and sampling for this chat")
            }
            Button {
                text: qsTr("Open model…")
                font.pixelSize: Theme.fontSize
                enabled: bar.model.status !== ModelController.Loading
                onClicked: bar.openRequested()
            }
        }

        RowLayout {
            Layout.fillWidth: true
            visible: bar.model.status === ModelController.Loading
            spacing: Theme.spacing
            ProgressBar {
                Layout.fillWidth: true
                from: 0
                to: 1
                value: bar.model.loadProgress
                indeterminate: bar.model.loadProgress <= 0
            }
            Label {
                color: Theme.mutedText
                font.pixelSize: Theme.smallFontSize
                text: bar.model.loadStage
            }
        }
    }

    Rectangle {
        anchors.bottom: parent.bottom
        width: parent.width
        height: 1
        color: Theme.border
    }
}
