// StatRow: a figure's name on the left and its value on the right, for the panels' tables.
import QtQuick
import QtQuick.Controls
import QtQuick.Layouts

RowLayout {
    id: row
    property string name
    property string value
    property color valueColor: Theme.text
    spacing: Theme.spacing
    Label {
        Layout.fillWidth: true
        text: row.name
        elide: Text.ElideRight
        color: Theme.mutedText
        font.pixelSize: Theme.smallFontSize
    }
    Label {
        text: row.value
        color: row.valueColor
        font.pixelSize: Theme.smallFontSize
        font.family: Theme.monoFamily
    }
}
