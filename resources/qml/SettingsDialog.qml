// SettingsDialog: the theme; the engine — memory budget (VRAM on a GPU, host memory on the
// CPU; a loaded model re-plans at once), threads, context per chat and chats at once, which
// a Reload applies to the loaded model; the default sampling new chats start from; and the
// switch that serves the OpenAI API from the window's engine; the endpoints (servers) chats
// may run on (EndpointsSection).
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

GranuleDialog {
    id: dialog
    required property ModelController model
    required property WindowSettings settings
    required property TelemetryModel telemetry
    required property ApiServerController server
    required property EndpointsController endpoints
    property McpController mcp: null
    readonly property var streaming: telemetry.frame.streaming
    readonly property bool gpu: telemetry.frame.device.gpu
    readonly property list<string> themes: ["system", "light", "dark"]

    title: qsTr("Settings")
    width: Math.min(Theme.dialogWidth + 80, parent ? parent.width - 2 * Theme.spacingXLarge : 600)
    height: Math.min(implicitHeight, parent ? parent.height - 2 * Theme.spacingXLarge : 700)
    standardButtons: Dialog.Close

    component SectionTitle: Label {
        Layout.columnSpan: 2
        Layout.fillWidth: true
        Layout.topMargin: Theme.spacingLarge
        color: Theme.text
        font.pixelSize: Theme.titleFontSize
        font.weight: Font.DemiBold
    }
    component Note: Label {
        Layout.columnSpan: 2
        Layout.fillWidth: true
        wrapMode: Text.Wrap
        color: Theme.mutedText
        font.pixelSize: Theme.smallFontSize
    }
    component Name: Label {
        color: Theme.text
        font.pixelSize: Theme.fontSize
        Layout.preferredWidth: 150
    }

    ScrollView {
        id: scroll
        anchors.fill: parent
        contentWidth: availableWidth
        implicitHeight: grid.implicitHeight
        clip: true

        GridLayout {
            id: grid
            width: scroll.availableWidth
            columns: 2
            columnSpacing: Theme.spacingLarge
            rowSpacing: Theme.padding

            SectionTitle { text: qsTr("Appearance"); Layout.topMargin: Theme.spacing }
            Name { text: qsTr("Theme") }
            ComboBox {
                objectName: "themeBox"
                Layout.fillWidth: true
                model: [qsTr("Follow the system"), qsTr("Light"), qsTr("Dark")]
                // The stored preference, not what "system" resolves to: dark shows Dark.
                currentIndex: Math.max(0, dialog.themes.indexOf(dialog.settings.theme))
                onActivated: index => dialog.settings.theme = dialog.themes[index]
            }

            SectionTitle { text: qsTr("Engine") }
            Name {
                Layout.alignment: Qt.AlignTop
                Layout.topMargin: 6
                text: dialog.gpu ? qsTr("VRAM budget") : qsTr("Memory budget")
            }
            BudgetControl {
                Layout.fillWidth: true
                budgetBytes: dialog.model.vramBudgetBytes
                automaticBytes: dialog.telemetry.frame.device.budgetBytes
                // The loaded model's weights; without one (a replay), what the telemetry places.
                weightsBytes: dialog.model.weightsBytes > 0 ? dialog.model.weightsBytes
                              : dialog.streaming.residentWeightBytes + dialog.streaming.streamedBytesPerPass
                minimumBytes: dialog.model.minimumBudgetBytes
                deviceBytes: dialog.telemetry.frame.device.totalBytes
                onChosen: bytes => dialog.model.vramBudgetBytes = bytes
            }
            Note {
                text: dialog.gpu
                      ? qsTr("Below the model's size, the layers that do not fit stay in host memory and are copied to the GPU for every token. A loaded model re-plans at once.")
                      : qsTr("No GPU: the budget caps the host memory the engine takes for weights and KV. A loaded model re-plans at once.")
            }
            Name { text: qsTr("CPU threads") }
            SpinBox {
                objectName: "threadsBox"
                Layout.fillWidth: true
                from: 0
                to: 256
                editable: true
                value: dialog.model.cpuThreads
                textFromValue: (v, locale) => v === 0 ? qsTr("all cores") : Number(v).toLocaleString(locale, "f", 0)
                valueFromText: (text, locale) => text === qsTr("all cores") ? 0 : Number.fromLocaleString(locale, text)
                onValueModified: dialog.model.cpuThreads = value
            }
            Name { text: qsTr("Context per chat") }
            SpinBox {
                objectName: "contextBox"
                Layout.fillWidth: true
                from: 256
                to: 131072
                stepSize: 1024
                editable: true
                value: dialog.model.contextLength
                onValueModified: dialog.model.contextLength = value
            }
            Name { text: qsTr("Chats at once") }
            SpinBox {
                objectName: "chatsBox"
                Layout.fillWidth: true
                from: 1
                to: 64
                editable: true
                value: dialog.model.maxChats
                onValueModified: dialog.model.maxChats = value
            }
            RowLayout {
                Layout.columnSpan: 2
                Layout.fillWidth: true
                spacing: Theme.padding
                Label {
                    Layout.fillWidth: true
                    wrapMode: Text.Wrap
                    color: dialog.model.reloadNeeded ? Theme.warning : Theme.mutedText
                    font.pixelSize: Theme.smallFontSize
                    text: !dialog.model.ready ? qsTr("Threads, context and chats apply when a model loads.")
                          : dialog.model.reloadNeeded ? qsTr("The loaded model runs with the old threads, context or chats: reload to apply them.")
                          : qsTr("The loaded model runs with these settings.")
                }
                Button {
                    objectName: "reloadButton"
                    text: qsTr("Reload model")
                    enabled: dialog.model.ready && dialog.model.status !== ModelController.Loading
                    highlighted: dialog.model.reloadNeeded
                    font.pixelSize: Theme.fontSize
                    onClicked: dialog.model.reload()
                }
            }

            SectionTitle { text: qsTr("Default sampling") }
            Note {
                text: qsTr("New chats start from these; each chat can change its own in Chat settings.")
            }
            Name { text: qsTr("Preset") }
            ComboBox {
                objectName: "presetBox"
                Layout.fillWidth: true
                model: dialog.settings.sampling.presets
                currentIndex: Math.max(0, model.indexOf(dialog.settings.sampling.preset))
                onActivated: index => dialog.settings.sampling.applyPreset(model[index])
            }
            GridLayout {
                Layout.columnSpan: 2
                Layout.fillWidth: true
                columns: 2
                columnSpacing: Theme.spacingLarge
                rowSpacing: Theme.spacing
                SettingSlider {
                    name: qsTr("Temperature"); editor: dialog.settings.sampling; field: "temperature"
                    Layout.leftMargin: 0
                }
                SettingSlider {
                    name: qsTr("Top-p"); editor: dialog.settings.sampling; field: "topP"
                    Layout.rightMargin: 0
                }
                SettingSlider {
                    name: qsTr("Top-k"); editor: dialog.settings.sampling; field: "topK"
                    Layout.leftMargin: 0
                }
                SettingSlider {
                    name: qsTr("Min-p"); editor: dialog.settings.sampling; field: "minP"
                    Layout.rightMargin: 0
                }
                SettingSlider {
                    name: qsTr("Repetition penalty"); editor: dialog.settings.sampling; field: "repetitionPenalty"
                    Layout.leftMargin: 0
                }
                ColumnLayout {
                    Layout.fillWidth: true
                    spacing: 0
                    Label {
                        text: qsTr("Max tokens per answer")
                        color: Theme.mutedText
                        font.pixelSize: Theme.smallFontSize
                    }
                    SpinBox {
                        Layout.fillWidth: true
                        from: dialog.settings.sampling.sliderFrom("maxTokens")
                        to: dialog.settings.sampling.sliderTo("maxTokens")
                        stepSize: 128
                        editable: true
                        value: dialog.settings.sampling.maxTokens
                        onValueModified: dialog.settings.sampling.maxTokens = value
                    }
                }
            }

            SectionTitle { text: qsTr("OpenAI API server") }
            Note {
                text: qsTr("Serves /v1/chat/completions and /v1/completions from the loaded model. API requests and the window's chats decode together, in the same engine steps; they are listed in the sidebar.")
            }
            Name { text: qsTr("Serve the OpenAI API") }
            Switch {
                objectName: "serveSwitch"
                checked: dialog.server.enabled
                onToggled: dialog.server.enabled = checked
            }
            Name { text: qsTr("Address") }
            RowLayout {
                Layout.fillWidth: true
                spacing: Theme.spacing
                TextField {
                    objectName: "serveHostField"
                    Layout.fillWidth: true
                    text: dialog.server.host
                    font.pixelSize: Theme.fontSize
                    onEditingFinished: dialog.server.host = text
                }
                Label {
                    text: ":"
                    color: Theme.text
                    font.pixelSize: Theme.fontSize
                }
                SpinBox {
                    objectName: "servePortBox"
                    from: 1
                    to: 65535
                    editable: true
                    value: dialog.server.port
                    // A port reads without digit grouping.
                    textFromValue: (v, locale) => v.toString()
                    valueFromText: (text, locale) => parseInt(text)
                    onValueModified: dialog.server.port = value
                }
            }
            Label {
                Layout.columnSpan: 2
                Layout.fillWidth: true
                visible: dialog.server.hostExposed
                wrapMode: Text.Wrap
                color: Theme.warning
                font.pixelSize: Theme.smallFontSize
                text: qsTr("Not a loopback address: other computers on the network can use the model. Set an API key, or use 127.0.0.1.")
            }
            Name { text: qsTr("API key") }
            TextField {
                objectName: "serveKeyField"
                Layout.fillWidth: true
                text: dialog.server.apiKey
                placeholderText: qsTr("none: any local client may connect")
                echoMode: TextInput.PasswordEchoOnEdit
                font.pixelSize: Theme.fontSize
                onEditingFinished: dialog.server.apiKey = text
            }
            Label {
                // The key is kept in the system keychain; without one, for this session.
                Layout.columnSpan: 2
                Layout.fillWidth: true
                visible: dialog.server.apiKeyNote.length > 0
                wrapMode: Text.Wrap
                color: Theme.warning
                font.pixelSize: Theme.smallFontSize
                text: dialog.server.apiKeyNote
            }
            Label {
                objectName: "serveStatus"
                Layout.columnSpan: 2
                Layout.fillWidth: true
                wrapMode: Text.Wrap
                color: dialog.server.state === ApiServerController.Failed ? Theme.errorText : Theme.mutedText
                font.pixelSize: Theme.smallFontSize
                text: dialog.server.state === ApiServerController.Serving
                      ? qsTr("%1. OpenAI clients use the base URL %2/v1%3.")
                            .arg(dialog.server.statusText).arg(dialog.server.url)
                            .arg(dialog.server.apiKey.length > 0 ? qsTr(" with the key") : "")
                      : dialog.server.statusText
            }

            EndpointsSection {
                Layout.columnSpan: 2
                Layout.fillWidth: true
                endpoints: dialog.endpoints
            }
            McpServersSection { mcp: dialog.mcp; visible: dialog.mcp !== null }
        }
    }
}
