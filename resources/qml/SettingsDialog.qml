// SettingsDialog: the theme and the engine's shape (context per chat, chats at once),
// which apply the next time a model loads.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

Dialog {
    id: dialog
    required property ModelController model
    required property WindowSettings settings

    title: qsTr("Settings")
    modal: true
    anchors.centerIn: parent
    width: 420
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
    }
}
