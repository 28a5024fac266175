// ChatSettingsDrawer: the open chat's system prompt, reasoning (for a model that reasons), JSON
// output and sampling settings.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

Drawer {
    id: drawer
    required property ChatController chats
    // How the loaded model reasons: "think" (on/off), "harmony" (an effort), "" (it does not).
    property string reasoningFormat: ""

    edge: Qt.RightEdge
    width: 360
    background: Rectangle { color: Theme.surface; border.color: Theme.border }

    ScrollView {
        anchors.fill: parent
        contentWidth: availableWidth
        ColumnLayout {
            width: parent.width
            spacing: Theme.spacing
            Label {
                Layout.margins: Theme.padding
                text: qsTr("Chat settings")
                color: Theme.text
                font.pixelSize: Theme.titleFontSize
                font.weight: Font.DemiBold
            }
            Label {
                Layout.leftMargin: Theme.padding
                text: qsTr("System prompt")
                color: Theme.mutedText
                font.pixelSize: Theme.smallFontSize
            }
            TextArea {
                Layout.fillWidth: true
                Layout.leftMargin: Theme.padding
                Layout.rightMargin: Theme.padding
                Layout.preferredHeight: 110
                wrapMode: TextEdit.Wrap
                font.pixelSize: Theme.fontSize
                placeholderText: qsTr("You are a helpful assistant.")
                background: Rectangle {
                    radius: 6
                    color: Theme.raised
                    border.color: Theme.border
                }
                text: drawer.chats.systemPrompt
                onEditingFinished: drawer.chats.systemPrompt = text
            }
            // Reasoning, stored with the chat: on/off for <think> models, an effort for gpt-oss.
            RowLayout {
                objectName: "reasoningSetting"
                visible: drawer.reasoningFormat.length > 0
                Layout.leftMargin: Theme.padding
                Layout.rightMargin: Theme.padding
                Label {
                    Layout.fillWidth: true
                    text: qsTr("Reasoning")
                    color: Theme.mutedText
                    font.pixelSize: Theme.smallFontSize
                }
                ComboBox {
                    id: reasoningBox
                    objectName: "reasoningBox"
                    implicitWidth: 140
                    textRole: "text"
                    valueRole: "value"
                    model: drawer.reasoningFormat === "harmony"
                           ? [{ text: qsTr("Default"), value: "" }, { text: qsTr("Low"), value: "low" },
                              { text: qsTr("Medium"), value: "medium" }, { text: qsTr("High"), value: "high" }]
                           : [{ text: qsTr("On"), value: "" }, { text: qsTr("Off"), value: "off" }]
                    currentIndex: Math.max(0, indexOfValue(drawer.chats.sampling.reasoning))
                    onActivated: drawer.chats.sampling.reasoning = currentValue
                }
            }
            JsonOutputSetting { editor: drawer.chats.sampling }
            SettingSlider { name: qsTr("Temperature"); editor: drawer.chats.sampling; field: "temperature" }
            SettingSlider { name: qsTr("Top-p"); editor: drawer.chats.sampling; field: "topP" }
            SettingSlider { name: qsTr("Min-p"); editor: drawer.chats.sampling; field: "minP" }
            SettingSlider { name: qsTr("Top-k"); editor: drawer.chats.sampling; field: "topK" }
            SettingSlider { name: qsTr("Repetition penalty"); editor: drawer.chats.sampling; field: "repetitionPenalty" }
            SettingSlider { name: qsTr("Max tokens"); editor: drawer.chats.sampling; field: "maxTokens" }
            RowLayout {
                Layout.leftMargin: Theme.padding
                Layout.rightMargin: Theme.padding
                Label {
                    Layout.fillWidth: true
                    text: qsTr("Seed")
                    color: Theme.mutedText
                    font.pixelSize: Theme.smallFontSize
                }
                TextField {
                    implicitWidth: 140
                    // "random": a new seed per reply; a number, 0 included, repeats its text.
                    text: drawer.chats.sampling.seed
                    placeholderText: "random"
                    validator: RegularExpressionValidator { regularExpression: /random|[0-9]{1,20}/ }
                    onEditingFinished: drawer.chats.sampling.seed = text
                }
            }
        }
    }
}
