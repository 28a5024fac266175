// The Granule window: chats on the left, the conversation in the middle, the memory
// dock on the right. Holds no logic beyond layout and keys; the C++ services do the work.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Dialogs
import QtQuick.Layouts

ApplicationWindow {
    id: window
    required property ChatController chats
    required property ModelController model
    required property TelemetryModel telemetry
    required property ErrorReporter errors
    required property WindowSettings settings
    required property ApiServerController server
    required property HubController hub
    required property EndpointsController endpoints

    width: 1400
    height: 860
    minimumWidth: 900
    minimumHeight: 560
    visible: true
    title: model.ready ? qsTr("Granule — %1").arg(model.modelName) : qsTr("Granule")
    color: Theme.window

    palette.window: Theme.window
    palette.windowText: Theme.text
    palette.base: Theme.surface
    palette.alternateBase: Theme.raised
    palette.text: Theme.text
    palette.button: Theme.raised
    palette.buttonText: Theme.text
    palette.highlight: Theme.accent
    palette.highlightedText: Theme.accentText
    palette.placeholderText: Theme.mutedText
    palette.mid: Theme.border
    palette.light: Theme.surface
    palette.dark: Theme.border
    palette.toolTipBase: Theme.raised
    palette.toolTipText: Theme.text
    palette.link: Theme.link

    Shortcut { sequence: "Ctrl+N"; onActivated: window.chats.newChat() }
    Shortcut { sequence: "Ctrl+Q"; context: Qt.ApplicationShortcut; onActivated: Qt.quit() }
    Shortcut { sequence: "Ctrl+F"; onActivated: sidebar.focusSearch() }
    Shortcut { sequence: "Ctrl+,"; onActivated: settingsDialog.open() }
    Shortcut { sequence: "Ctrl+M"; onActivated: modelsPage.open() }
    Shortcut { sequence: "Esc"; enabled: window.chats.currentGenerating; onActivated: window.chats.stop() }

    RowLayout {
        anchors.fill: parent
        spacing: 0

        Sidebar {
            id: sidebar
            Layout.fillHeight: true
            // Narrower in a narrow window, so the conversation keeps its room.
            Layout.preferredWidth: window.width < Theme.sidebarFoldWidth ? 220 : Theme.sidebarWidth
            chats: window.chats
            telemetry: window.telemetry
            server: window.server
            onSettingsRequested: settingsDialog.open()
        }

        ColumnLayout {
            Layout.fillWidth: true
            Layout.fillHeight: true
            spacing: 0

            ModelBar {
                Layout.fillWidth: true
                model: window.model
                chats: window.chats
                endpoints: window.endpoints
                onModelsRequested: modelsPage.open()
                onChatSettingsRequested: chatSettings.open()
            }
            ErrorBanner {
                Layout.fillWidth: true
                errors: window.errors
            }
            Item {
                Layout.fillWidth: true
                Layout.fillHeight: true
                ChatView {
                    anchors.fill: parent
                    visible: window.chats.messages.count > 0
                    chats: window.chats
                    telemetry: window.telemetry
                    endpoints: window.endpoints
                    contextLength: window.model.contextPerChat
                }
                EmptyState {
                    anchors.fill: parent
                    visible: window.chats.messages.count === 0
                    chats: window.chats
                    model: window.model
                    endpoints: window.endpoints
                    onOpenRequested: modelsPage.open()
                }
            }
            Composer {
                id: composer
                Layout.fillWidth: true
                chats: window.chats
                model: window.model
            }
        }

        MemoryDock {
            id: dock
            // Below Theme.dockFoldWidth the dock folds to its strip; opening it there by hand
            // lasts until the window is wide again (the remembered choice is for wide windows).
            property bool openedWhileNarrow: false
            readonly property bool narrow: window.width < Theme.dockFoldWidth
            Layout.fillHeight: true
            telemetry: window.telemetry
            expanded: window.settings.dockExpanded && (!narrow || openedWhileNarrow)
            onNarrowChanged: openedWhileNarrow = false
            onToggled: {
                if (narrow) {
                    openedWhileNarrow = !expanded
                    if (!window.settings.dockExpanded) window.settings.dockExpanded = true
                } else {
                    window.settings.dockExpanded = !window.settings.dockExpanded
                }
            }
        }
    }

    FileDialog {
        id: fileDialog
        title: qsTr("Open a GGUF model")
        nameFilters: [qsTr("GGUF models (*.gguf)"), qsTr("All files (*)")]
        currentFolder: window.model.modelsFolderUrl
        onAccepted: window.model.preview(selectedFile)
    }
    ModelsPage {
        id: modelsPage
        objectName: "modelsPage"
        model: window.model
        hub: window.hub
        onOpenFileRequested: {
            close()
            fileDialog.open()
        }
        onDownloadRequested: {
            close()
            hubPage.open()
        }
    }
    HubPage {
        id: hubPage
        objectName: "hubPage"
        hub: window.hub
    }
    FitPreviewDialog { model: window.model }
    SettingsDialog {
        id: settingsDialog
        objectName: "settingsDialog"
        model: window.model
        settings: window.settings
        telemetry: window.telemetry
        server: window.server
        endpoints: window.endpoints
        mcp: window.chats.tools
    }
    ChatSettingsDrawer {
        id: chatSettings
        objectName: "chatSettings"
        height: window.height
        chats: window.chats
        reasoningFormat: window.model.reasoningFormat
    }

    Binding {
        target: Theme
        property: "preference"
        value: window.settings.theme
    }

    // The window opens where and as large as it was left (WindowSettings), and says so on close.
    onClosing: window.settings.saveGeometry(x, y, width, height, visibility === Window.Maximized)
    Component.onCompleted: {
        const g = window.settings.geometry
        if (g.width > 0 && g.height > 0) {
            window.x = g.x
            window.y = g.y
            window.width = g.width
            window.height = g.height
        }
        if (window.settings.maximized) window.visibility = Window.Maximized
        composer.focusInput()
    }
}
