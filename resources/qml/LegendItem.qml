// LegendItem: a colour swatch, a name and a value.
import QtQuick
import QtQuick.Controls
import QtQuick.Layouts

RowLayout {
    id: legend
    property color swatch
    property string name
    property string value
    spacing: 6
    Rectangle {
        implicitWidth: 10
        implicitHeight: 10
        radius: 2
        color: legend.swatch
    }
    Label {
        Layout.fillWidth: true
        text: legend.name
        color: Theme.mutedText
        font.pixelSize: Theme.smallFontSize
        elide: Text.ElideRight
    }
    Label {
        text: legend.value
        color: Theme.text
        font.pixelSize: Theme.smallFontSize
        font.family: Theme.monoFamily
    }
}
