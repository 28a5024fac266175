// BudgetControl: the VRAM budget on a scale that marks the model's weights (above them
// every layer can stay resident; below, layers stream from host memory) and the least
// budget the plan runs in. "Automatic" leaves the engine its choice (free memory at load).
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

ColumnLayout {
    id: control
    // 0 = automatic.
    property double budgetBytes: 0
    // What "automatic" came to (the engine's current budget), shown while automatic.
    property double automaticBytes: 0
    property double weightsBytes: 0
    property double minimumBytes: 0
    // The device's memory, when known: the scale ends there at most.
    property double deviceBytes: 0
    readonly property double stepBytes: 256 * 1024 * 1024
    // Twice the model, so the region where layers start to stream fills the slider; the
    // device's memory caps it (a 140 GiB scale would squeeze an 8 GiB model into its edge).
    readonly property double scaleBytes: {
        let top = Math.max(control.weightsBytes * 2, control.minimumBytes * 2, 4 * control.stepBytes)
        if (control.deviceBytes > 0) top = Math.min(top, control.deviceBytes)
        top = Math.max(top, control.budgetBytes * 1.1, control.automaticBytes * 1.1)
        return Math.ceil(top / control.stepBytes) * control.stepBytes
    }
    // A new budget chosen (0 for automatic), when the handle is released.
    signal chosen(double bytes)

    spacing: 2

    RowLayout {
        Layout.fillWidth: true
        CheckBox {
            id: automatic
            objectName: "budgetAutomatic"
            text: qsTr("Automatic")
            checked: control.budgetBytes <= 0
            onToggled: control.chosen(checked ? 0 : Math.max(control.minimumBytes, control.automaticBytes > 0
                                                              ? control.automaticBytes : control.weightsBytes * 1.25))
        }
        Item { Layout.fillWidth: true }
        Label {
            text: control.budgetBytes > 0 ? Units.bytes(slider.value)
                  : control.automaticBytes > 0 ? qsTr("auto · %1").arg(Units.bytes(control.automaticBytes))
                  : qsTr("free memory at load")
            color: Theme.text
            font.family: Theme.monoFamily
            font.pixelSize: Theme.smallFontSize
        }
    }
    Slider {
        id: slider
        objectName: "budgetSlider"
        Layout.fillWidth: true
        enabled: !automatic.checked
        from: 0
        to: control.scaleBytes
        stepSize: control.stepBytes
        snapMode: Slider.SnapAlways
        value: control.budgetBytes > 0 ? control.budgetBytes : control.automaticBytes
        onPressedChanged: if (!pressed && value !== control.budgetBytes) control.chosen(Math.max(control.stepBytes, value))
    }
    // The marks under the slider's groove: the weights and the minimum.
    Item {
        id: marks
        Layout.fillWidth: true
        implicitHeight: weightsMark.implicitHeight + 6
        readonly property real grooveLeft: slider.leftPadding
        readonly property real grooveWidth: slider.availableWidth
        function xOf(bytes: double): real {
            return grooveLeft + grooveWidth * Math.min(1, bytes / control.scaleBytes)
        }
        Rectangle {
            x: marks.xOf(control.minimumBytes)
            width: 2
            height: 6
            visible: control.minimumBytes > 0
            color: Theme.warning
        }
        Rectangle {
            x: marks.xOf(control.weightsBytes)
            width: 2
            height: 6
            visible: control.weightsBytes > 0
            color: Theme.weights
        }
        Label {
            id: weightsMark
            y: 6
            visible: control.weightsBytes > 0
            x: Math.max(0, Math.min(marks.width - width, marks.xOf(control.weightsBytes) - width / 2))
            text: qsTr("model %1").arg(Units.bytes(control.weightsBytes))
            color: Theme.weights
            font.pixelSize: 10
        }
        Label {
            y: 6
            visible: control.minimumBytes > 0
                     && marks.xOf(control.minimumBytes) + width < weightsMark.x - 4
            x: Math.max(0, marks.xOf(control.minimumBytes) - width / 2)
            text: qsTr("min %1").arg(Units.bytes(control.minimumBytes))
            color: Theme.warning
            font.pixelSize: 10
        }
        Label {
            y: 6
            anchors.right: parent.right
            text: Units.bytes(control.scaleBytes)
            color: Theme.mutedText
            font.pixelSize: 10
        }
    }
}
