// GranuleDialog: the look every dialog of the window shares — modal over a dimmed window,
// a rounded surface with a border, a title in the heading size and generous padding from
// the Theme's spacing scale.
import QtQuick
import Granule
import QtQuick.Controls

Dialog {
    id: dialog
    modal: true
    anchors.centerIn: parent
    padding: Theme.spacingXLarge
    topPadding: Theme.spacingLarge
    bottomPadding: Theme.spacingLarge

    Overlay.modal: Rectangle { color: Theme.dim }

    background: Rectangle {
        color: Theme.surface
        radius: Theme.radius + 4
        border.color: Theme.border
    }
    header: Label {
        text: dialog.title
        visible: dialog.title.length > 0
        elide: Text.ElideRight
        color: Theme.text
        font.pixelSize: Theme.headingFontSize
        font.weight: Font.DemiBold
        leftPadding: Theme.spacingXLarge
        rightPadding: Theme.spacingXLarge
        topPadding: Theme.spacingXLarge
        bottomPadding: 0
    }
    // The buttons sit on the dialog's own surface (Fusion's box has square corners and its
    // own grey), with the same side padding as the content.
    footer: DialogButtonBox {
        leftPadding: Theme.spacingXLarge
        rightPadding: Theme.spacingXLarge
        topPadding: 0
        bottomPadding: Theme.spacingLarge
        spacing: Theme.spacing
        background: Item {}
    }
}
