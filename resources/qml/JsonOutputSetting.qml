// JsonOutputSetting: the open chat's "JSON output" — off, any JSON object, or a JSON Schema
// pasted or loaded from a file, checked on entry (a one-line error when refused).
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Dialogs
import QtQuick.Layouts

ColumnLayout {
    id: setting
    objectName: "jsonOutputSetting"
    required property SamplingEditor editor
    property string error: ""

    Layout.fillWidth: true
    Layout.leftMargin: Theme.padding
    Layout.rightMargin: Theme.padding
    spacing: Theme.spacingSmall

    function applySchema(text: string) {
        setting.error = setting.editor.setJsonSchema(text)
    }

    RowLayout {
        Layout.fillWidth: true
        Label {
            Layout.fillWidth: true
            text: qsTr("JSON output")
            color: Theme.mutedText
            font.pixelSize: Theme.smallFontSize
        }
        ComboBox {
            id: modeBox
            objectName: "jsonOutputBox"
            implicitWidth: 160
            textRole: "text"
            valueRole: "value"
            model: [{ text: qsTr("Off"), value: "" }, { text: qsTr("Any JSON object"), value: "object" },
                    { text: qsTr("JSON Schema"), value: "schema" }]
            currentIndex: Math.max(0, indexOfValue(setting.editor.jsonOutput))
            onActivated: {
                setting.error = ""
                // Schema mode starts once a schema is accepted (Apply or Load).
                if (currentValue !== "schema" || setting.editor.jsonSchema.length > 0)
                    setting.editor.jsonOutput = currentValue
            }
        }
    }
    TextArea {
        id: schemaText
        objectName: "jsonSchemaText"
        visible: modeBox.currentValue === "schema"
        Layout.fillWidth: true
        Layout.preferredHeight: 120
        wrapMode: TextEdit.Wrap
        font.family: Theme.monoFamily
        font.pixelSize: Theme.smallFontSize
        placeholderText: "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}}}"
        text: setting.editor.jsonSchema
        background: Rectangle {
            radius: 6
            color: Theme.raised
            border.color: setting.error.length > 0 ? Theme.errorText : Theme.border
        }
    }
    RowLayout {
        visible: modeBox.currentValue === "schema"
        Layout.fillWidth: true
        Button {
            objectName: "jsonSchemaApply"
            text: qsTr("Apply")
            onClicked: setting.applySchema(schemaText.text)
        }
        Button {
            text: qsTr("Load from file…")
            onClicked: schemaFile.open()
        }
        Item { Layout.fillWidth: true }
    }
    Label {
        objectName: "jsonSchemaError"
        visible: setting.error.length > 0
        Layout.fillWidth: true
        text: setting.error
        color: Theme.errorText
        font.pixelSize: Theme.smallFontSize
        elide: Text.ElideRight
    }
    FileDialog {
        id: schemaFile
        title: qsTr("Load a JSON Schema")
        nameFilters: [qsTr("JSON (*.json)"), qsTr("All files (*)")]
        onAccepted: setting.error = setting.editor.loadJsonSchema(schemaFile.selectedFile)
    }
}
