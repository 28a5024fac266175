// Theme: every colour and size the window uses, for light and dark. One singleton; the
// scheme follows the system palette unless `preference` says otherwise.
pragma Singleton
import QtQuick

QtObject {
    id: theme

    // "system", "light" or "dark".
    property string preference: "system"
    readonly property SystemPalette systemPalette: SystemPalette { colorGroup: SystemPalette.Active }
    readonly property bool dark: preference === "dark"
                                 || (preference === "system" && systemPalette.window.hslLightness < 0.5)

    // Surfaces
    readonly property color window: dark ? "#16171a" : "#f6f7f9"
    readonly property color surface: dark ? "#1e2024" : "#ffffff"
    readonly property color sidebar: dark ? "#121316" : "#eceef2"
    readonly property color raised: dark ? "#26292e" : "#f0f2f5"
    readonly property color border: dark ? "#30333a" : "#d8dce2"
    readonly property color hover: dark ? "#2a2d33" : "#e2e6ec"
    readonly property color selection: dark ? "#2b3a5c" : "#d9e4fb"
    // Text
    readonly property color text: dark ? "#e7e8eb" : "#1b1d21"
    readonly property color mutedText: dark ? "#9ba1aa" : "#5f6672"
    readonly property color accent: dark ? "#6e9dff" : "#2f62d6"
    readonly property color accentText: "#ffffff"
    // Links: lighter than the accent on dark surfaces, so they read on navy and grey alike.
    readonly property color link: dark ? "#8ab4ff" : "#1f57c3"
    // Messages
    readonly property color userBubble: dark ? "#233150" : "#e4ecfc"
    readonly property color assistantBubble: surface
    readonly property color codeBackground: dark ? "#0f1012" : "#f2f4f7"
    readonly property color codeText: dark ? "#d6dae0" : "#24292f"
    readonly property color codeHeader: dark ? "#1a1c20" : "#e8ebf0"
    readonly property color inlineCode: dark ? "#2e323a" : "#e8ebf0"
    // Behind a modal dialog.
    readonly property color dim: dark ? "#99000000" : "#66000000"
    // States
    readonly property color generating: dark ? "#4cc38a" : "#1f9d5c"
    readonly property color errorBackground: dark ? "#3a1e1f" : "#fdecec"
    readonly property color errorText: dark ? "#ffb4ab" : "#a4262c"
    readonly property color warning: dark ? "#f2c14e" : "#9a6700"

    // The memory ledger's categories, the same in every plot and legend
    // (order of TelemetryModel.ledgerCategories).
    readonly property color weights: "#4c8bf5"
    readonly property color staging: "#a970ff"
    readonly property color kv: "#27b376"
    // Pooled KV granules (created, not mapped yet): the KV green, paler, so the pool reads
    // as KV room held in reserve right above the KV in use.
    readonly property color kvPool: dark ? "#7cc9a4" : "#a3dec1"
    readonly property color workspace: "#f0a030"
    readonly property color graphs: "#e05d9b"
    readonly property color other: "#8a8f98"
    // Recurrent layers' state slots (Qwen3.5): fixed per chat, beside the KV that grows.
    readonly property color recurrentState: dark ? "#4fc3d9" : "#1f9bb0"
    readonly property list<color> ledgerColors: [weights, staging, kv, kvPool, workspace, graphs, other, recurrentState]
    readonly property list<string> ledgerNames: ["weights", "staging", "KV", "KV pool", "workspace", "graphs", "other", "recurrent state"]
    readonly property color budgetLine: dark ? "#ff6b6b" : "#d93636"
    readonly property color throughput: "#27b376"
    // Weight streaming: a layer kept in device memory reads as the weights, a streamed one
    // as the staging ring it passes through; the measured PCIe bandwidth is the ceiling line.
    readonly property color residentLayer: weights
    readonly property color streamedLayer: staging
    readonly property color pcieLine: dark ? "#f2c14e" : "#b07800"
    readonly property color gridLine: dark ? "#33ffffff" : "#22000000"

    // Spacing scale (4-pixel steps): every margin and gap in the window is one of these.
    readonly property int spacingSmall: 4
    readonly property int spacing: 8
    readonly property int padding: 12
    readonly property int spacingLarge: 16
    readonly property int spacingXLarge: 24
    readonly property int radius: 8
    // Below these window widths the memory dock, then the sidebar, fold away so the
    // conversation and the model bar keep their room (the minimum window is 900 px).
    readonly property int dockFoldWidth: 1180
    readonly property int sidebarFoldWidth: 980
    readonly property int sidebarWidth: 260
    readonly property int dockWidth: 330
    readonly property int contentMaxWidth: 820
    readonly property int fontSize: 14
    readonly property int smallFontSize: 12
    readonly property int titleFontSize: 16
    readonly property int headingFontSize: 20
    readonly property int dialogWidth: 520
    readonly property int plotHeight: 96
    readonly property string monoFamily: "DejaVu Sans Mono"
}
