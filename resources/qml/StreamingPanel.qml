// StreamingPanel: weight streaming — which layers stay in device memory and which are
// copied from pinned host memory every pass, the host-to-device rate over the last minute
// (streamed layers, then a mixture of experts' missed experts) against the measured PCIe
// bandwidth, bytes per token, the staging ring and re-plans.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

PanelFrame {
    id: panel
    required property TelemetryModel telemetry
    readonly property telemetryFrame frame: telemetry.frame
    readonly property var streaming: frame.streaming
    readonly property int layersStreamed: streaming.layersStreamed
    readonly property int layerCount: streaming.layersResident + streaming.layersStreamed
    // A mixture of experts: its missed experts cross PCIe too (the last second's), read by the
    // dock's ExpertActivity where it hands one over, else by the panel's own.
    property ExpertActivity shared: null
    readonly property ExpertActivity experts: shared ? shared : ownExperts

    objectName: "streamingPanel"
    title: qsTr("Streaming")
    figure: Units.rate(streaming.h2dBytesPerSecond + (experts.active ? experts.bytesPerSecond : 0))

    ExpertActivity {
        id: ownExperts
        telemetry: panel.shared ? null : panel.telemetry  // idle while the dock's serves
    }

    TimeSeriesPlot {
        id: plot
        Layout.fillWidth: true
        Layout.preferredHeight: Theme.plotHeight * 0.75
        telemetry: panel.telemetry
        metric: TimeSeriesPlot.HostToDevice
        seriesColors: [Theme.streamedLayer, Theme.pcieLine]
        gridColor: Theme.gridLine
        labelColor: Theme.mutedText
        limitColor: Theme.pcieLine
        Label {
            anchors.left: parent.left
            anchors.top: parent.top
            anchors.margins: 3
            text: Units.rate(plot.scaleMax)
            color: Theme.mutedText
            font.pixelSize: 10
            // Readable where a limit line runs under it (one near the scale's top).
            padding: 1
            background: Rectangle { color: Theme.surface; opacity: 0.85; radius: 2 }
        }
        Label {
            // The measured bandwidth: on its line when the plot reaches it, else above.
            anchors.right: parent.right
            anchors.rightMargin: 3
            // Below the line when above it would run into the scale's label.
            y: !plot.limitOnScale ? 3 : plot.limitY < height + 6 ? plot.limitY + 2 : plot.limitY - height - 1
            visible: panel.streaming.h2dBandwidthBytesPerSecond > 0
            text: plot.limitOnScale ? qsTr("PCIe %1").arg(Units.rate(panel.streaming.h2dBandwidthBytesPerSecond))
                                    : qsTr("PCIe %1 ↑").arg(Units.rate(panel.streaming.h2dBandwidthBytesPerSecond))
            color: Theme.pcieLine
            font.pixelSize: 10
        }
        Label {
            anchors.right: parent.right
            anchors.bottom: parent.bottom
            anchors.margins: 3
            text: qsTr("host→device · last %1 s").arg(Math.round(plot.spanSeconds))
            color: Theme.mutedText
            font.pixelSize: 10
        }
    }

    Label {
        Layout.fillWidth: true
        wrapMode: Text.Wrap
        text: (panel.layerCount === 0 ? qsTr("no layer plan")
               : panel.layersStreamed === 0 ? qsTr("all %1 layers resident").arg(panel.layerCount)
               : qsTr("%1 of %2 streamed").arg(panel.layersStreamed).arg(panel.layerCount))
              + (panel.experts.active && panel.experts.residentExperts < panel.experts.totalExperts
                 ? qsTr(" · %1 of %2 experts in VRAM").arg(panel.experts.residentExperts)
                                                       .arg(panel.experts.totalExperts)
                 : "")
        color: Theme.text
        font.pixelSize: Theme.smallFontSize
    }
    RowLayout {
        Layout.fillWidth: true
        spacing: Theme.spacing
        Item { Layout.fillWidth: true }
        Rectangle { implicitWidth: 10; implicitHeight: 10; radius: 2; color: Theme.residentLayer }
        Label { text: qsTr("resident"); color: Theme.mutedText; font.pixelSize: Theme.smallFontSize }
        Rectangle { implicitWidth: 10; implicitHeight: 10; radius: 2; color: Theme.streamedLayer }
        Label { text: qsTr("streamed"); color: Theme.mutedText; font.pixelSize: Theme.smallFontSize }
        Rectangle {
            visible: panel.experts.active
            implicitWidth: 10; implicitHeight: 10; radius: 2; color: Theme.pcieLine
        }
        Label {
            visible: panel.experts.active
            text: qsTr("experts")
            color: Theme.mutedText
            font.pixelSize: Theme.smallFontSize
        }
    }
    LayerStrip {
        Layout.fillWidth: true
        streamed: panel.streaming.layerStreamed
    }

    GridLayout {
        Layout.fillWidth: true
        columns: 2
        columnSpacing: Theme.padding
        rowSpacing: 2
        StatRow {
            Layout.fillWidth: true
            name: qsTr("per token")
            value: Units.bytes(panel.streaming.h2dBytesPerToken
                               + (panel.experts.active ? panel.experts.bytesPerToken : 0))
        }
        StatRow {
            Layout.fillWidth: true
            name: qsTr("per pass")
            value: Units.bytes(panel.streaming.streamedBytesPerPass)
        }
        StatRow {
            Layout.fillWidth: true
            Layout.columnSpan: 2
            name: qsTr("PCIe bandwidth, measured at load")
            value: panel.streaming.h2dBandwidthBytesPerSecond > 0
                   ? Units.rate(panel.streaming.h2dBandwidthBytesPerSecond) : qsTr("—")
        }
    }

    // The staging ring: its slots and bytes, and how busy the copy engine kept it.
    RowLayout {
        Layout.fillWidth: true
        spacing: Theme.spacing
        Label {
            text: qsTr("staging %1 × %2").arg(panel.streaming.stagingSlots)
                      .arg(Units.bytes(panel.streaming.stagingSlots > 0
                                       ? panel.streaming.stagingBytes / panel.streaming.stagingSlots : 0))
            color: Theme.mutedText
            font.pixelSize: Theme.smallFontSize
        }
        Rectangle {
            Layout.fillWidth: true
            implicitHeight: 6
            radius: 3
            color: Theme.raised
            border.color: Theme.border
            Rectangle {
                height: parent.height
                radius: 3
                width: parent.width * Math.max(0, Math.min(1, panel.streaming.stagingOccupancy))
                color: Theme.streamedLayer
            }
        }
        Label {
            text: qsTr("%1% busy").arg(Math.round(100 * panel.streaming.stagingOccupancy))
            color: Theme.text
            font.pixelSize: Theme.smallFontSize
            font.family: Theme.monoFamily
        }
    }
    Label {
        Layout.fillWidth: true
        wrapMode: Text.Wrap
        color: panel.streaming.replans > 0 ? Theme.text : Theme.mutedText
        font.pixelSize: Theme.smallFontSize
        text: panel.streaming.replans > 0
              ? qsTr("Re-plans: %1 · last: %2").arg(panel.streaming.replans).arg(panel.streaming.lastReplanReason)
              : qsTr("Re-plans: none since loading")
    }
}
