// McpServersSection: Settings' MCP servers — each a stdio command (with its environment) or a
// streamable-HTTP URL, enabled or not, with its state and tools; a form adds one. The chats
// offer the enabled servers' tools to the model, and every call asks first.
pragma ComponentBehavior: Bound
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

ColumnLayout {
    id: section
    objectName: "mcpServersSection"
    property McpController mcp: null
    property string error: ""

    Layout.columnSpan: 2
    Layout.fillWidth: true
    spacing: Theme.spacing

    Label {
        Layout.fillWidth: true
        Layout.topMargin: Theme.spacingLarge
        text: qsTr("MCP servers")
        color: Theme.text
        font.pixelSize: Theme.titleFontSize
        font.weight: Font.DemiBold
    }
    Label {
        Layout.fillWidth: true
        wrapMode: Text.Wrap
        color: Theme.mutedText
        font.pixelSize: Theme.smallFontSize
        text: section.mcp && section.mcp.available
              ? qsTr("Tools from Model Context Protocol servers: a command the window starts (stdio) or a URL (streamable HTTP). The model sees the enabled servers' tools; each call is shown and runs only when you allow it.")
              : qsTr("This build has no MCP client.")
    }
    Repeater {
        model: section.mcp ? section.mcp.servers : []
        delegate: Rectangle {
            id: row
            required property var modelData
            required property int index
            Layout.fillWidth: true
            implicitHeight: rowColumn.implicitHeight + 2 * Theme.spacing
            radius: Theme.radius
            color: Theme.raised
            border.color: Theme.border
            ColumnLayout {
                id: rowColumn
                anchors.fill: parent
                anchors.margins: Theme.spacing
                spacing: Theme.spacingSmall
                RowLayout {
                    Layout.fillWidth: true
                    Rectangle {
                        implicitWidth: 10
                        implicitHeight: 10
                        radius: 5
                        color: row.modelData.status === "ready" ? Theme.generating
                             : row.modelData.status === "failed" ? Theme.errorText
                             : row.modelData.status === "connecting" ? Theme.warning : Theme.mutedText
                    }
                    Label {
                        Layout.fillWidth: true
                        text: row.modelData.name
                        color: Theme.text
                        font.pixelSize: Theme.fontSize
                        font.weight: Font.DemiBold
                        elide: Text.ElideRight
                    }
                    Switch {
                        id: enabledSwitch
                        objectName: "mcpEnabled_" + row.modelData.name
                        checked: row.modelData.enabled
                        onToggled: section.mcp.setServerEnabled(row.index, enabledSwitch.checked)
                    }
                    Button {
                        text: qsTr("Reconnect")
                        enabled: row.modelData.enabled
                        onClicked: section.mcp.reconnect(row.index)
                    }
                    Button {
                        text: qsTr("Remove")
                        onClicked: section.mcp.removeServer(row.index)
                    }
                }
                Label {
                    Layout.fillWidth: true
                    text: row.modelData.url.length > 0 ? row.modelData.url : row.modelData.command
                    color: Theme.mutedText
                    font.family: Theme.monoFamily
                    font.pixelSize: Theme.smallFontSize
                    elide: Text.ElideMiddle
                }
                Label {
                    Layout.fillWidth: true
                    wrapMode: Text.Wrap
                    font.pixelSize: Theme.smallFontSize
                    color: row.modelData.status === "failed" ? Theme.errorText : Theme.mutedText
                    text: row.modelData.status === "ready"
                          ? qsTr("%n tool(s): %1", "", row.modelData.tools.length).arg(row.modelData.tools.join(", "))
                          : row.modelData.status === "failed" ? row.modelData.error
                          : row.modelData.status === "connecting" ? qsTr("Connecting…") : qsTr("Off")
                }
            }
        }
    }
    GridLayout {
        visible: section.mcp !== null && section.mcp.available
        Layout.fillWidth: true
        columns: 2
        columnSpacing: Theme.spacing
        rowSpacing: Theme.spacingSmall
        Label { text: qsTr("Name"); color: Theme.text; font.pixelSize: Theme.fontSize }
        TextField {
            id: nameField
            objectName: "mcpNameField"
            Layout.fillWidth: true
            placeholderText: qsTr("files")
        }
        Label { text: qsTr("Command"); color: Theme.text; font.pixelSize: Theme.fontSize }
        TextField {
            id: commandField
            objectName: "mcpCommandField"
            Layout.fillWidth: true
            font.family: Theme.monoFamily
            placeholderText: qsTr("npx -y @modelcontextprotocol/server-filesystem ~/notes")
        }
        Label { text: qsTr("Environment"); color: Theme.text; font.pixelSize: Theme.fontSize }
        TextArea {
            id: envField
            objectName: "mcpEnvField"
            Layout.fillWidth: true
            Layout.preferredHeight: 48
            font.family: Theme.monoFamily
            placeholderText: qsTr("KEY=value, one a line")
            background: Rectangle { radius: 6; color: Theme.raised; border.color: Theme.border }
        }
        Label { text: qsTr("or URL"); color: Theme.text; font.pixelSize: Theme.fontSize }
        TextField {
            id: urlField
            objectName: "mcpUrlField"
            Layout.fillWidth: true
            font.family: Theme.monoFamily
            placeholderText: "http://127.0.0.1:8000/mcp"
        }
        Item { implicitWidth: 1 }
        RowLayout {
            Button {
                objectName: "mcpAddButton"
                text: qsTr("Add server")
                onClicked: {
                    section.error = section.mcp.addServer(nameField.text, commandField.text,
                                                          envField.text, urlField.text)
                    if (section.error.length === 0) {
                        nameField.text = ""
                        commandField.text = ""
                        envField.text = ""
                        urlField.text = ""
                    }
                }
            }
            Label {
                objectName: "mcpAddError"
                Layout.fillWidth: true
                visible: section.error.length > 0
                text: section.error
                color: Theme.errorText
                font.pixelSize: Theme.smallFontSize
                elide: Text.ElideRight
            }
        }
    }
}
