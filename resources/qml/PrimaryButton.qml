// PrimaryButton: the one action that matters most in its place (Send, Load, Open a model),
// filled with the accent colour.
import QtQuick
import QtQuick.Controls

Button {
    id: button
    font.pixelSize: Theme.fontSize
    contentItem: Label {
        text: button.text
        font: button.font
        color: Theme.accentText
        horizontalAlignment: Text.AlignHCenter
        verticalAlignment: Text.AlignVCenter
        opacity: button.enabled ? 1 : 0.6
    }
    background: Rectangle {
        implicitWidth: 80
        implicitHeight: 34
        radius: 6
        color: !button.enabled ? Theme.mutedText
             : button.down ? Qt.darker(Theme.accent, 1.2)
             : button.hovered ? Qt.lighter(Theme.accent, 1.1) : Theme.accent
        opacity: button.enabled ? 1 : 0.45
    }
}
