// RemoteEndpointRow: a model on an OpenAI-compatible server (vLLM, SGLang, llama-server,
// another Granule) — its base URL and model id — opened as the window's engine. The worker
// then streams every chat from that server and the panels read its /metrics.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

RowLayout {
    id: row
    required property ModelController model
    signal opened()
    spacing: Theme.spacing

    Label {
        text: qsTr("Server")
        color: Theme.mutedText
        font.pixelSize: Theme.smallFontSize
    }
    TextField {
        id: url
        objectName: "endpointUrl"
        Layout.fillWidth: true
        Layout.preferredWidth: 3
        font.pixelSize: Theme.fontSize
        placeholderText: qsTr("http://host:8000/v1")
    }
    TextField {
        id: modelId
        objectName: "endpointModel"
        Layout.fillWidth: true
        Layout.preferredWidth: 2
        font.pixelSize: Theme.fontSize
        placeholderText: qsTr("model, as /v1/models lists it")
    }
    Button {
        objectName: "endpointConnect"
        text: qsTr("Connect")
        font.pixelSize: Theme.fontSize
        enabled: /^https?:\/\/./.test(url.text) && modelId.text.length > 0
        ToolTip.visible: hovered
        ToolTip.text: qsTr("Chat with this model on the server; the panels show its metrics where it exposes them")
        onClicked: {
            row.model.load(url.text.trim() + "#" + modelId.text.trim())
            row.opened()
        }
    }
}
