// RemotePanel: a remote engine's load as its server reports it on /metrics (vLLM, SGLang,
// llama-server, Granule), polled once a second. A figure the server does not expose reads
// "unavailable", never 0.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

PanelFrame {
    id: panel
    required property TelemetryModel telemetry
    readonly property telemetryFrame frame: telemetry.frame
    readonly property var remote: frame.remote

    function shown(value, text) {
        return value === undefined ? qsTr("unavailable") : text
    }

    visible: panel.remote.server !== undefined
    title: qsTr("Server")
    figure: panel.remote.server !== undefined ? panel.remote.server : ""

    Label {
        Layout.fillWidth: true
        elide: Text.ElideMiddle
        color: Theme.mutedText
        font.pixelSize: Theme.smallFontSize
        text: panel.remote.endpoint !== undefined ? panel.remote.endpoint : ""
    }
    GridLayout {
        Layout.fillWidth: true
        columns: 1
        rowSpacing: 2
        StatRow {
            objectName: "remoteRunning"
            name: qsTr("Requests running")
            value: panel.shown(panel.remote.running, Math.round(panel.remote.running))
        }
        StatRow {
            name: qsTr("Requests waiting")
            value: panel.shown(panel.remote.waiting, Math.round(panel.remote.waiting))
        }
        StatRow {
            objectName: "remoteKv"
            name: qsTr("KV cache in use")
            value: panel.remote.kvUsage !== undefined
                   ? (panel.remote.kvUsage * 100).toFixed(1) + " %"
                   : panel.shown(panel.remote.kvBytes, Units.bytes(panel.remote.kvBytes))
        }
        StatRow {
            name: qsTr("Prompt")
            value: panel.shown(panel.remote.promptTokensPerSecond,
                                qsTr("%1 tok/s").arg(Number(panel.remote.promptTokensPerSecond).toFixed(1)))
        }
        StatRow {
            name: qsTr("Generation")
            value: panel.shown(panel.remote.generationTokensPerSecond,
                                qsTr("%1 tok/s").arg(Number(panel.remote.generationTokensPerSecond).toFixed(1)))
        }
        StatRow {
            name: qsTr("Prefix-cache hits")
            value: panel.remote.prefixCacheHits !== undefined
                   ? (panel.remote.prefixCacheHits * 100).toFixed(0) + " %"
                   : panel.shown(panel.remote.prefixReusedTokens,
                                  qsTr("%1 tokens").arg(Math.round(panel.remote.prefixReusedTokens)))
        }
        // Granule's batching counters: how many sequences share a forward pass (the windows
        // and API clients on one server decode in the same steps).
        StatRow {
            objectName: "remoteMeanBatch"
            name: qsTr("Mean decode batch")
            value: panel.shown(panel.remote.meanDecodeBatch,
                                qsTr("%1 sequences").arg(Number(panel.remote.meanDecodeBatch).toFixed(2)))
        }
        StatRow {
            objectName: "remoteBatchedSteps"
            name: qsTr("Batched steps")
            value: panel.shown(panel.remote.batchedStepFraction,
                                (panel.remote.batchedStepFraction * 100).toFixed(0) + " %")
        }
        StatRow {
            name: qsTr("Preemptions")
            value: panel.shown(panel.remote.preemptions, Math.round(panel.remote.preemptions))
        }
    }
    Label {
        Layout.fillWidth: true
        visible: panel.remote.error !== undefined && panel.remote.error !== ""
        wrapMode: Text.Wrap
        color: Theme.warning
        font.pixelSize: Theme.smallFontSize
        text: panel.remote.error !== undefined ? qsTr("Metrics unavailable: %1").arg(panel.remote.error) : ""
    }
}
