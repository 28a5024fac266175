// MemoryPanel: the memory ledger over the last minute as a stacked area by category,
// the budget line, and each generating chat's KV (committed vs reserved).
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

PanelFrame {
    id: panel
    required property TelemetryModel telemetry

    title: telemetry.gpu ? qsTr("VRAM") : qsTr("Memory (host)")
    figure: telemetry.hasEngine
            ? qsTr("%1 / %2").arg(Units.bytes(telemetry.usedBytes)).arg(Units.bytes(telemetry.budgetBytes))
            : Units.bytes(telemetry.processResidentBytes)

    Label {
        Layout.fillWidth: true
        visible: !panel.telemetry.gpu
        wrapMode: Text.Wrap
        color: Theme.warning
        font.pixelSize: Theme.smallFontSize
        text: panel.telemetry.hasEngine
              ? qsTr("No GPU: the engine runs on the CPU; the ledger counts host memory.")
              : qsTr("No model loaded: showing the process's memory.")
    }

    TimeSeriesPlot {
        id: plot
        Layout.fillWidth: true
        Layout.preferredHeight: Theme.plotHeight
        telemetry: panel.telemetry
        metric: panel.telemetry.hasEngine ? TimeSeriesPlot.Memory : TimeSeriesPlot.ProcessMemory
        seriesColors: panel.telemetry.hasEngine ? Theme.ledgerColors : [Theme.other]
        gridColor: Theme.gridLine
        labelColor: Theme.mutedText
        limitColor: Theme.budgetLine
        Label {
            anchors.left: parent.left
            anchors.top: parent.top
            anchors.margins: 3
            text: Units.bytes(plot.scaleMax)
            color: Theme.mutedText
            font.pixelSize: 10
        }
        Label {
            anchors.right: parent.right
            anchors.top: parent.top
            anchors.margins: 3
            visible: panel.telemetry.hasEngine
            text: plot.limitOnScale ? qsTr("- - budget") : qsTr("budget %1 ↑").arg(Units.bytes(panel.telemetry.budgetBytes))
            color: Theme.budgetLine
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

    GridLayout {
        Layout.fillWidth: true
        visible: panel.telemetry.hasEngine
        columns: 2
        columnSpacing: Theme.padding
        rowSpacing: 2
        Repeater {
            model: panel.telemetry.ledgerBytes
            delegate: LegendItem {
                required property int index
                required property double modelData
                Layout.fillWidth: true
                swatch: Theme.ledgerColors[index]
                name: Theme.ledgerNames[index]
                value: Units.bytes(modelData)
            }
        }
    }

    Label {
        visible: panel.telemetry.hasEngine
        text: qsTr("KV per chat — committed / reserved")
        color: Theme.mutedText
        font.pixelSize: Theme.smallFontSize
    }
    Repeater {
        model: panel.telemetry
        delegate: ColumnLayout {
            id: chatRow
            required property string title
            required property double kvCommitted
            required property double kvReserved
            required property bool highlighted
            required property bool waiting
            required property int preemptions
            Layout.fillWidth: true
            spacing: 2
            RowLayout {
                Layout.fillWidth: true
                Label {
                    Layout.fillWidth: true
                    text: chatRow.title
                    elide: Text.ElideRight
                    color: chatRow.highlighted ? Theme.accent : Theme.text
                    font.pixelSize: Theme.smallFontSize
                    font.weight: chatRow.highlighted ? Font.DemiBold : Font.Normal
                }
                Label {
                    // Held back by the KV budget: admitted (or recomputed) when memory frees.
                    visible: chatRow.waiting
                    text: chatRow.preemptions > 0 ? qsTr("preempted, waiting") : qsTr("waiting")
                    color: Theme.warning
                    font.pixelSize: Theme.smallFontSize
                }
                Label {
                    text: qsTr("%1 / %2").arg(Units.bytes(chatRow.kvCommitted))
                                         .arg(Units.bytes(chatRow.kvReserved))
                    color: Theme.text
                    font.pixelSize: Theme.smallFontSize
                    font.family: Theme.monoFamily
                }
            }
            Rectangle {
                Layout.fillWidth: true
                implicitHeight: 6
                radius: 3
                color: Theme.raised
                border.color: chatRow.highlighted ? Theme.accent : "transparent"
                Rectangle {
                    height: parent.height
                    radius: 3
                    width: chatRow.kvReserved > 0 ? Math.max(2, parent.width * chatRow.kvCommitted / chatRow.kvReserved) : 0
                    color: Theme.kv
                }
            }
        }
    }
    RowLayout {
        // The granules under the chats' KV: how many the last step mapped and how long that
        // took, then how many were mapped so far and what the pool holds ready. Granules the
        // step had to create mean the pool ran dry. The step's figures come first: at the
        // dock's width the rest elides (the pool is also in the legend above), and hovering
        // shows the whole line.
        id: granuleRow
        Layout.fillWidth: true
        visible: panel.telemetry.hasEngine
        spacing: 0
        HoverHandler {
            id: granuleHover
        }
        ToolTip.visible: granuleHover.hovered
                         && (stepLabel.truncated || totalLabel.truncated || !totalLabel.visible)
        ToolTip.text: stepLabel.text + (createdLabel.visible ? createdLabel.text : "") + totalLabel.text
        Label {
            id: stepLabel
            // Filling (up to its text) so it can shrink and elide: a Layout fixes a label
            // that does not fill at its full width, which would widen the panel.
            Layout.fillWidth: true
            Layout.maximumWidth: Math.ceil(implicitWidth)
            elide: Text.ElideRight
            text: qsTr("granules: last step %1 in %2 µs")
                      .arg(panel.telemetry.granulesMappedLastStep.toLocaleString(Qt.locale(), "f", 0))
                      .arg(panel.telemetry.mappingUsLastStep.toLocaleString(
                               Qt.locale(), "f", panel.telemetry.mappingUsLastStep > 0
                                               && panel.telemetry.mappingUsLastStep < 10 ? 1 : 0))
            color: Theme.mutedText
            font.pixelSize: Theme.smallFontSize
        }
        Label {
            id: createdLabel
            visible: panel.telemetry.granulesCreatedLastStep > 0
            text: qsTr(", %1 created").arg(
                      panel.telemetry.granulesCreatedLastStep.toLocaleString(Qt.locale(), "f", 0))
            color: Theme.warning
            font.pixelSize: Theme.smallFontSize
        }
        Label {
            id: totalLabel
            // Takes what is left of the line, and no more; left out when only a stub would
            // show. Measured against the panel, not the row: the row stops filling the
            // panel while this label is hidden.
            visible: granuleRow.parent.width - stepLabel.implicitWidth
                     - (createdLabel.visible ? createdLabel.implicitWidth : 0) >= 60
            Layout.fillWidth: true
            Layout.preferredWidth: 0
            elide: Text.ElideRight
            text: qsTr(" · %1 mapped so far · pool %2")
                      .arg(panel.telemetry.granulesMapped.toLocaleString(Qt.locale(), "f", 0))
                      .arg(Units.bytes(panel.telemetry.kvPoolBytes))
            color: Theme.mutedText
            font.pixelSize: Theme.smallFontSize
        }
    }
    Label {
        // The scheduler's answer to a full KV budget: chats wait, or give their KV back and
        // are recomputed later — never an out-of-memory error.
        visible: panel.telemetry.hasEngine
                 && (panel.telemetry.waitingChats > 0 || panel.telemetry.preemptions > 0)
        Layout.fillWidth: true
        wrapMode: Text.WordWrap
        text: qsTr("%1 waiting for memory · %2 preempted, %3 tokens recomputed")
                  .arg(panel.telemetry.waitingChats)
                  .arg(panel.telemetry.preemptions)
                  .arg(panel.telemetry.recomputedTokens)
        color: panel.telemetry.waitingChats > 0 ? Theme.warning : Theme.mutedText
        font.pixelSize: Theme.smallFontSize
    }
    Label {
        visible: panel.telemetry.hasEngine && panel.telemetry.chatCount === 0
        text: qsTr("No chat is holding KV right now.")
        color: Theme.mutedText
        font.pixelSize: Theme.smallFontSize
    }
}
