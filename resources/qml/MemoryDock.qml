// MemoryDock: the live panels stacked (the expert panel only for a mixture of experts),
// collapsible to a thin strip.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

Rectangle {
    id: dock
    required property TelemetryModel telemetry
    // Weight streaming is a GPU matter; on the CPU the middle panel shows host memory.
    readonly property bool gpu: telemetry.frame.device.gpu
    // The chats run on a server: its panel replaces the local engine's (which has none).
    readonly property bool remote: telemetry.frame.remote.server !== undefined
    property bool expanded: true
    signal toggled()

    objectName: "memoryDock"
    implicitWidth: expanded ? Theme.dockWidth : 36
    color: Theme.window

    // One reading of a mixture's experts over the last second, for the Experts and Streaming
    // panels both (each cell of every layer compared once a frame, not once per panel).
    ExpertActivity {
        id: experts
        telemetry: dock.telemetry
    }

    Rectangle {
        width: 1
        height: parent.height
        color: Theme.border
    }

    ToolButton {
        id: toggle
        anchors.top: parent.top
        anchors.left: parent.left
        anchors.margins: 4
        text: dock.expanded ? "»" : "«"
        onClicked: dock.toggled()
        ToolTip.visible: hovered
        ToolTip.text: dock.expanded ? qsTr("Hide the memory panels") : qsTr("Show the memory panels")
    }
    Label {
        // A recording plays in the panels (granule --replay), not the engine's live figures.
        anchors.verticalCenter: toggle.verticalCenter
        anchors.left: toggle.right
        anchors.right: parent.right
        anchors.rightMargin: Theme.spacing
        visible: dock.expanded && dock.telemetry.replaySource.length > 0
        elide: Text.ElideMiddle
        text: qsTr("Replay of %1 · %2 s").arg(dock.telemetry.replaySource)
                  .arg(dock.telemetry.frame.timeS.toFixed(1))
        color: Theme.accent
        font.pixelSize: Theme.smallFontSize
    }

    ScrollView {
        anchors.fill: parent
        anchors.topMargin: toggle.height + 4
        visible: dock.expanded
        contentWidth: availableWidth
        ColumnLayout {
            width: parent.width
            spacing: Theme.spacing
            RemotePanel {
                // Only while the chats run on a server: its own load, from its /metrics.
                Layout.fillWidth: true
                Layout.leftMargin: Theme.spacing
                Layout.rightMargin: Theme.spacing
                telemetry: dock.telemetry
            }
            MemoryPanel {
                Layout.fillWidth: true
                Layout.leftMargin: Theme.spacing
                Layout.rightMargin: Theme.spacing
                visible: !dock.remote
                telemetry: dock.telemetry
            }
            ExpertPanel {
                // Shows itself only for a mixture of experts, right under the VRAM it explains.
                Layout.fillWidth: true
                Layout.leftMargin: Theme.spacing
                Layout.rightMargin: Theme.spacing
                telemetry: dock.telemetry
                shared: experts
            }
            StreamingPanel {
                Layout.fillWidth: true
                Layout.leftMargin: Theme.spacing
                Layout.rightMargin: Theme.spacing
                visible: dock.gpu && !dock.remote
                telemetry: dock.telemetry
                shared: experts
            }
            HostMemoryPanel {
                Layout.fillWidth: true
                Layout.leftMargin: Theme.spacing
                Layout.rightMargin: Theme.spacing
                visible: !dock.gpu
                telemetry: dock.telemetry
            }
            GraphPanel {
                visible: !dock.remote
                Layout.fillWidth: true
                Layout.leftMargin: Theme.spacing
                Layout.rightMargin: Theme.spacing
                Layout.bottomMargin: Theme.spacing
                telemetry: dock.telemetry
            }
        }
    }
}
