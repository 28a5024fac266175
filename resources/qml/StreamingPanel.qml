// StreamingPanel: host-to-device weight traffic over the last minute and how many layers
// stay resident; without a GPU, the process's host memory instead.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

PanelFrame {
    id: panel
    required property TelemetryModel telemetry

    title: telemetry.gpu ? qsTr("Streaming") : qsTr("Host memory")
    figure: telemetry.gpu ? qsTr("%1/s").arg(Units.bytes(telemetry.streamedBytesPerSecond))
                          : Units.bytes(telemetry.processResidentBytes)

    TimeSeriesPlot {
        id: plot
        Layout.fillWidth: true
        Layout.preferredHeight: Theme.plotHeight * 0.75
        telemetry: panel.telemetry
        metric: panel.telemetry.gpu ? TimeSeriesPlot.StreamedBytes : TimeSeriesPlot.ProcessMemory
        seriesColors: [panel.telemetry.gpu ? Theme.streaming : Theme.other]
        gridColor: Theme.gridLine
        labelColor: Theme.mutedText
        Label {
            anchors.left: parent.left
            anchors.top: parent.top
            anchors.margins: 3
            text: Units.bytes(plot.scaleMax) + (panel.telemetry.gpu ? "/s" : "")
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
    Label {
        Layout.fillWidth: true
        wrapMode: Text.Wrap
        color: Theme.mutedText
        font.pixelSize: Theme.smallFontSize
        text: panel.telemetry.gpu
              ? qsTr("%1 of %2 layers resident · %3 streamed in total")
                    .arg(panel.telemetry.layersResident)
                    .arg(panel.telemetry.layersResident + panel.telemetry.layersStreamed)
                    .arg(Units.bytes(panel.telemetry.streamedBytesTotal))
              : qsTr("No GPU, so no weights are streamed. Process resident memory; %1 of %2 free on the host.")
                    .arg(Units.bytes(panel.telemetry.hostAvailableBytes))
                    .arg(Units.bytes(panel.telemetry.hostTotalBytes))
    }
}
