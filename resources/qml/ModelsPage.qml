// ModelsPage: the GGUF files in the models folders — name, size, block type and how each
// fits the memory budget at the configured context — with Load on each, the folder to
// look in, and Open file… for a GGUF elsewhere (the dialog starts in the models folder).
pragma ComponentBehavior: Bound
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Dialogs
import QtQuick.Layouts

GranuleDialog {
    id: page
    required property ModelController model
    required property HubController hub
    signal openFileRequested()
    signal downloadRequested()

    title: qsTr("Models")
    width: Math.min(720, parent ? parent.width - 2 * Theme.spacingXLarge : 720)
    height: Math.min(560, parent ? parent.height - 2 * Theme.spacingXLarge : 560)
    standardButtons: Dialog.Close
    onAboutToShow: page.model.refreshLibrary()

    ColumnLayout {
        anchors.fill: parent
        spacing: Theme.padding

        RowLayout {
            Layout.fillWidth: true
            spacing: Theme.spacing
            Label {
                Layout.fillWidth: true
                elide: Text.ElideMiddle
                color: Theme.mutedText
                font.pixelSize: Theme.smallFontSize
                text: qsTr("Looking in %1").arg(page.model.library.foldersText)
            }
            Button {
                text: qsTr("Folder…")
                font.pixelSize: Theme.fontSize
                onClicked: folderDialog.open()
                ToolTip.visible: hovered
                ToolTip.text: qsTr("Also list the GGUF files of another folder")
            }
            Button {
                objectName: "downloadButton"
                text: qsTr("Download…")
                font.pixelSize: Theme.fontSize
                visible: page.hub.available
                onClicked: page.downloadRequested()
                ToolTip.visible: hovered
                ToolTip.text: qsTr("Find models on the Hugging Face Hub, see how they fit before downloading")
            }
            PrimaryButton {
                objectName: "openFileButton"
                text: qsTr("Open file…")
                onClicked: page.openFileRequested()
            }
        }

        RemoteEndpointRow {
            Layout.fillWidth: true
            model: page.model
            onOpened: page.close()
        }

        Rectangle {
            Layout.fillWidth: true
            Layout.fillHeight: true
            radius: Theme.radius
            color: Theme.window
            border.color: Theme.border

            ListView {
                id: list
                objectName: "modelList"
                anchors.fill: parent
                anchors.margins: 1
                clip: true
                model: page.model.library
                ScrollBar.vertical: ScrollBar {}
                delegate: Rectangle {
                    id: row
                    required property int index
                    required property string path
                    required property string name
                    required property string fileName
                    required property double fileBytes
                    required property string blockType
                    required property string architecture
                    required property string details
                    required property bool readable
                    required property bool fits
                    required property bool loads
                    required property string fitText
                    readonly property bool loaded: page.model.ready && page.model.modelPath === path
                    width: ListView.view.width
                    implicitHeight: rowLayout.implicitHeight + 2 * Theme.padding
                    color: rowHover.hovered ? Theme.hover : "transparent"
                    HoverHandler { id: rowHover }

                    RowLayout {
                        id: rowLayout
                        anchors.fill: parent
                        anchors.leftMargin: Theme.spacingLarge
                        anchors.rightMargin: Theme.padding
                        spacing: Theme.padding
                        ColumnLayout {
                            Layout.fillWidth: true
                            spacing: 2
                            Label {
                                Layout.fillWidth: true
                                elide: Text.ElideRight
                                text: row.name
                                color: Theme.text
                                font.pixelSize: Theme.fontSize
                                font.weight: Font.DemiBold
                            }
                            Label {
                                Layout.fillWidth: true
                                elide: Text.ElideMiddle
                                text: row.details
                                color: Theme.mutedText
                                font.pixelSize: Theme.smallFontSize
                            }
                        }
                        Label {
                            Layout.maximumWidth: 220
                            elide: Text.ElideRight
                            text: row.fitText
                            color: !row.readable || !row.loads ? Theme.errorText
                                   : row.fits ? Theme.generating : Theme.warning
                            font.pixelSize: Theme.smallFontSize
                        }
                        Button {
                            Layout.preferredWidth: 88
                            text: row.loaded ? qsTr("Loaded") : qsTr("Load")
                            enabled: !row.loaded && row.readable && row.loads
                                     && page.model.status !== ModelController.Loading
                            font.pixelSize: Theme.fontSize
                            onClicked: {
                                page.model.load(row.path)
                                page.close()
                            }
                        }
                    }
                    Rectangle {
                        anchors.bottom: parent.bottom
                        width: parent.width
                        height: 1
                        color: Theme.border
                        visible: row.index < list.count - 1
                    }
                }
            }
            Label {
                anchors.centerIn: parent
                width: parent.width - 2 * Theme.spacingXLarge
                visible: list.count === 0
                horizontalAlignment: Text.AlignHCenter
                wrapMode: Text.Wrap
                color: Theme.mutedText
                font.pixelSize: Theme.fontSize
                text: qsTr("No GGUF files here yet. Put models in %1, choose another folder, or open a file.")
                      .arg(page.model.defaultModelsFolder)
            }
        }
    }

    FolderDialog {
        id: folderDialog
        title: qsTr("A folder of GGUF models")
        currentFolder: page.model.modelsFolderUrl
        onAccepted: page.model.setModelsFolderUrl(selectedFolder)
    }
}
