// ChatSettingsDrawer: the open chat's system prompt and sampling settings.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

Drawer {
    id: drawer
    required property ChatController chats

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
            SettingSlider {
                name: qsTr("Temperature"); from: 0; to: 2; stepSize: 0.05; decimals: 2
                value: drawer.chats.temperature
                onMoved: drawer.chats.temperature = value
            }
            SettingSlider {
                name: qsTr("Top-p"); from: 0; to: 1; stepSize: 0.01; decimals: 2
                value: drawer.chats.topP
                onMoved: drawer.chats.topP = value
            }
            SettingSlider {
                name: qsTr("Min-p"); from: 0; to: 0.5; stepSize: 0.01; decimals: 2
                value: drawer.chats.minP
                onMoved: drawer.chats.minP = value
            }
            SettingSlider {
                name: qsTr("Top-k"); from: 0; to: 200; stepSize: 1; decimals: 0
                value: drawer.chats.topK
                onMoved: drawer.chats.topK = Math.round(value)
            }
            SettingSlider {
                name: qsTr("Repetition penalty"); from: 1; to: 2; stepSize: 0.01; decimals: 2
                value: drawer.chats.repetitionPenalty
                onMoved: drawer.chats.repetitionPenalty = value
            }
            SettingSlider {
                name: qsTr("Max tokens"); from: 16; to: 4096; stepSize: 16; decimals: 0
                value: drawer.chats.maxTokens
                onMoved: drawer.chats.maxTokens = Math.round(value)
            }
            RowLayout {
                Layout.leftMargin: Theme.padding
                Layout.rightMargin: Theme.padding
                Label {
                    Layout.fillWidth: true
                    text: qsTr("Seed (0 = random)")
                    color: Theme.mutedText
                    font.pixelSize: Theme.smallFontSize
                }
                TextField {
                    implicitWidth: 140
                    text: drawer.chats.seed.toString()
                    validator: RegularExpressionValidator { regularExpression: /[0-9]{1,15}/ }
                    onEditingFinished: drawer.chats.seed = parseInt(text || "0")
                }
            }
        }
    }
}
