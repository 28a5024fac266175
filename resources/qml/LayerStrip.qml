// LayerStrip: one cell per layer, in order — resident in device memory or streamed from
// host memory each pass (StreamingTelemetry.layer_streamed, FitEstimate.layer_streamed).
import QtQuick

Item {
    id: strip
    // 1 streamed, 0 resident, per layer.
    property list<int> streamed
    readonly property int layerCount: streamed.length
    readonly property real gap: layerCount > 0 && width / layerCount >= 5 ? 1 : 0
    readonly property real cellWidth: layerCount > 0 ? (width - gap * (layerCount - 1)) / layerCount : 0

    implicitHeight: 14

    Rectangle {
        anchors.fill: parent
        visible: strip.layerCount === 0
        radius: 2
        color: Theme.raised
        border.color: Theme.border
    }
    Row {
        anchors.fill: parent
        spacing: strip.gap
        Repeater {
            // Each cell carries what it needs (a delegate reads no ids outside itself).
            model: {
                const cells = []
                for (let i = 0; i < strip.layerCount; ++i)
                    cells.push({ streamed: strip.streamed[i], width: strip.cellWidth })
                return cells
            }
            delegate: Rectangle {
                required property var modelData
                width: modelData.width
                height: parent ? parent.height : 0
                radius: modelData.width >= 6 ? 2 : 0
                color: modelData.streamed ? Theme.streamedLayer : Theme.residentLayer
            }
        }
    }
}
