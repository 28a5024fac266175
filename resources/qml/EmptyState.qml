// EmptyState: what the conversation area shows with no model (one large "Open a model"
// button, and the default model when it is present) or no chat yet; an empty chat says where
// it will run (EngineMenuButton), so a chat on an endpoint needs no local model.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

Item {
    id: empty
    required property ChatController chats
    required property ModelController model
    required property EndpointsController endpoints
    // The open chat runs on an endpoint's model: it can start without a local model.
    readonly property bool remote: chats.currentChatId > 0 && chats.currentEngine.length > 0
    readonly property bool ready: model.ready || remote
    signal openRequested()

    ColumnLayout {
        anchors.centerIn: parent
        width: Math.min(parent.width - 4 * Theme.padding, 520)
        spacing: Theme.padding

        Label {
            Layout.fillWidth: true
            horizontalAlignment: Text.AlignHCenter
            wrapMode: Text.Wrap
            color: Theme.text
            font.pixelSize: 22
            font.weight: Font.DemiBold
            text: empty.ready ? qsTr("Start a conversation")
                : empty.model.status === ModelController.Loading ? qsTr("Loading the model…")
                : qsTr("Open a model to begin")
        }
        Label {
            Layout.fillWidth: true
            horizontalAlignment: Text.AlignHCenter
            wrapMode: Text.Wrap
            color: Theme.mutedText
            font.pixelSize: Theme.fontSize
            text: empty.ready
                  ? qsTr("Type a message below, or press Ctrl+N for a new chat. Several chats can generate at once.")
                  : qsTr("Granule runs GGUF models (Llama, Mistral, Qwen, SmolLM2) on your GPU, or on the CPU when there is none.")
        }
        PrimaryButton {
            Layout.alignment: Qt.AlignHCenter
            visible: !empty.ready && empty.model.status !== ModelController.Loading
            text: qsTr("Open a model…")
            font.pixelSize: Theme.titleFontSize
            padding: Theme.padding
            onClicked: empty.openRequested()
        }
        Button {
            Layout.alignment: Qt.AlignHCenter
            visible: !empty.ready && empty.model.status !== ModelController.Loading
                     && empty.model.defaultModelPresent
            text: qsTr("Use %1").arg(empty.model.defaultModelPath.split("/").pop())
            font.pixelSize: Theme.fontSize
            onClicked: empty.model.load(empty.model.defaultModelPath)
        }
        RowLayout {
            Layout.alignment: Qt.AlignHCenter
            visible: empty.chats.currentChatId > 0
            spacing: Theme.spacing
            Label {
                text: qsTr("Runs on")
                color: Theme.mutedText
                font.pixelSize: Theme.smallFontSize
            }
            EngineMenuButton {
                chats: empty.chats
                endpoints: empty.endpoints
            }
        }
        PrimaryButton {
            Layout.alignment: Qt.AlignHCenter
            // With endpoints, a chat can run without a local model (chosen in it, above).
            visible: empty.ready || (empty.chats.currentChatId === 0 && empty.endpoints.engineChoices.length > 0)
            text: qsTr("+  New chat")
            font.pixelSize: Theme.titleFontSize
            padding: Theme.padding
            onClicked: empty.chats.newChat()
        }
    }
}
