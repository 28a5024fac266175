// ThinkingBlock: a reasoning model's reasoning above its answer — open while the model
// thinks, collapsed once the answer starts, with how long it thought and how much it wrote;
// a click opens or closes it.
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

ColumnLayout {
    id: block
    required property string reasoning
    required property double reasoningMs
    required property bool thinking  // still reasoning: no answer yet
    // Opened by hand, or following the model: open while it thinks.
    property bool expanded: thinking
    onThinkingChanged: expanded = thinking

    spacing: Theme.spacing / 2

    readonly property string caption: {
        const seconds = (reasoningMs / 1000).toFixed(1)
        const words = reasoning.split(/\s+/).filter(w => w.length > 0).length
        return thinking ? qsTr("Thinking… %1 s").arg(seconds)
                        : qsTr("Thought for %1 s · %2 words").arg(seconds).arg(words)
    }

    ToolButton {
        id: toggle
        objectName: "thinkingToggle"
        Layout.fillWidth: true
        implicitHeight: 24
        padding: 2
        contentItem: Label {
            text: (block.expanded ? "▾ " : "▸ ") + block.caption
            color: Theme.mutedText
            font.pixelSize: Theme.smallFontSize
            font.italic: block.thinking
            horizontalAlignment: Text.AlignLeft
            verticalAlignment: Text.AlignVCenter
        }
        background: Rectangle { radius: 4; color: toggle.hovered ? Theme.hover : "transparent" }
        onClicked: block.expanded = !block.expanded
    }

    // The reasoning itself: muted, behind a rule, selectable.
    RowLayout {
        Layout.fillWidth: true
        visible: block.expanded
        spacing: Theme.spacing
        Rectangle {
            Layout.fillHeight: true
            implicitWidth: 2
            color: Theme.border
        }
        TextEdit {
            objectName: "thinkingText"
            Layout.fillWidth: true
            readOnly: true
            selectByMouse: true
            wrapMode: TextEdit.Wrap
            textFormat: TextEdit.PlainText
            text: block.reasoning
            color: Theme.mutedText
            selectionColor: Theme.selection
            selectedTextColor: Theme.text
            font.pixelSize: Theme.smallFontSize
        }
    }
}
