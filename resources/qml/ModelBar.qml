// ModelBar: the open chat's engine — the loaded model (its name elided with the full name in
// a tooltip), its block type, device and context; or, for a chat on an endpoint, the endpoint
// and model, the server and its URL — the buttons to the models page and the chat's
// settings; load progress while a model loads. Every control stays inside the bar at the
// minimum window.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

Rectangle {
    id: bar
    required property ModelController model
    required property ChatController chats
    // Names a chat's endpoint model (null: the loaded model only).
    property EndpointsController endpoints: null
    // The open chat runs on an endpoint's model ("URL#model"), not on the loaded model.
    readonly property string remoteRef: bar.endpoints !== null ? bar.chats.currentEngine : ""
    readonly property bool remote: remoteRef.length > 0
    // Re-read when the endpoints change (a rename, a refreshed model list or status).
    readonly property string remoteName: remote && bar.endpoints.engineChoices.length >= 0
                                         ? bar.endpoints.engineLabel(remoteRef) : ""
    readonly property string remoteFacts: remote && bar.endpoints.engineChoices.length >= 0
                                          ? bar.endpoints.engineFacts(remoteRef) : ""
    readonly property int remoteContext: remote && bar.endpoints.engineChoices.length >= 0
                                         ? bar.endpoints.contextOf(remoteRef) : 0
    signal modelsRequested()
    signal chatSettingsRequested()

    implicitHeight: column.implicitHeight + 2 * Theme.spacing
    color: Theme.surface

    ColumnLayout {
        id: column
        anchors.fill: parent
        anchors.leftMargin: Theme.spacingLarge
        anchors.rightMargin: Theme.padding
        anchors.topMargin: Theme.spacing
        anchors.bottomMargin: Theme.spacing
        spacing: Theme.spacingSmall

        RowLayout {
            spacing: Theme.spacing
            Layout.fillWidth: true

            // Name over facts: both elide, so the buttons always keep their room.
            ColumnLayout {
                Layout.fillWidth: true
                Layout.minimumWidth: 80
                spacing: 0
                Label {
                    id: nameLabel
                    objectName: "modelName"
                    Layout.fillWidth: true
                    elide: Text.ElideRight
                    color: Theme.text
                    font.pixelSize: Theme.titleFontSize
                    font.weight: Font.DemiBold
                    text: bar.remote ? bar.remoteName
                        : bar.model.ready ? bar.model.modelName
                        : bar.model.status === ModelController.Loading ? qsTr("Loading…")
                        : qsTr("No model loaded")
                    HoverHandler { id: nameHover }
                    ToolTip.visible: nameHover.hovered && nameLabel.truncated
                    ToolTip.text: bar.remote ? bar.remoteName + "\n" + bar.remoteRef
                                             : bar.model.modelName + "\n" + bar.model.modelPath
                }
                Label {
                    id: factsLabel
                    Layout.fillWidth: true
                    objectName: "modelFacts"
                    visible: bar.model.ready || bar.remote
                    elide: Text.ElideRight
                    color: Theme.mutedText
                    font.pixelSize: Theme.smallFontSize
                    text: bar.remote
                          ? [bar.remoteFacts,
                             bar.remoteContext > 0
                             ? qsTr("%1 tokens per chat").arg(bar.remoteContext.toLocaleString(Qt.locale(), "f", 0))
                             : ""].filter(s => s.length > 0).join("  ·  ")
                          : [bar.model.blockType, bar.model.device,
                           // A server that does not say its context (Granule, llama-server's
                           // /v1/models) leaves it 0: not shown.
                           bar.model.contextPerChat > 0
                           ? qsTr("%1 tokens per chat").arg(bar.model.contextPerChat.toLocaleString(Qt.locale(), "f", 0))
                           : ""]
                          .filter(s => s.length > 0).join("  ·  ")
                    HoverHandler { id: factsHover }
                    ToolTip.visible: factsHover.hovered && factsLabel.truncated
                    ToolTip.text: factsLabel.text
                }
            }
            Button {
                objectName: "chatSettingsButton"
                text: qsTr("Chat settings")
                visible: bar.chats.currentChatId !== 0
                font.pixelSize: Theme.fontSize
                onClicked: bar.chatSettingsRequested()
                ToolTip.visible: hovered
                ToolTip.text: qsTr("System prompt and sampling for this chat")
            }
            Button {
                objectName: "modelsButton"
                text: qsTr("Models…")
                font.pixelSize: Theme.fontSize
                enabled: bar.model.status !== ModelController.Loading
                onClicked: bar.modelsRequested()
                ToolTip.visible: hovered
                ToolTip.text: qsTr("The models on disk, their fit, and opening another GGUF")
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
                // Indeterminate animates on every frame: only while loading.
                indeterminate: visible && bar.model.loadProgress <= 0
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
