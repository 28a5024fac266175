// ErrorBanner: the engine's one-line message and what to do, at the top of the
// conversation, until dismissed.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

Rectangle {
    id: banner
    required property ErrorReporter errors

    visible: errors.active
    implicitHeight: visible ? row.implicitHeight + 2 * Theme.spacing : 0
    color: Theme.errorBackground

    RowLayout {
        id: row
        anchors.fill: parent
        anchors.leftMargin: Theme.padding
        anchors.rightMargin: Theme.spacing
        spacing: Theme.spacing
        Label {
            text: "⚠"
            color: Theme.errorText
            font.pixelSize: Theme.titleFontSize
        }
        ColumnLayout {
            Layout.fillWidth: true
            spacing: 2
            Label {
                Layout.fillWidth: true
                wrapMode: Text.Wrap
                color: Theme.errorText
                font.pixelSize: Theme.fontSize
                font.weight: Font.DemiBold
                text: banner.errors.message
            }
            Label {
                Layout.fillWidth: true
                visible: banner.errors.hint.length > 0
                wrapMode: Text.Wrap
                color: Theme.text
                font.pixelSize: Theme.smallFontSize
                text: banner.errors.hint
            }
        }
        ToolButton {
            text: "✕"
            onClicked: banner.errors.dismiss()
            ToolTip.visible: hovered
            ToolTip.text: qsTr("Dismiss")
        }
    }
}
