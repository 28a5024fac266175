// SettingsDialog: the theme, the engine's shape (context per chat, chats at once), which
// apply the next time a model loads, and the VRAM budget, which a loaded model takes at once.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

Dialog {
    id: dialog
    required property ModelController model
    required property WindowSettings settings
    required property TelemetryModel telemetry
    readonly property var streaming: telemetry.frame.streaming

    title: qsTr("Settings")
    modal: true
    anchors.centerIn: parent
    width: 460
    standardButtons: Dialog.Close

    GridLayout {
        anchors.fill: parent
        columns: 2
        columnSpacing: Theme.padding
        rowSpacing: Theme.spacing
        Label { text: qsTr("Theme"); color: Theme.text }
        ComboBox {
            Layout.fillWidth: true
            model: ["system", "light", "dark"]
            currentIndex: Math.max(0, indexOfValue(dialog.settings.theme))
            onActivated: dialog.settings.theme = currentText
        }
        Label { text: qsTr("Context per chat"); color: Theme.text }
        SpinBox {
            Layout.fillWidth: true
            from: 256
            to: 131072
            stepSize: 1024
            editable: true
            value: dialog.model.contextLength
            onValueModified: dialog.model.contextLength = value
        }
        Label { text: qsTr("Chats at once"); color: Theme.text }
        SpinBox {
            Layout.fillWidth: true
            from: 1
            to: 64
            editable: true
            value: dialog.model.maxChats
            onValueModified: dialog.model.maxChats = value
        }
        Label {
            Layout.columnSpan: 2
            Layout.fillWidth: true
            wrapMode: Text.Wrap
            color: Theme.mutedText
            font.pixelSize: Theme.smallFontSize
            text: qsTr("Context and chat count apply when a model is next loaded.")
        }
        Label {
            Layout.alignment: Qt.AlignTop
            Layout.topMargin: 8
            text: qsTr("VRAM budget")
            color: Theme.text
        }
        BudgetControl {
            Layout.fillWidth: true
            budgetBytes: dialog.model.vramBudgetBytes
            automaticBytes: dialog.telemetry.frame.device.gpu ? dialog.telemetry.frame.device.budgetBytes : 0
            // The loaded model's weights; without one (a replay), what the telemetry places.
            weightsBytes: dialog.model.weightsBytes > 0 ? dialog.model.weightsBytes
                          : dialog.streaming.residentWeightBytes + dialog.streaming.streamedBytesPerPass
            minimumBytes: dialog.model.minimumBudgetBytes
            deviceBytes: dialog.telemetry.frame.device.totalBytes
            onChosen: bytes => dialog.model.vramBudgetBytes = bytes
        }
        Label {
            Layout.columnSpan: 2
            Layout.fillWidth: true
            wrapMode: Text.Wrap
            color: Theme.mutedText
            font.pixelSize: Theme.smallFontSize
            text: qsTr("Below the model's size, the layers that do not fit stay in host memory and are copied to the GPU for every token. A loaded model re-plans at once.")
        }
    }
}
