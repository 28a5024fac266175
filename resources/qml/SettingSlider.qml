// SettingSlider: a named slider with its value, for the chat settings.
import QtQuick
import QtQuick.Controls
import QtQuick.Layouts

ColumnLayout {
    id: setting
    property string name
    property alias from: slider.from
    property alias to: slider.to
    property alias stepSize: slider.stepSize
    property alias value: slider.value
    property int decimals: 2
    signal moved()

    Layout.fillWidth: true
    Layout.leftMargin: Theme.padding
    Layout.rightMargin: Theme.padding
    spacing: 0
    RowLayout {
        Layout.fillWidth: true
        Label {
            Layout.fillWidth: true
            text: setting.name
            color: Theme.mutedText
            font.pixelSize: Theme.smallFontSize
        }
        Label {
            text: slider.value.toFixed(setting.decimals)
            color: Theme.text
            font.pixelSize: Theme.smallFontSize
            font.family: Theme.monoFamily
        }
    }
    Slider {
        id: slider
        Layout.fillWidth: true
        onMoved: setting.moved()
    }
}
