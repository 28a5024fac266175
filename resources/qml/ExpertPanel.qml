// ExpertPanel: a mixture of experts' experts — per layer which sit in device memory, which
// were read from host memory over PCIe this second, and how often tokens routed to each —
// with the hit rate, PCIe bytes per token and the resident count beside. Hidden for a dense
// model.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

PanelFrame {
    id: panel
    required property TelemetryModel telemetry
    // The experts' reading the dock hands over (one for this panel and the Streaming panel), or
    // else the panel's own.
    property ExpertActivity shared: null
    readonly property ExpertActivity activity: shared ? shared : ownActivity
    readonly property bool idle: activity.hitRate < 0
    // Rows in expert order, or each sorted by routing since load (most routed first).
    property bool sorted: true

    objectName: "expertPanel"
    visible: activity.active
    title: qsTr("Experts")
    figure: idle ? qsTr("idle") : qsTr("%1% hits").arg(Math.round(100 * activity.hitRate))

    ExpertActivity {
        id: ownActivity
        telemetry: panel.shared ? null : panel.telemetry  // idle while the dock's serves
    }

    Item {
        Layout.fillWidth: true
        Layout.preferredHeight: Math.max(96, Math.min(240, panel.activity.layers * 4))
        // Layer numbers on the left: the first at the top, the last at the bottom.
        Label {
            id: firstLayer
            anchors.left: parent.left
            anchors.top: parent.top
            width: 20
            horizontalAlignment: Text.AlignRight
            text: "0"
            color: Theme.mutedText
            font.pixelSize: 10
        }
        Label {
            anchors.left: parent.left
            anchors.verticalCenter: parent.verticalCenter
            width: 20
            horizontalAlignment: Text.AlignRight
            text: qsTr("layer")
            rotation: -90
            color: Theme.mutedText
            font.pixelSize: 10
        }
        Label {
            anchors.left: parent.left
            anchors.bottom: parent.bottom
            width: 20
            horizontalAlignment: Text.AlignRight
            text: Math.max(0, panel.activity.layers - 1)
            color: Theme.mutedText
            font.pixelSize: 10
        }
        ExpertHeatMap {
            id: map
            anchors.left: firstLayer.right
            anchors.leftMargin: 4
            anchors.right: parent.right
            anchors.top: parent.top
            anchors.bottom: parent.bottom
            activity: panel.activity
            residentColor: Theme.residentLayer
            hostColor: Theme.mutedText
            streamedColor: Theme.pcieLine
            backgroundColor: Theme.surface
            sortedByRouting: panel.sorted
            MouseArea {
                id: hover
                anchors.fill: parent
                hoverEnabled: true
                property string cell: containsMouse
                    ? panel.activity.describeCell(map.layerAt(mouseY), map.expertAt(mouseX, mouseY)) : ""
                ToolTip.visible: containsMouse && cell.length > 0
                ToolTip.text: cell
            }
        }
    }
    RowLayout {
        // Under the grid: what the columns are, and the switch between the two orders.
        Layout.fillWidth: true
        Layout.leftMargin: 24
        Layout.topMargin: -4
        Label {
            text: panel.sorted ? qsTr("most routed") : qsTr("expert 0")
            color: Theme.mutedText
            font.pixelSize: 10
        }
        Item { Layout.fillWidth: true }
        Label {
            text: panel.sorted ? qsTr("least routed")
                               : String(Math.max(0, panel.activity.expertsPerLayer - 1))
            color: Theme.mutedText
            font.pixelSize: 10
        }
    }
    RowLayout {
        Layout.fillWidth: true
        spacing: Theme.padding
        LegendItem { swatch: Theme.residentLayer; name: qsTr("VRAM") }
        LegendItem { swatch: Theme.mutedText; name: qsTr("host") }
        // Misses the CPU computed are not read over PCIe: the cell cannot tell the two apart.
        LegendItem {
            swatch: Theme.pcieLine
            name: panel.activity.cpuShare > 0 ? qsTr("PCIe or CPU")
                                              : qsTr("read over PCIe")
        }
    }
    RowLayout {
        Layout.fillWidth: true
        spacing: Theme.spacing
        Label {
            Layout.fillWidth: true
            text: qsTr("brighter: routed more, last second")
            color: Theme.mutedText
            font.pixelSize: Theme.smallFontSize
            elide: Text.ElideRight
        }
        Label {
            text: panel.sorted ? qsTr("by routing") : qsTr("by index")
            color: Theme.accent
            font.pixelSize: Theme.smallFontSize
            font.underline: orderArea.containsMouse
            MouseArea {
                id: orderArea
                anchors.fill: parent
                hoverEnabled: true
                cursorShape: Qt.PointingHandCursor
                onClicked: panel.sorted = !panel.sorted
            }
            ToolTip.visible: orderArea.containsMouse
            ToolTip.text: panel.sorted ? qsTr("Each row sorted by routing since load; click for expert order")
                                       : qsTr("Each row in expert order; click to sort by routing")
        }
    }

    GridLayout {
        Layout.fillWidth: true
        columns: 2
        columnSpacing: Theme.padding
        rowSpacing: 2
        StatRow {
            Layout.columnSpan: 2
            name: qsTr("resident")
            value: panel.activity.fewestResidentInALayer === panel.activity.mostResidentInALayer
                   ? qsTr("%1 of %2 · %3 per layer").arg(panel.activity.residentExperts)
                         .arg(panel.activity.totalExperts).arg(panel.activity.mostResidentInALayer)
                   : qsTr("%1 of %2 · %3–%4 per layer").arg(panel.activity.residentExperts)
                         .arg(panel.activity.totalExperts).arg(panel.activity.fewestResidentInALayer)
                         .arg(panel.activity.mostResidentInALayer)
        }
        StatRow {
            name: qsTr("hit rate")
            value: panel.idle ? qsTr("—") : qsTr("%1%").arg((100 * panel.activity.hitRate).toFixed(1))
        }
        StatRow {
            name: qsTr("since load")
            value: panel.activity.lifetimeHitRate < 0 ? qsTr("—")
                   : qsTr("%1%").arg((100 * panel.activity.lifetimeHitRate).toFixed(1))
        }
        StatRow {
            name: qsTr("PCIe/token")
            value: Units.bytes(panel.activity.bytesPerToken)
        }
        StatRow {
            name: qsTr("PCIe")
            value: Units.rate(panel.activity.bytesPerSecond)
        }
        StatRow {
            name: qsTr("streamed")
            value: Units.count(panel.activity.streamedExperts)
        }
        StatRow {
            name: qsTr("moves")
            value: qsTr("+%1 / −%2").arg(Units.count(panel.activity.promotions))
                       .arg(Units.count(panel.activity.demotions))
        }
        StatRow {
            Layout.columnSpan: 2
            name: qsTr("CPU-computed")
            value: panel.activity.cpuShare < 0 ? qsTr("—")
                   : qsTr("%1% of misses · %2").arg((100 * panel.activity.cpuShare).toFixed(1))
                         .arg(Units.rate(panel.activity.cpuBytesPerSecond))
        }
    }
}
