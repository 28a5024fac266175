// EndpointsSection: Settings' list of OpenAI-compatible servers (vLLM, SGLang, llama-server,
// another Granule): each endpoint's name and base URL, its API key (kept in the system
// keychain), its stall timeout, the models its /v1/models lists and one line saying whether it
// answered; and a row that adds one. A chat runs on one of these models when chosen in its header's menu.
pragma ComponentBehavior: Bound
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

ColumnLayout {
    id: endpointsSection
    required property EndpointsController endpoints
    spacing: Theme.spacing

    Label {
        Layout.fillWidth: true
        Layout.topMargin: Theme.spacingLarge
        text: qsTr("Endpoints")
        color: Theme.text
        font.pixelSize: Theme.titleFontSize
        font.weight: Font.DemiBold
    }
    Label {
        Layout.fillWidth: true
        wrapMode: Text.Wrap
        color: Theme.mutedText
        font.pixelSize: Theme.smallFontSize
        text: endpointsSection.endpoints.available
              ? qsTr("Servers that speak the OpenAI API. A chat runs on the local engine or on one of their models: choose it in the chat's header.")
              : qsTr("This build has no remote client (libcurl was not found): endpoints cannot be reached.")
    }

    Repeater {
        model: endpointsSection.endpoints.list
        delegate: Rectangle {
            id: entry
            required property string endpointId
            required property string name
            required property string baseUrl
            required property bool hasKey
            required property string modelsText
            required property string status
            required property string reachability
            required property int stallTimeout
            objectName: "endpoint_" + endpointId
            Layout.fillWidth: true
            implicitHeight: entryColumn.implicitHeight + 2 * Theme.spacing
            radius: Theme.radius
            color: Theme.raised
            border.color: Theme.border

            ColumnLayout {
                id: entryColumn
                anchors.fill: parent
                anchors.margins: Theme.spacing
                spacing: Theme.spacingSmall
                RowLayout {
                    Layout.fillWidth: true
                    spacing: Theme.spacing
                    Label {
                        text: entry.name
                        color: Theme.text
                        font.pixelSize: Theme.fontSize
                        font.weight: Font.DemiBold
                    }
                    Label {
                        Layout.fillWidth: true
                        text: entry.baseUrl
                        elide: Text.ElideMiddle
                        color: Theme.mutedText
                        font.pixelSize: Theme.smallFontSize
                    }
                    ToolButton {
                        objectName: "endpointRefresh"
                        text: qsTr("Refresh")
                        font.pixelSize: Theme.smallFontSize
                        implicitHeight: 24
                        enabled: entry.reachability !== "checking"
                        onClicked: endpointsSection.endpoints.refresh(entry.endpointId)
                    }
                    ToolButton {
                        objectName: "endpointRemove"
                        text: qsTr("Remove")
                        font.pixelSize: Theme.smallFontSize
                        implicitHeight: 24
                        onClicked: endpointsSection.endpoints.remove(entry.endpointId)
                    }
                }
                // Reachable with its models, or why not (401: the key; unreachable: the URL).
                Label {
                    objectName: "endpointStatus"
                    Layout.fillWidth: true
                    elide: Text.ElideRight
                    font.pixelSize: Theme.smallFontSize
                    color: entry.reachability === "reachable" ? Theme.generating
                           : entry.reachability === "checking" || entry.reachability === "unchecked" ? Theme.mutedText
                           : Theme.errorText
                    text: entry.status
                }
                Label {
                    objectName: "endpointModels"
                    Layout.fillWidth: true
                    visible: entry.modelsText.length > 0
                    wrapMode: Text.Wrap
                    maximumLineCount: 3
                    elide: Text.ElideRight
                    color: Theme.text
                    font.pixelSize: Theme.smallFontSize
                    text: entry.modelsText
                }
                RowLayout {
                    Layout.fillWidth: true
                    spacing: Theme.spacing
                    Label {
                        text: qsTr("API key")
                        color: Theme.mutedText
                        font.pixelSize: Theme.smallFontSize
                    }
                    TextField {
                        objectName: "endpointKeyField"
                        Layout.fillWidth: true
                        font.pixelSize: Theme.smallFontSize
                        echoMode: TextInput.Password
                        placeholderText: entry.hasKey ? qsTr("set (in the system keychain): type to replace, clear to remove")
                                                      : qsTr("none sent")
                        onEditingFinished: {
                            if (text.length > 0 || entry.hasKey) endpointsSection.endpoints.setApiKey(entry.endpointId, text)
                            text = ""
                        }
                    }
                }
                // A stream that sends nothing for this long ends as stalled (the answer so far
                // is kept); a slow server's long prompts may need more.
                RowLayout {
                    Layout.fillWidth: true
                    spacing: Theme.spacing
                    Label {
                        text: qsTr("Stall timeout")
                        color: Theme.mutedText
                        font.pixelSize: Theme.smallFontSize
                    }
                    SpinBox {
                        objectName: "endpointStallTimeout"
                        from: endpointsSection.endpoints.minStallTimeout()
                        to: endpointsSection.endpoints.maxStallTimeout()
                        value: entry.stallTimeout
                        editable: true
                        font.pixelSize: Theme.smallFontSize
                        onValueModified: endpointsSection.endpoints.setStallTimeout(entry.endpointId, value)
                    }
                    Label {
                        Layout.fillWidth: true
                        text: qsTr("s without data ends the answer as stalled")
                        color: Theme.mutedText
                        font.pixelSize: Theme.smallFontSize
                    }
                }
            }
        }
    }

    // A new endpoint: its URL (with or without /v1), a name, and the key if it needs one.
    RowLayout {
        Layout.fillWidth: true
        spacing: Theme.spacing
        TextField {
            id: newName
            objectName: "newEndpointName"
            Layout.preferredWidth: 110
            font.pixelSize: Theme.smallFontSize
            placeholderText: qsTr("name")
        }
        TextField {
            id: newUrl
            objectName: "newEndpointUrl"
            Layout.fillWidth: true
            font.pixelSize: Theme.smallFontSize
            placeholderText: qsTr("http://host:8000/v1")
        }
        TextField {
            id: newKey
            objectName: "newEndpointKey"
            Layout.preferredWidth: 110
            font.pixelSize: Theme.smallFontSize
            echoMode: TextInput.Password
            placeholderText: qsTr("API key")
        }
        Button {
            objectName: "addEndpoint"
            text: qsTr("Add")
            font.pixelSize: Theme.smallFontSize
            enabled: /^https?:\/\/./.test(newUrl.text.trim())
            onClicked: {
                endpointsSection.endpoints.add(newName.text, newUrl.text, newKey.text)
                newName.text = ""
                newUrl.text = ""
                newKey.text = ""
            }
        }
    }
}
