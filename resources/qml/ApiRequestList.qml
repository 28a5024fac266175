// ApiRequestList: the sidebar's "API requests" section while the window serves the OpenAI
// API — the server's state and URL (or its error), then each request in flight, read-only:
// its id, endpoint, prompt and generated tokens, state and KV.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

ColumnLayout {
    id: section
    required property ApiServerController server
    readonly property bool serving: server.state === ApiServerController.Serving
    readonly property bool failed: server.state === ApiServerController.Failed

    objectName: "apiRequestList"
    spacing: Theme.spacingSmall

    Rectangle {
        Layout.fillWidth: true
        implicitHeight: 1
        color: Theme.border
    }
    RowLayout {
        Layout.fillWidth: true
        Layout.topMargin: Theme.spacingSmall
        spacing: Theme.spacing
        Rectangle {
            implicitWidth: 8
            implicitHeight: 8
            radius: 4
            color: section.serving ? Theme.generating : section.failed ? Theme.errorText : "transparent"
            border.color: section.serving ? Theme.generating : section.failed ? Theme.errorText : Theme.mutedText
            border.width: 1
        }
        Label {
            Layout.fillWidth: true
            text: qsTr("API requests")
            color: Theme.text
            font.pixelSize: Theme.smallFontSize
            font.weight: Font.DemiBold
        }
        Label {
            visible: section.server.runningRequests > 0
            text: section.server.runningRequests.toString()
            color: Theme.mutedText
            font.pixelSize: Theme.smallFontSize
        }
    }
    Label {
        objectName: "apiStatus"
        Layout.fillWidth: true
        text: section.server.statusText
        wrapMode: Text.Wrap
        maximumLineCount: 3
        elide: Text.ElideRight
        color: section.failed ? Theme.errorText : Theme.mutedText
        font.pixelSize: Theme.smallFontSize
    }
    Label {
        Layout.fillWidth: true
        visible: section.server.hostExposed && !section.failed
        text: qsTr("Listening beyond this machine: other computers can use the model.")
        wrapMode: Text.Wrap
        color: Theme.warning
        font.pixelSize: Theme.smallFontSize
    }

    ListView {
        id: rows
        readonly property real rowHeight: 40
        Layout.fillWidth: true
        // Up to three rows show; more scroll, so the chats keep the sidebar.
        Layout.preferredHeight: Math.min(contentHeight, 3.5 * rowHeight)
        visible: count > 0
        clip: true
        spacing: 2
        interactive: contentHeight > height
        boundsBehavior: Flickable.StopAtBounds
        model: section.server.requests
        ScrollBar.vertical: ScrollBar {}
        delegate: Rectangle {
            id: row
            required property string requestId
            required property string endpoint
            required property bool stream
            required property double promptTokens
            required property double completionTokens
            required property string requestState
            required property double kvCommittedBytes
            width: ListView.view ? ListView.view.width : 0
            implicitHeight: 40  // rows.rowHeight
            radius: Theme.radius
            color: Theme.raised
            ColumnLayout {
                anchors.fill: parent
                anchors.leftMargin: Theme.spacing
                anchors.rightMargin: Theme.spacing
                spacing: 0
                RowLayout {
                    Layout.fillWidth: true
                    spacing: Theme.spacing
                    Label {
                        Layout.fillWidth: true
                        text: row.requestId
                        elide: Text.ElideMiddle
                        color: Theme.text
                        font.pixelSize: Theme.smallFontSize
                        font.family: Theme.monoFamily
                    }
                    Label {
                        text: row.requestState
                        color: row.requestState === "waiting" ? Theme.warning
                               : row.requestState === "generating" ? Theme.generating : Theme.mutedText
                        font.pixelSize: Theme.smallFontSize
                    }
                }
                Label {
                    Layout.fillWidth: true
                    elide: Text.ElideRight
                    // The endpoint, prompt → generated tokens, the KV it holds.
                    text: qsTr("%1 · %2 → %3 tok · KV %4")
                              .arg(row.endpoint === "chat" ? qsTr("chat") : qsTr("completion"))
                              .arg(Units.count(row.promptTokens))
                              .arg(Units.count(row.completionTokens))
                              .arg(Units.bytes(row.kvCommittedBytes))
                    color: Theme.mutedText
                    font.pixelSize: Theme.smallFontSize
                    HoverHandler {
                        id: figuresHover
                    }
                    ToolTip.visible: figuresHover.hovered
                    ToolTip.text: qsTr("%1 (%2): %3 prompt tokens, %4 generated, %5 of KV")
                                      .arg(row.endpoint === "chat" ? "/v1/chat/completions" : "/v1/completions")
                                      .arg(row.stream ? qsTr("streamed") : qsTr("one response"))
                                      .arg(Units.count(row.promptTokens))
                                      .arg(Units.count(row.completionTokens))
                                      .arg(Units.bytes(row.kvCommittedBytes))
                }
            }
        }
    }
}
