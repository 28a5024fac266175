// MemoryDock: the three live panels stacked, collapsible to a thin strip.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

Rectangle {
    id: dock
    required property TelemetryModel telemetry
    property bool expanded: true
    signal toggled()

    implicitWidth: expanded ? Theme.dockWidth : 36
    color: Theme.window

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

    ScrollView {
        anchors.fill: parent
        anchors.topMargin: toggle.height + 4
        visible: dock.expanded
        contentWidth: availableWidth
        ColumnLayout {
            width: parent.width
            spacing: Theme.spacing
            MemoryPanel {
                Layout.fillWidth: true
                Layout.leftMargin: Theme.spacing
                Layout.rightMargin: Theme.spacing
                telemetry: dock.telemetry
            }
            HostMemoryPanel {
                Layout.fillWidth: true
                Layout.leftMargin: Theme.spacing
                Layout.rightMargin: Theme.spacing
                telemetry: dock.telemetry
            }
            GraphPanel {
                Layout.fillWidth: true
                Layout.leftMargin: Theme.spacing
                Layout.rightMargin: Theme.spacing
                Layout.bottomMargin: Theme.spacing
                telemetry: dock.telemetry
            }
        }
    }
}
