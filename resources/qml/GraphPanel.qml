// GraphPanel: CUDA graph capture status (buckets, segments per step, replays, fallbacks)
// and decode throughput over the last minute.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

PanelFrame {
    id: panel
    required property TelemetryModel telemetry
    readonly property telemetryFrame frame: telemetry.frame

    title: qsTr("Graphs · throughput")
    figure: qsTr("%1 tok/s").arg(frame.throughput.decodeTokensPerSecond.toFixed(1))

    TimeSeriesPlot {
        id: plot
        Layout.fillWidth: true
        Layout.preferredHeight: Theme.plotHeight * 0.75
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
        }
        Label {
            anchors.right: parent.right
            anchors.bottom: parent.bottom
            anchors.margins: 3
            text: qsTr("last %1 s").arg(Math.round(plot.spanSeconds))
            color: Theme.mutedText
            font.pixelSize: 10
        }
    }
    Flow {
        Layout.fillWidth: true
        spacing: 4
        visible: panel.frame.device.gpu
        Repeater {
            model: panel.frame.graphs.buckets
            delegate: Rectangle {
                required property int modelData
                implicitWidth: bucketLabel.implicitWidth + 10
                implicitHeight: bucketLabel.implicitHeight + 4
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
    }
    Label {
        Layout.fillWidth: true
        wrapMode: Text.Wrap
        color: Theme.mutedText
        font.pixelSize: Theme.smallFontSize
        text: panel.frame.device.gpu
              ? qsTr("%1 segment(s)/step · %2 replays").arg(panel.frame.graphs.segmentsPerStep)
                    .arg(panel.frame.graphs.replays)
              : qsTr("No GPU: CUDA graphs are off; the CPU backend runs each step eagerly. %1 steps so far.")
                    .arg(panel.frame.throughput.steps)
    }
    Label {
        Layout.fillWidth: true
        visible: panel.frame.device.gpu && panel.frame.graphs.lastFallbackReason.length > 0
        wrapMode: Text.Wrap
        color: Theme.warning
        font.pixelSize: Theme.smallFontSize
        text: qsTr("Last eager step: %1").arg(panel.frame.graphs.lastFallbackReason)
    }
}
