// HostMemoryPanel: the process's resident host memory over the last minute, and what the
// host has free. (Weight streaming's traffic joins the panels when the engine measures it.)
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

PanelFrame {
    id: panel
    required property TelemetryModel telemetry
    readonly property telemetryFrame frame: telemetry.frame

    title: qsTr("Host memory")
    figure: Units.bytes(frame.host.processResidentBytes)

    TimeSeriesPlot {
        id: plot
        Layout.fillWidth: true
        Layout.preferredHeight: Theme.plotHeight * 0.75
        telemetry: panel.telemetry
        metric: TimeSeriesPlot.ProcessMemory
        seriesColors: [Theme.other]
        gridColor: Theme.gridLine
        labelColor: Theme.mutedText
        Label {
            anchors.left: parent.left
            anchors.top: parent.top
            anchors.margins: 3
            text: Units.bytes(plot.scaleMax)
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
        text: qsTr("Process resident memory; %1 of %2 free on the host.")
                  .arg(Units.bytes(panel.frame.host.availableBytes))
                  .arg(Units.bytes(panel.frame.host.totalBytes))
    }
}
