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

    Shortcut { sequence: "Ctrl+N"; onActivated: window.chats.newChat() }
    Shortcut { sequence: "Ctrl+Q"; context: Qt.ApplicationShortcut; onActivated: Qt.quit() }
    Shortcut { sequence: "Ctrl+F"; onActivated: sidebar.focusSearch() }
    Shortcut { sequence: "Ctrl+,"; onActivated: settingsDialog.open() }
    Shortcut { sequence: "Esc"; enabled: window.chats.currentGenerating; onActivated: window.chats.stop() }

    RowLayout {
        anchors.fill: parent
        spacing: 0

        Sidebar {
            id: sidebar
            Layout.fillHeight: true
            Layout.preferredWidth: Theme.sidebarWidth
            chats: window.chats
            telemetry: window.telemetry
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
                onOpenRequested: fileDialog.open()
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
                    contextLength: window.model.contextPerChat
                }
                EmptyState {
                    anchors.fill: parent
                    visible: window.chats.messages.count === 0
                    chats: window.chats
                    model: window.model
                    onOpenRequested: fileDialog.open()
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
            Layout.fillHeight: true
            telemetry: window.telemetry
            expanded: window.settings.dockExpanded
            onToggled: window.settings.dockExpanded = !window.settings.dockExpanded
        }
    }

    FileDialog {
        id: fileDialog
        title: qsTr("Open a GGUF model")
        nameFilters: [qsTr("GGUF models (*.gguf)"), qsTr("All files (*)")]
        onAccepted: window.model.preview(selectedFile)
    }
    FitPreviewDialog { model: window.model }
    SettingsDialog {
        id: settingsDialog
        objectName: "settingsDialog"
        model: window.model
        settings: window.settings
        telemetry: window.telemetry
    }
    ChatSettingsDrawer { id: chatSettings; objectName: "chatSettings"; height: window.height; chats: window.chats }

    Binding {
        target: Theme
        property: "preference"
        value: window.settings.theme
    }

    Component.onCompleted: composer.focusInput()
}
