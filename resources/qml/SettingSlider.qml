// SettingSlider: a named slider with its value for one field of a SamplingEditor; the span,
// step and clamping come from the editor (the engine's ranges).
import QtQuick
import QtQuick.Controls
import QtQuick.Layouts
import Granule

ColumnLayout {
    id: setting
    property string name
    required property SamplingEditor editor
    // The editor's property: "temperature", "topP", "topK", "minP", "repetitionPenalty", "maxTokens".
    required property string field
    readonly property bool integral: editor.sliderStep(field) >= 1

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
            text: slider.value.toFixed(setting.integral ? 0 : 2)
            color: Theme.text
            font.pixelSize: Theme.smallFontSize
            font.family: Theme.monoFamily
        }
    }
    Slider {
        id: slider
        Layout.fillWidth: true
        from: setting.editor.sliderFrom(setting.field)
        to: setting.editor.sliderTo(setting.field)
        stepSize: setting.editor.sliderStep(setting.field)
        value: setting.editor[setting.field]
        onMoved: setting.editor[setting.field] = setting.integral ? Math.round(value) : value
    }
}
