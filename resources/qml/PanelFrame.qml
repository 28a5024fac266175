// PanelFrame: a dock panel's title, its current figure on the right, and its content.
import QtQuick
import QtQuick.Controls
import QtQuick.Layouts

Rectangle {
    id: frame
    property string title
    property string figure
    default property alias content: body.data

    implicitHeight: column.implicitHeight + 2 * Theme.padding
    radius: Theme.radius
    color: Theme.surface
    border.color: Theme.border

    ColumnLayout {
        id: column
        anchors.fill: parent
        anchors.margins: Theme.padding
        spacing: Theme.spacing
        RowLayout {
            Layout.fillWidth: true
            Label {
                text: frame.title
                color: Theme.text
                font.pixelSize: Theme.fontSize
                font.weight: Font.DemiBold
            }
            Label {
                Layout.fillWidth: true
                horizontalAlignment: Text.AlignRight
                elide: Text.ElideLeft
                text: frame.figure
                color: Theme.text
                font.pixelSize: Theme.fontSize
                font.family: Theme.monoFamily
            }
        }
        ColumnLayout {
            id: body
            Layout.fillWidth: true
            spacing: 6
        }
    }
}
