// LayerStrip: one cell per layer, in order — resident in device memory or streamed from
// host memory each pass (StreamingTelemetry.layer_streamed, FitEstimate.layer_streamed).
import QtQuick

Item {
    id: strip
    // 1 streamed, 0 resident, per layer.
    property list<int> streamed
    readonly property int layerCount: streamed.length
    // A one-pixel gap between cells while they are wide enough to keep one.
    readonly property int gap: layerCount > 0 && width / layerCount >= 5 ? 1 : 0

    implicitHeight: 14

    Rectangle {
        anchors.fill: parent
        visible: strip.layerCount === 0
        radius: 2
        color: Theme.raised
        border.color: Theme.border
    }
    Repeater {
        // Cells on whole pixels, so every gap looks the same; each cell carries its own
        // geometry (a delegate reads no ids outside itself).
        model: {
            const cells = []
            const pitch = (strip.width + strip.gap) / Math.max(1, strip.layerCount)
            for (let i = 0; i < strip.layerCount; ++i) {
                const left = Math.round(i * pitch)
                cells.push({ streamed: strip.streamed[i], x: left,
                             width: Math.max(1, Math.round((i + 1) * pitch) - left - strip.gap) })
            }
            return cells
        }
        delegate: Rectangle {
            required property var modelData
            x: modelData.x
            width: modelData.width
            height: parent ? parent.height : 0
            radius: modelData.width >= 6 ? 2 : 0
            color: modelData.streamed ? Theme.streamedLayer : Theme.residentLayer
        }
    }
}
