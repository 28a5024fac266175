// MemoryPanel: the memory ledger over the last minute as a stacked area by category,
// the budget line, and each generating chat's KV (committed vs reserved), then that of each
// request the window's OpenAI server runs, labelled API.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

PanelFrame {
    id: panel
    required property TelemetryModel telemetry
    readonly property telemetryFrame frame: telemetry.frame
    // Bytes of each stacked ledger category, in the panels' order.
    readonly property list<real> ledgerBytes: {
        const ledger = frame.device.ledger
        const bytes = []
        for (const key of telemetry.ledgerCategories)
            bytes.push(ledger[key])
        return bytes
    }

    title: frame.device.gpu ? qsTr("VRAM") : qsTr("Memory (host)")
    figure: frame.hasEngine
            ? qsTr("%1 / %2").arg(Units.bytes(frame.device.usedBytes)).arg(Units.bytes(frame.device.budgetBytes))
            : Units.bytes(frame.host.processResidentBytes)

    Label {
        Layout.fillWidth: true
        visible: !panel.frame.device.gpu
        wrapMode: Text.Wrap
        color: Theme.warning
        font.pixelSize: Theme.smallFontSize
        text: panel.frame.hasEngine
              ? qsTr("No GPU: the engine runs on the CPU; the ledger counts host memory.")
              : qsTr("No model loaded: showing the process's memory.")
    }

    TimeSeriesPlot {
        id: plot
        Layout.fillWidth: true
        Layout.preferredHeight: Theme.plotHeight
        telemetry: panel.telemetry
        metric: panel.frame.hasEngine ? TimeSeriesPlot.Memory : TimeSeriesPlot.ProcessMemory
        seriesColors: panel.frame.hasEngine ? Theme.ledgerColors : [Theme.other]
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
            // Readable where a limit line runs under it (one near the scale's top).
            padding: 1
            background: Rectangle { color: Theme.surface; opacity: 0.85; radius: 2 }
        }
        Label {
            // The budget's label sits on its dashed line; a budget far above the data is
            // named at the top with an arrow instead of flattening the stack.
            anchors.right: parent.right
            anchors.rightMargin: 3
            y: !plot.limitOnScale ? 3 : plot.limitY < height + 6 ? plot.limitY + 2 : plot.limitY - height - 1
            visible: panel.frame.hasEngine && panel.frame.device.budgetBytes > 0
            text: plot.limitOnScale ? qsTr("budget %1").arg(Units.bytes(panel.frame.device.budgetBytes))
                                    : qsTr("budget %1 ↑").arg(Units.bytes(panel.frame.device.budgetBytes))
            color: Theme.budgetLine
            font.pixelSize: 10
            font.weight: Font.DemiBold
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
        visible: panel.frame.hasEngine
        columns: 2
        columnSpacing: Theme.padding
        rowSpacing: 2
        Repeater {
            model: panel.ledgerBytes
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
        // Filling and eliding: a label wider than the dock would widen the panel.
        Layout.fillWidth: true
        Layout.preferredWidth: 0
        elide: Text.ElideRight
        visible: panel.frame.hasEngine
        // API requests' rows are tagged API.
        text: qsTr("KV per chat — committed / reserved")
        color: Theme.mutedText
        font.pixelSize: Theme.smallFontSize
    }
    // At most four chats' rows show at once (the list scrolls), so many concurrent chats do
    // not push the streaming and graph panels out of the dock.
    ListView {
        id: chatRows
        readonly property real rowHeight: 28
        Layout.fillWidth: true
        Layout.preferredHeight: Math.min(contentHeight, 4.5 * rowHeight)
        visible: count > 0
        clip: true
        interactive: contentHeight > height
        boundsBehavior: Flickable.StopAtBounds
        ScrollBar.vertical: ScrollBar {
            policy: chatRows.contentHeight > chatRows.height ? ScrollBar.AlwaysOn : ScrollBar.AlwaysOff
        }
        model: panel.telemetry
        delegate: ColumnLayout {
            id: chatRow
            width: ListView.view ? ListView.view.width - 8 : 0
            height: 28  // chatRows.rowHeight
            required property string title
            required property bool highlighted
            required property bool api  // a request of the window's OpenAI server
            // The engine's SequenceTelemetry of the chat, its fields in camelCase.
            required property var sequence
            readonly property double kvCommitted: sequence.kvCommittedBytes
            // Of it, the sliding-window layers' KV (Gemma's): flat at the window while the
            // global layers' grows; 0 for a model without sliding layers.
            readonly property double kvWindow: sequence.kvWindowCommittedBytes || 0
            readonly property double kvReserved: sequence.kvReservedBytes
            readonly property bool waiting: sequence.waiting
            readonly property int preemptions: sequence.preemptions
            spacing: 2
            RowLayout {
                Layout.fillWidth: true
                Rectangle {
                    visible: chatRow.api
                    implicitWidth: apiTag.implicitWidth + 8
                    implicitHeight: apiTag.implicitHeight
                    radius: 3
                    color: Theme.raised
                    border.color: Theme.border
                    Label {
                        id: apiTag
                        anchors.centerIn: parent
                        text: qsTr("API")
                        color: Theme.mutedText
                        font.pixelSize: 10
                        font.weight: Font.DemiBold
                    }
                }
                Label {
                    Layout.fillWidth: true
                    text: chatRow.title
                    elide: chatRow.api ? Text.ElideMiddle : Text.ElideRight
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
                    // With sliding-window layers: the global layers' KV (growing) and the
                    // window layers' (flat); the reserved range is in the tooltip.
                    text: chatRow.kvWindow > 0
                          ? qsTr("%1 global · %2 window")
                                .arg(Units.bytes(chatRow.kvCommitted - chatRow.kvWindow))
                                .arg(Units.bytes(chatRow.kvWindow))
                          : qsTr("%1 / %2").arg(Units.bytes(chatRow.kvCommitted))
                                           .arg(Units.bytes(chatRow.kvReserved))
                    ToolTip.visible: kvHover.hovered && chatRow.kvWindow > 0
                    ToolTip.text: qsTr("%1 committed of %2 reserved; the sliding-window layers keep their last tokens only")
                                  .arg(Units.bytes(chatRow.kvCommitted))
                                  .arg(Units.bytes(chatRow.kvReserved))
                    HoverHandler { id: kvHover }
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
                    // The window layers' share, at the bar's end in a lighter shade.
                    Rectangle {
                        visible: chatRow.kvWindow > 0
                        anchors.right: parent.right
                        height: parent.height
                        radius: 3
                        width: chatRow.kvCommitted > 0 ? parent.width * chatRow.kvWindow / chatRow.kvCommitted : 0
                        color: Qt.lighter(Theme.kv, 1.5)
                    }
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
        visible: panel.frame.hasEngine
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
                      .arg(panel.frame.kv.lastGranulesMapped.toLocaleString(Qt.locale(), "f", 0))
                      .arg(panel.frame.kv.lastMappingUs.toLocaleString(
                               Qt.locale(), "f", panel.frame.kv.lastMappingUs > 0
                                               && panel.frame.kv.lastMappingUs < 10 ? 1 : 0))
            color: Theme.mutedText
            font.pixelSize: Theme.smallFontSize
        }
        Label {
            id: createdLabel
            visible: panel.frame.kv.lastGranulesCreated > 0
            text: qsTr(", %1 created").arg(
                      panel.frame.kv.lastGranulesCreated.toLocaleString(Qt.locale(), "f", 0))
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
                      .arg(panel.frame.kv.granulesMapped.toLocaleString(Qt.locale(), "f", 0))
                      .arg(Units.bytes(panel.frame.kv.poolBytes))
            color: Theme.mutedText
            font.pixelSize: Theme.smallFontSize
        }
    }
    Label {
        // The scheduler's answer to a full KV budget: chats wait, or give their KV back and
        // are recomputed later — never an out-of-memory error.
        visible: panel.frame.hasEngine
                 && (panel.frame.scheduler.waiting > 0 || panel.frame.scheduler.preemptions > 0)
        Layout.fillWidth: true
        wrapMode: Text.WordWrap
        text: qsTr("%1 waiting for memory · %2 preempted, %3 tokens recomputed")
                  .arg(panel.frame.scheduler.waiting)
                  .arg(panel.frame.scheduler.preemptions)
                  .arg(panel.frame.scheduler.recomputedTokens)
        color: panel.frame.scheduler.waiting > 0 ? Theme.warning : Theme.mutedText
        font.pixelSize: Theme.smallFontSize
    }
    Label {
        // Finished chats keep their KV for their next turn (the engine's kv_reuse): say what
        // is kept rather than that nothing is.
        readonly property int keptChats: panel.frame.scheduler.keptChats
        readonly property int swappedChats: panel.frame.scheduler.swappedChats
        visible: panel.frame.hasEngine && chatRows.count === 0
        Layout.fillWidth: true
        wrapMode: Text.WordWrap
        text: keptChats + swappedChats === 0
              ? qsTr("No chat is holding KV right now.")
              : qsTr("No chat is generating; KV kept for the next turn: %1 for %2 chat(s)")
                    .arg(Units.bytes(panel.frame.scheduler.keptKvBytes)).arg(keptChats)
                + (swappedChats === 0 ? "."
                   : qsTr(", %1 for %2 chat(s) moved to host memory.")
                         .arg(Units.bytes(panel.frame.scheduler.swappedKvBytes)).arg(swappedChats))
        color: Theme.mutedText
        font.pixelSize: Theme.smallFontSize
    }
}
