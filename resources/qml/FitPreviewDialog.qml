// FitPreviewDialog: before a model loads, what it needs against the memory budget
// (weights, KV at the configured context and chats) and whether it fits.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

Dialog {
    id: dialog
    required property ModelController model

    title: qsTr("Open %1?").arg(model.previewName)
    modal: true
    visible: model.status === ModelController.Previewing
    width: Math.min(560, parent ? parent.width - 80 : 560)
    anchors.centerIn: parent
    closePolicy: Popup.CloseOnEscape
    onRejected: model.cancelPreview()
    onAccepted: model.confirmLoad()

    ColumnLayout {
        anchors.fill: parent
        spacing: Theme.padding
        Label {
            Layout.fillWidth: true
            wrapMode: Text.Wrap
            color: Theme.mutedText
            font.pixelSize: Theme.smallFontSize
            text: dialog.model.previewDetails + "\n" + dialog.model.previewPath
        }
        // Weights and full-context KV as parts of the budget.
        Rectangle {
            id: budgetBar
            readonly property double total: Math.max(dialog.model.fitBudgetBytes,
                                                     dialog.model.fitWeightsBytes + dialog.model.fitKvBytes, 1)
            Layout.fillWidth: true
            implicitHeight: 14
            radius: 4
            color: Theme.raised
            border.color: Theme.border
            Row {
                anchors.fill: parent
                anchors.margins: 1
                Rectangle {
                    height: parent.height
                    width: parent.width * dialog.model.fitWeightsBytes / budgetBar.total
                    color: Theme.weights
                }
                Rectangle {
                    height: parent.height
                    width: parent.width * dialog.model.fitKvBytes / budgetBar.total
                    color: Theme.kv
                }
            }
        }
        GridLayout {
            columns: 2
            columnSpacing: Theme.padding
            LegendItem { swatch: Theme.weights; name: qsTr("weights"); value: Units.bytes(dialog.model.fitWeightsBytes) }
            LegendItem { swatch: Theme.kv; name: qsTr("KV at full context"); value: Units.bytes(dialog.model.fitKvBytes) }
            LegendItem { swatch: Theme.raised; name: qsTr("budget"); value: Units.bytes(dialog.model.fitBudgetBytes) }
        }
        Label {
            Layout.fillWidth: true
            wrapMode: Text.Wrap
            color: dialog.model.fits ? Theme.generating : Theme.warning
            font.pixelSize: Theme.fontSize
            text: dialog.model.fitSummary
        }
        RowLayout {
            spacing: Theme.spacing
            Label { text: qsTr("Context per chat"); color: Theme.text; font.pixelSize: Theme.smallFontSize }
            SpinBox {
                from: 256
                to: 131072
                stepSize: 1024
                editable: true
                value: dialog.model.contextLength
                onValueModified: dialog.model.contextLength = value
            }
            Label { text: qsTr("Chats at once"); color: Theme.text; font.pixelSize: Theme.smallFontSize }
            SpinBox {
                from: 1
                to: 64
                editable: true
                value: dialog.model.maxChats
                onValueModified: dialog.model.maxChats = value
            }
        }
    }

    footer: RowLayout {
        spacing: Theme.spacing
        Item { Layout.fillWidth: true }
        Button {
            text: qsTr("Cancel")
            onClicked: dialog.reject()
        }
        PrimaryButton {
            Layout.rightMargin: Theme.padding
            Layout.bottomMargin: Theme.padding
            text: qsTr("Load")
            onClicked: dialog.accept()
        }
    }
}
