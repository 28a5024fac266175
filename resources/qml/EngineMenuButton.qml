// EngineMenuButton: where the open chat runs — the local engine or a model on an endpoint
// (Settings → Endpoints) — shown on the button and chosen from its menu. The choice is the
// chat's (saved with it) and applies from its next answer.
pragma ComponentBehavior: Bound
import QtQuick
import Granule
import QtQuick.Controls
import QtQml.Models

ToolButton {
    id: engineButton
    required property ChatController chats
    required property EndpointsController endpoints
    objectName: "engineButton"
    text: endpoints.engineLabel(chats.currentEngine) + "  ▾"
    font.pixelSize: Theme.smallFontSize
    ToolTip.visible: hovered
    ToolTip.text: qsTr("Where this chat runs: the local engine or a model on an endpoint")
    onClicked: {
        // Fresh model lists each time the menu opens (Settings → Endpoints has the details).
        engineButton.endpoints.refreshAll()
        menu.popup(engineButton, 0, engineButton.height)
    }

    Menu {
        id: menu
        objectName: "engineMenu"
        // Endpoint and model names are long: wide enough to read them whole.
        width: 380
        MenuItem {
            text: engineButton.endpoints.engineLabel("")
            checkable: true
            checked: engineButton.chats.currentEngine === ""
            onTriggered: engineButton.chats.currentEngine = ""
        }
        MenuSeparator { visible: engines.count > 0 }
        Instantiator {
            id: engines
            model: engineButton.endpoints.engineChoices
            delegate: MenuItem {
                required property var modelData
                text: modelData.label
                checkable: true
                checked: engineButton.chats.currentEngine === modelData.ref
                onTriggered: engineButton.chats.currentEngine = modelData.ref
            }
            onObjectAdded: (index, object) => menu.insertItem(index + 2, object)
            onObjectRemoved: (index, object) => menu.removeItem(object)
        }
        MenuItem {
            enabled: false
            visible: engines.count === 0
            height: visible ? implicitHeight : 0
            text: qsTr("No endpoint models: add endpoints in Settings")
        }
    }
}
