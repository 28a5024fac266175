// EmptyState: what the conversation area shows with no model (one large "Open a model"
// button, and the default model when it is present) or no chat yet.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

Item {
    id: empty
    required property ChatController chats
    required property ModelController model
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
            text: empty.model.ready ? qsTr("Start a conversation")
                : empty.model.status === ModelController.Loading ? qsTr("Loading the model…")
                : qsTr("Open a model to begin")
        }
        Label {
            Layout.fillWidth: true
            horizontalAlignment: Text.AlignHCenter
            wrapMode: Text.Wrap
            color: Theme.mutedText
            font.pixelSize: Theme.fontSize
            text: empty.model.ready
                  ? qsTr("Type a message below, or press Ctrl+N for a new chat. Several chats can generate at once.")
                  : qsTr("Granule runs GGUF models (Llama, Mistral, Qwen, SmolLM2) on your GPU, or on the CPU when there is none.")
        }
        PrimaryButton {
            Layout.alignment: Qt.AlignHCenter
            visible: !empty.model.ready && empty.model.status !== ModelController.Loading
            text: qsTr("Open a model…")
            font.pixelSize: Theme.titleFontSize
            padding: Theme.padding
            onClicked: empty.openRequested()
        }
        Button {
            Layout.alignment: Qt.AlignHCenter
            visible: !empty.model.ready && empty.model.status !== ModelController.Loading
                     && empty.model.defaultModelPresent
            text: qsTr("Use %1").arg(empty.model.defaultModelPath.split("/").pop())
            font.pixelSize: Theme.fontSize
            onClicked: empty.model.load(empty.model.defaultModelPath)
        }
        PrimaryButton {
            Layout.alignment: Qt.AlignHCenter
            visible: empty.model.ready
            text: qsTr("+  New chat")
            font.pixelSize: Theme.titleFontSize
            padding: Theme.padding
            onClicked: empty.chats.newChat()
        }
    }
}
