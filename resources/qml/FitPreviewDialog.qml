// FitPreviewDialog: before a model loads, what it needs against the memory budget
// (weights, KV at the configured context and chats), whether it fits, and the placement
// plan: the layers that stay resident and those streamed over PCIe, with the KV capacity
// and the decode rate PCIe allows.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

GranuleDialog {
    id: dialog
    required property ModelController model

    title: qsTr("Open %1?").arg(model.previewName)
    visible: model.status === ModelController.Previewing
    width: Math.min(560, parent ? parent.width - 80 : 560)
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
        // The placement plan for this budget.
        ColumnLayout {
            Layout.fillWidth: true
            visible: dialog.model.fitResidentLayers + dialog.model.fitStreamedLayers > 0
            spacing: 4
            RowLayout {
                Layout.fillWidth: true
                LegendItem {
                    swatch: Theme.residentLayer
                    name: qsTr("resident")
                    value: String(dialog.model.fitResidentLayers)
                }
                LegendItem {
                    swatch: Theme.streamedLayer
                    name: qsTr("streamed")
                    value: String(dialog.model.fitStreamedLayers)
                }
                Label {
                    Layout.fillWidth: true
                    horizontalAlignment: Text.AlignRight
                    text: dialog.model.fitExpertsPerLayer > 0
                          ? qsTr("attention, routers: resident")
                          : dialog.model.fitStreamedLayers > 0
                          ? qsTr("%1 of %2 layers stream from host memory")
                                .arg(dialog.model.fitStreamedLayers)
                                .arg(dialog.model.fitResidentLayers + dialog.model.fitStreamedLayers)
                          : qsTr("every layer stays in device memory")
                    color: Theme.text
                    font.pixelSize: Theme.smallFontSize
                }
            }
            LayerStrip {
                Layout.fillWidth: true
                streamed: dialog.model.fitLayerStreamed
            }
            GridLayout {
                Layout.fillWidth: true
                columns: 2
                columnSpacing: Theme.padding
                rowSpacing: 2
                StatRow {
                    Layout.fillWidth: true
                    name: qsTr("KV capacity")
                    value: qsTr("%1 tokens").arg(Units.count(dialog.model.fitKvCapacityTokens))
                }
                StatRow {
                    Layout.fillWidth: true
                    name: qsTr("per chat, at most")
                    value: qsTr("%1 tokens").arg(Units.count(dialog.model.fitMaxContextPerChat))
                }
                StatRow {
                    Layout.fillWidth: true
                    visible: dialog.model.fitStreamedLayers > 0
                    name: qsTr("streamed per token")
                    value: Units.bytes(dialog.model.fitStreamedBytesPerPass)
                }
                StatRow {
                    Layout.fillWidth: true
                    visible: dialog.model.fitStreamedLayers > 0
                    name: qsTr("staging ring")
                    value: Units.bytes(dialog.model.fitStagingBytes)
                }
            }
            // A mixture of experts: attention and routers of every layer stay resident (the
            // strip above); experts fill the rest of the budget, the others are read over PCIe.
            ColumnLayout {
                Layout.fillWidth: true
                visible: dialog.model.fitExpertsPerLayer > 0
                spacing: 4
                RowLayout {
                    Layout.fillWidth: true
                    LegendItem {
                        swatch: Theme.residentLayer
                        name: dialog.model.fitGpu ? qsTr("experts in VRAM") : qsTr("experts in memory")
                        value: Units.count(dialog.model.fitResidentExperts)
                    }
                    Label {
                        Layout.fillWidth: true
                        horizontalAlignment: Text.AlignRight
                        text: dialog.model.fitFewestExpertsInALayer === dialog.model.fitMostExpertsInALayer
                              ? qsTr("%1 of %2 per layer, %3 routed per token")
                                    .arg(dialog.model.fitMostExpertsInALayer)
                                    .arg(dialog.model.fitExpertsPerLayer).arg(dialog.model.fitExpertsUsed)
                              : qsTr("%1–%2 of %3 per layer, %4 routed per token")
                                    .arg(dialog.model.fitFewestExpertsInALayer)
                                    .arg(dialog.model.fitMostExpertsInALayer)
                                    .arg(dialog.model.fitExpertsPerLayer).arg(dialog.model.fitExpertsUsed)
                        color: Theme.text
                        font.pixelSize: Theme.smallFontSize
                    }
                }
                Rectangle {
                    // The share of experts the budget holds.
                    Layout.fillWidth: true
                    implicitHeight: 10
                    radius: 2
                    color: Theme.streamedLayer
                    Rectangle {
                        height: parent.height
                        radius: 2
                        width: parent.width * dialog.model.fitResidentExperts / Math.max(1, dialog.model.fitTotalExperts)
                        color: Theme.residentLayer
                    }
                }
                GridLayout {
                    Layout.fillWidth: true
                    columns: 2
                    columnSpacing: Theme.padding
                    rowSpacing: 2
                    StatRow {
                        name: qsTr("always resident")
                        value: Units.bytes(dialog.model.fitAlwaysResidentBytes)
                    }
                    StatRow {
                        name: qsTr("one expert")
                        value: Units.bytes(dialog.model.fitExpertBytes)
                    }
                    StatRow {
                        Layout.columnSpan: 2
                        visible: dialog.model.fitGpu
                        name: qsTr("experts over PCIe per token (uniform routing)")
                        value: Units.bytes(dialog.model.fitExpertPcieBytesPerToken)
                    }
                    StatRow {
                        Layout.columnSpan: 2
                        visible: !dialog.model.fitGpu
                        name: qsTr("experts on the CPU")
                        value: dialog.model.fitCpuInt8Experts ? qsTr("int8 copies") : qsTr("exact f32, slower")
                    }
                }
                Label {
                    Layout.fillWidth: true
                    visible: !dialog.model.fitGpu && !dialog.model.fitCpuInt8Experts
                    wrapMode: Text.Wrap
                    color: Theme.text
                    font.pixelSize: Theme.smallFontSize
                    text: qsTr("The experts' int8 copies do not fit the memory available, so the CPU runs them on the exact f32 path, several times slower. Closing other programs frees memory for them.")
                }
                Label {
                    Layout.fillWidth: true
                    visible: dialog.model.fitGpu && dialog.model.fitExpertPcieBytesPerToken > 0
                    wrapMode: Text.Wrap
                    color: Theme.text
                    font.pixelSize: Theme.smallFontSize
                    text: qsTr("PCIe bound: at most %1 tok/s at batch 1 (%2 of experts per token over %3, %4)%5; a skewed router reads less once its hot experts are resident.")
                              .arg(dialog.model.fitPcieTokensPerSecond.toFixed(1))
                              .arg(Units.bytes(dialog.model.fitExpertPcieBytesPerToken))
                              .arg(Units.rate(dialog.model.fitH2dBytesPerSecond))
                              .arg(dialog.model.fitH2dMeasured ? qsTr("measured") : qsTr("assumed PCIe 4.0 x16"))
                              .arg(dialog.model.fitExpertHostShare > 0
                                   ? qsTr(", the CPU computing %1 % of the missed experts meanwhile")
                                         .arg(Math.round(dialog.model.fitExpertHostShare * 100 / 256))
                                   : "")
                }
            }
            Label {
                // The PCIe bound: every decode step copies the streamed layers once.
                Layout.fillWidth: true
                visible: dialog.model.fitStreamedLayers > 0
                wrapMode: Text.Wrap
                color: Theme.text
                font.pixelSize: Theme.smallFontSize
                text: qsTr("PCIe bound: at most %1 tok/s at batch 1 (%2 per token over %3, %4).%5")
                          .arg(dialog.model.fitPcieTokensPerSecond.toFixed(1))
                          .arg(Units.bytes(dialog.model.fitStreamedBytesPerPass))
                          .arg(Units.rate(dialog.model.fitH2dBytesPerSecond))
                          .arg(dialog.model.fitH2dMeasured ? qsTr("measured") : qsTr("assumed PCIe 4.0 x16"))
                          .arg(dialog.model.fitHostRows
                               ? qsTr(" Up to 8 chats at once, the CPU computes part of each streamed layer's rows meanwhile (its share measured at load), so decoding can pass this bound.")
                               : "")
            }
            Label {
                Layout.fillWidth: true
                visible: !dialog.model.fitLoads
                wrapMode: Text.Wrap
                color: Theme.errorText
                font.pixelSize: Theme.smallFontSize
                text: dialog.model.fitExpertsPerLayer > 0
                      ? qsTr("The budget %1 is below the %2 this model needs at least (embeddings, attention, routers, workspace and KV; experts can all stay in host memory).")
                            .arg(Units.bytes(dialog.model.fitBudgetBytes))
                            .arg(Units.bytes(dialog.model.fitMinimumBudgetBytes))
                      : qsTr("The budget %1 is below the %2 this model needs at least (fixed weights, staging, workspace and KV).")
                          .arg(Units.bytes(dialog.model.fitBudgetBytes))
                          .arg(Units.bytes(dialog.model.fitMinimumBudgetBytes))
            }
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
        RowLayout {
            Layout.fillWidth: true
            visible: dialog.model.fitGpu
            spacing: Theme.spacing
            Label {
                Layout.alignment: Qt.AlignTop
                Layout.topMargin: 8
                text: qsTr("VRAM budget")
                color: Theme.text
                font.pixelSize: Theme.smallFontSize
            }
            BudgetControl {
                Layout.fillWidth: true
                budgetBytes: dialog.model.vramBudgetBytes
                automaticBytes: dialog.model.fitBudgetBytes
                weightsBytes: dialog.model.fitWeightsBytes
                minimumBytes: dialog.model.fitMinimumBudgetBytes
                onChosen: bytes => dialog.model.vramBudgetBytes = bytes
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
