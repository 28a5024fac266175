// ChatView: the open chat's messages, following the newest while it streams. Its header
// holds the chat's title, where it runs (EngineMenuButton), the tokens-used / context meter
// and the export menu.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Dialogs
import QtQuick.Layouts

ListView {
    id: view
    objectName: "chatView"
    required property ChatController chats
    required property TelemetryModel telemetry
    required property EndpointsController endpoints
    // Tokens of context each chat has (the loaded model's); 0 hides the meter.
    property int contextLength: 0
    // A chat on an endpoint: its model's context as the server lists it (0: the server does
    // not say, and the meter shows the tokens alone, from the server's usage counts).
    readonly property bool remote: chats.currentEngine.length > 0
    readonly property int shownContextLength: remote
        ? (endpoints.engineChoices.length >= 0 ? endpoints.contextOf(chats.currentEngine) : 0)
        : contextLength
    // Why the open chat's answer has not started: "slot", "memory" or "".
    readonly property string waitingReason: telemetry.frame.scheduler.waiting > 0
                                            ? telemetry.waitingReason(chats.currentChatId) : ""
    readonly property int contextTokens: chats.messages.contextTokens
    // Follow the bottom unless the user scrolled up to read.
    property bool following: true

    model: chats.messages
    clip: true
    spacing: Theme.padding
    topMargin: Theme.padding
    bottomMargin: Theme.padding
    boundsBehavior: Flickable.StopAtBounds
    ScrollBar.vertical: ScrollBar {}

    headerPositioning: ListView.OverlayHeader
    header: Rectangle {
        id: header
        objectName: "chatHeader"
        readonly property ChatView chat: ListView.view as ChatView
        z: 2
        width: ListView.view.width
        implicitHeight: headerRow.implicitHeight + 2 * Theme.spacing
        color: Theme.window
        Rectangle { anchors.bottom: parent.bottom; width: parent.width; height: 1; color: Theme.border }
        RowLayout {
            id: headerRow
            anchors.fill: parent
            anchors.leftMargin: Theme.padding
            anchors.rightMargin: Theme.padding
            spacing: Theme.spacing
            Label {
                Layout.fillWidth: true
                elide: Text.ElideRight
                text: header.chat.chats.currentTitle
                color: Theme.text
                font.pixelSize: Theme.fontSize
                font.weight: Font.DemiBold
            }
            EngineMenuButton {
                chats: header.chat.chats
                endpoints: header.chat.endpoints
            }
            // Tokens used / context: the last reply's prompt plus its tokens.
            ColumnLayout {
                visible: header.chat.shownContextLength > 0 || (header.chat.remote && header.chat.contextTokens > 0)
                spacing: 2
                Label {
                    objectName: "contextMeterLabel"
                    Layout.alignment: Qt.AlignRight
                    text: header.chat.shownContextLength > 0
                          ? qsTr("%1 / %2 tokens").arg(header.chat.contextTokens.toLocaleString(Qt.locale(), "f", 0))
                                                  .arg(header.chat.shownContextLength.toLocaleString(Qt.locale(), "f", 0))
                          : qsTr("%1 tokens").arg(header.chat.contextTokens.toLocaleString(Qt.locale(), "f", 0))
                    color: Theme.mutedText
                    font.pixelSize: Theme.smallFontSize
                }
                Rectangle {
                    visible: header.chat.shownContextLength > 0
                    Layout.preferredWidth: 140
                    implicitHeight: 4
                    radius: 2
                    color: Theme.raised
                    Rectangle {
                        readonly property real share: header.chat.shownContextLength > 0
                                                      ? Math.min(1, header.chat.contextTokens / header.chat.shownContextLength) : 0
                        width: parent.width * share
                        height: parent.height
                        radius: 2
                        color: share > 0.9 ? Theme.warning : Theme.accent
                    }
                }
            }
            ToolButton {
                objectName: "exportButton"
                text: qsTr("Export ▾")
                font.pixelSize: Theme.smallFontSize
                onClicked: exportMenu.popup()
                Menu {
                    id: exportMenu
                    MenuItem {
                        text: qsTr("Export as Markdown…")
                        onTriggered: header.chat.openExport("markdown")
                    }
                    MenuItem {
                        text: qsTr("Export as JSON…")
                        onTriggered: header.chat.openExport("json")
                    }
                }
            }
        }
    }

    function openExport(format) {
        exportDialog.format = format
        exportDialog.open()
    }

    FileDialog {
        id: exportDialog
        property string format: "markdown"
        fileMode: FileDialog.SaveFile
        title: qsTr("Export the chat")
        nameFilters: format === "json" ? [qsTr("JSON (*.json)")] : [qsTr("Markdown (*.md)")]
        onAccepted: view.chats.exportChat(selectedFile, format)
    }

    delegate: MessageDelegate {
        width: Math.min(ListView.view.width - 2 * Theme.padding, Theme.contentMaxWidth)
        x: (ListView.view.width - width) / 2
        chats: (ListView.view as ChatView).chats
        waitingReason: (ListView.view as ChatView).waitingReason
        isLast: index === ListView.view.count - 1
    }

    onMovementEnded: following = atYEnd
    onContentHeightChanged: if (following) positionViewAtEnd()
    onCountChanged: {
        following = true
        positionViewAtEnd()
    }
    Connections {
        target: view.chats
        function onCurrentChatChanged() {
            view.following = true
            view.positionViewAtEnd()
        }
    }
}
