// GraphPanel: CUDA graphs — the batch-size buckets captured, the replayed graph's nodes,
// replays, captures and re-captures (with the last reason), segments per step, eager steps
// (with the fallback reason) — and decode throughput over the last minute.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

PanelFrame {
    id: panel
    required property TelemetryModel telemetry
    readonly property telemetryFrame frame: telemetry.frame
    readonly property var graphs: frame.graphs

    title: qsTr("Graphs · throughput")
    figure: qsTr("%1 tok/s").arg(frame.throughput.decodeTokensPerSecond.toFixed(1))

    TimeSeriesPlot {
        id: plot
        Layout.fillWidth: true
        Layout.preferredHeight: Theme.plotHeight * 0.6
        telemetry: panel.telemetry
        metric: TimeSeriesPlot.DecodeTokens
        seriesColors: [Theme.throughput]
        gridColor: Theme.gridLine
        labelColor: Theme.mutedText
        Label {
            anchors.left: parent.left
            anchors.top: parent.top
            anchors.margins: 3
            text: qsTr("%1 tok/s").arg(plot.scaleMax)
            color: Theme.mutedText
            font.pixelSize: 10
            // Readable where a limit line runs under it (one near the scale's top).
            padding: 1
            background: Rectangle { color: Theme.surface; opacity: 0.85; radius: 2 }
        }
        Label {
            anchors.right: parent.right
            anchors.bottom: parent.bottom
            anchors.margins: 3
            text: qsTr("decode · last %1 s").arg(Math.round(plot.spanSeconds))
            color: Theme.mutedText
            font.pixelSize: 10
        }
    }
    RowLayout {
        Layout.fillWidth: true
        visible: panel.frame.device.gpu
        spacing: 4
        Label {
            text: qsTr("buckets")
            color: Theme.mutedText
            font.pixelSize: Theme.smallFontSize
        }
        Flow {
            Layout.fillWidth: true
            spacing: 4
            Repeater {
                model: panel.graphs.buckets
                delegate: Rectangle {
                    required property int modelData
                    implicitWidth: bucketLabel.implicitWidth + 10
                    implicitHeight: bucketLabel.implicitHeight + 2
                    radius: 4
                    color: Theme.raised
                    border.color: Theme.throughput
                    Label {
                        id: bucketLabel
                        anchors.centerIn: parent
                        text: "b" + parent.modelData + " ✓"
                        color: Theme.text
                        font.pixelSize: Theme.smallFontSize
                    }
                }
            }
            Label {
                visible: panel.graphs.buckets.length === 0
                text: qsTr("none captured")
                color: Theme.mutedText
                font.pixelSize: Theme.smallFontSize
            }
        }
    }
    GridLayout {
        Layout.fillWidth: true
        visible: panel.frame.device.gpu
        columns: 2
        columnSpacing: Theme.padding
        rowSpacing: 2
        StatRow {
            Layout.fillWidth: true
            name: qsTr("nodes")
            value: Units.count(panel.graphs.nodes)
        }
        StatRow {
            Layout.fillWidth: true
            name: qsTr("segments/step")
            value: Units.count(panel.graphs.segmentsPerStep)
            valueColor: panel.graphs.segmentsPerStep > 1 ? Theme.warning : Theme.text
        }
        StatRow {
            Layout.fillWidth: true
            name: qsTr("replays")
            value: Units.count(panel.graphs.replays)
        }
        StatRow {
            Layout.fillWidth: true
            name: qsTr("captures")
            value: Units.count(panel.graphs.captures)
        }
        StatRow {
            Layout.fillWidth: true
            name: qsTr("re-captures")
            value: Units.count(panel.graphs.recaptures)
        }
        StatRow {
            Layout.fillWidth: true
            name: qsTr("eager steps")
            value: Units.count(panel.graphs.eagerSteps)
            valueColor: panel.graphs.eagerSteps > 0 ? Theme.warning : Theme.text
        }
    }
    Label {
        Layout.fillWidth: true
        visible: panel.frame.device.gpu && panel.graphs.lastRecaptureReason.length > 0
        wrapMode: Text.Wrap
        color: Theme.mutedText
        font.pixelSize: Theme.smallFontSize
        text: qsTr("Last re-capture: %1").arg(panel.graphs.lastRecaptureReason)
    }
    Label {
        Layout.fillWidth: true
        visible: panel.frame.device.gpu && panel.graphs.lastFallbackReason.length > 0
        wrapMode: Text.Wrap
        color: Theme.warning
        font.pixelSize: Theme.smallFontSize
        text: qsTr("Last eager step: %1").arg(panel.graphs.lastFallbackReason)
    }
    Label {
        Layout.fillWidth: true
        visible: !panel.frame.device.gpu
        wrapMode: Text.Wrap
        color: Theme.mutedText
        font.pixelSize: Theme.smallFontSize
        text: qsTr("No GPU: CUDA graphs are off; the CPU backend runs each step eagerly. %1 steps so far.")
                  .arg(panel.frame.throughput.steps)
    }
}
