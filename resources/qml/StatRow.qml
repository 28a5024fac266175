// StatRow: a figure's name on the left and its value on the right, for the panels' tables.
// Anchored rather than a RowLayout: the name elides into whatever the value leaves, so a
// long name never pushes the value out of the panel.
import QtQuick
import QtQuick.Controls
import QtQuick.Layouts

Item {
    id: row
    property string name
    property string value
    property color valueColor: Theme.text

    // In a layout, rows share the width equally and may shrink to nothing (the name elides):
    // a preferred width from the text would let a long name widen the whole grid.
    Layout.fillWidth: true
    Layout.preferredWidth: 1
    Layout.minimumWidth: 0
    implicitWidth: nameLabel.implicitWidth + Theme.spacing + valueLabel.implicitWidth
    implicitHeight: Math.max(nameLabel.implicitHeight, valueLabel.implicitHeight)

    Label {
        id: nameLabel
        anchors.left: parent.left
        anchors.right: valueLabel.left
        anchors.rightMargin: Theme.spacing
        anchors.verticalCenter: parent.verticalCenter
        text: row.name
        elide: Text.ElideRight
        color: Theme.mutedText
        font.pixelSize: Theme.smallFontSize
    }
    Label {
        id: valueLabel
        anchors.right: parent.right
        anchors.verticalCenter: parent.verticalCenter
        text: row.value
        color: row.valueColor
        font.pixelSize: Theme.smallFontSize
        font.family: Theme.monoFamily
    }
}
