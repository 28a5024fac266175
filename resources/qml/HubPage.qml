// HubPage: models from the Hugging Face Hub — search GGUF repositories (most downloaded or
// most recent, with the architecture and whether Granule runs it), a repository's quants
// with the fit of each read from its header before anything is downloaded (the largest that
// fits recommended, what streaming costs for the rest), and the download queue with
// progress, pause, resume, cancel and Load.
pragma ComponentBehavior: Bound
import QtQuick
import Granule
import QtQuick.Controls
import QtQuick.Layouts

GranuleDialog {
    id: page
    required property HubController hub

    title: qsTr("Download models")
    width: Math.min(1100, parent ? parent.width - 2 * Theme.spacingXLarge : 1100)
    height: Math.min(760, parent ? parent.height - 2 * Theme.spacingXLarge : 760)
    standardButtons: Dialog.Close

    function duration(seconds: double): string {
        if (seconds < 0) return "--:--"
        const s = Math.round(seconds)
        const mm = Math.floor(s / 60) % 60, ss = s % 60, hh = Math.floor(s / 3600)
        return (hh > 0 ? hh + ":" + (mm < 10 ? "0" : "") : "") + mm + ":" + (ss < 10 ? "0" : "") + ss
    }

    ColumnLayout {
        anchors.fill: parent
        spacing: Theme.padding

        RowLayout {
            Layout.fillWidth: true
            spacing: Theme.spacing
            TextField {
                id: query
                objectName: "hubQuery"
                Layout.fillWidth: true
                placeholderText: qsTr("Search GGUF models on %1").arg(page.hub.endpoint)
                font.pixelSize: Theme.fontSize
                onAccepted: page.hub.search(text, sort.currentIndex === 1)
            }
            ComboBox {
                id: sort
                Layout.preferredWidth: 180
                model: [qsTr("Most downloaded"), qsTr("Most recent")]
                font.pixelSize: Theme.fontSize
                onActivated: if (query.text.length > 0) page.hub.search(query.text, currentIndex === 1)
            }
            PrimaryButton {
                objectName: "hubSearchButton"
                text: qsTr("Search")
                onClicked: page.hub.search(query.text, sort.currentIndex === 1)
            }
            Button {
                text: page.hub.tokenSource === "none" ? qsTr("Token…") : qsTr("Token ✓")
                font.pixelSize: Theme.fontSize
                onClicked: tokenDialog.open()
                ToolTip.visible: hovered
                ToolTip.text: page.hub.tokenSource === "keychain" ? qsTr("A Hub token is in the system keychain")
                              : page.hub.tokenSource === "HF_TOKEN" ? qsTr("The Hub token comes from HF_TOKEN")
                              : page.hub.tokenSource === "session" ? qsTr("A Hub token is kept until Granule closes (no keychain)")
                              : qsTr("For gated and private repositories: a Hub access token")
            }
        }

        Label {
            objectName: "hubStatus"
            Layout.fillWidth: true
            elide: Text.ElideRight
            text: (page.hub.busy ? "⏳ " : "") + page.hub.status
            color: Theme.mutedText
            font.pixelSize: Theme.smallFontSize
        }

        RowLayout {
            Layout.fillWidth: true
            Layout.fillHeight: true
            spacing: Theme.padding

            // Search results
            Rectangle {
                Layout.preferredWidth: 380
                Layout.fillHeight: true
                radius: Theme.radius
                color: Theme.window
                border.color: Theme.border
                ListView {
                    id: repos
                    objectName: "hubRepos"
                    anchors.fill: parent
                    anchors.margins: 1
                    clip: true
                    model: page.hub.searchResults
                    ScrollBar.vertical: ScrollBar {}
                    delegate: Rectangle {
                        id: repoRow
                        required property int index
                        required property string repo
                        required property double downloads
                        required property string updated
                        required property string architecture
                        required property bool supported
                        required property bool gated
                        width: ListView.view.width
                        implicitHeight: repoColumn.implicitHeight + 2 * Theme.padding
                        color: page.hub.repo === repo ? Theme.hover : repoHover.hovered ? Theme.hover : "transparent"
                        HoverHandler { id: repoHover }
                        TapHandler { onTapped: page.hub.openRepo(repoRow.repo) }
                        ColumnLayout {
                            id: repoColumn
                            anchors.fill: parent
                            anchors.margins: Theme.padding
                            spacing: 2
                            Label {
                                Layout.fillWidth: true
                                elide: Text.ElideMiddle
                                text: repoRow.repo
                                color: Theme.text
                                font.pixelSize: Theme.fontSize
                                font.weight: Font.DemiBold
                            }
                            Label {
                                Layout.fillWidth: true
                                elide: Text.ElideRight
                                text: qsTr("%1 downloads · %2 · %3").arg(Units.count(repoRow.downloads))
                                          .arg(repoRow.updated).arg(repoRow.architecture || qsTr("architecture unknown"))
                                      + (repoRow.gated ? qsTr(" · gated") : "")
                                color: Theme.mutedText
                                font.pixelSize: Theme.smallFontSize
                            }
                            Label {
                                text: repoRow.supported ? qsTr("Granule runs it") : qsTr("not supported by Granule")
                                color: repoRow.supported ? Theme.generating : Theme.errorText
                                font.pixelSize: Theme.smallFontSize
                            }
                        }
                    }
                }
                Label {
                    anchors.centerIn: parent
                    width: parent.width - 2 * Theme.spacingXLarge
                    visible: repos.count === 0
                    horizontalAlignment: Text.AlignHCenter
                    wrapMode: Text.Wrap
                    color: Theme.mutedText
                    font.pixelSize: Theme.fontSize
                    text: qsTr("Search for a model by name: Llama, Qwen, Mistral…")
                }
            }

            // The repository's quants and their fit
            Rectangle {
                Layout.fillWidth: true
                Layout.fillHeight: true
                radius: Theme.radius
                color: Theme.window
                border.color: Theme.border
                ListView {
                    id: quants
                    objectName: "hubQuants"
                    anchors.fill: parent
                    anchors.margins: 1
                    clip: true
                    model: page.hub.quants
                    ScrollBar.vertical: ScrollBar {}
                    delegate: Rectangle {
                        id: quantRow
                        required property int index
                        required property string label
                        required property string fileName
                        required property int parts
                        required property double sizeBytes
                        required property string blockMix
                        required property string fitText
                        required property string streamText
                        required property bool fitted
                        required property bool fits
                        required property bool loads
                        required property bool recommended
                        required property bool cached
                        required property double headerBytes
                        width: ListView.view.width
                        implicitHeight: quantLayout.implicitHeight + 2 * Theme.padding
                        color: recommended ? Qt.rgba(0.2, 0.7, 0.4, 0.12) : "transparent"
                        RowLayout {
                            id: quantLayout
                            anchors.fill: parent
                            anchors.margins: Theme.padding
                            spacing: Theme.padding
                            ColumnLayout {
                                Layout.fillWidth: true
                                spacing: 2
                                Label {
                                    Layout.fillWidth: true
                                    elide: Text.ElideRight
                                    text: quantRow.label + "  ·  " + Units.bytes(quantRow.sizeBytes)
                                          + (quantRow.parts > 1 ? qsTr("  ·  %1 files").arg(quantRow.parts) : "")
                                          + (quantRow.recommended ? qsTr("  ·  ★ recommended") : "")
                                    color: Theme.text
                                    font.pixelSize: Theme.fontSize
                                    font.weight: Font.DemiBold
                                }
                                Label {
                                    Layout.fillWidth: true
                                    elide: Text.ElideRight
                                    visible: quantRow.fitted
                                    text: quantRow.blockMix + qsTr("  ·  header %1").arg(Units.bytes(quantRow.headerBytes))
                                    color: Theme.mutedText
                                    font.pixelSize: Theme.smallFontSize
                                }
                                Label {
                                    Layout.fillWidth: true
                                    wrapMode: Text.WordWrap
                                    text: quantRow.fitText
                                    color: !quantRow.fitted ? Theme.mutedText
                                           : !quantRow.loads ? Theme.errorText
                                           : quantRow.fits ? Theme.generating : Theme.warning
                                    font.pixelSize: Theme.smallFontSize
                                }
                                Label {
                                    Layout.fillWidth: true
                                    visible: quantRow.streamText.length > 0
                                    wrapMode: Text.WordWrap
                                    text: quantRow.streamText
                                    color: Theme.mutedText
                                    font.pixelSize: Theme.smallFontSize
                                }
                            }
                            Button {
                                Layout.preferredWidth: 110
                                // In the cache already (downloaded here or by huggingface_hub):
                                // loaded from there, not fetched again.
                                text: quantRow.cached ? qsTr("Load") : qsTr("Download")
                                enabled: !quantRow.cached || quantRow.loads
                                font.pixelSize: Theme.fontSize
                                ToolTip.visible: hovered && quantRow.cached
                                ToolTip.text: qsTr("Already in %1").arg(page.hub.cacheFolder)
                                onClicked: {
                                    if (quantRow.cached) {
                                        page.hub.loadCached(quantRow.index)
                                        page.close()
                                    } else {
                                        page.hub.download(quantRow.index)
                                    }
                                }
                            }
                        }
                        Rectangle {
                            anchors.bottom: parent.bottom
                            width: parent.width
                            height: 1
                            color: Theme.border
                        }
                    }
                }
                Label {
                    anchors.centerIn: parent
                    width: parent.width - 2 * Theme.spacingXLarge
                    visible: quants.count === 0
                    horizontalAlignment: Text.AlignHCenter
                    wrapMode: Text.Wrap
                    color: Theme.mutedText
                    font.pixelSize: Theme.fontSize
                    text: qsTr("Pick a repository: its quantisations appear here with how each fits this machine, read from the files' headers before downloading.")
                }
            }
        }

        Label {
            visible: downloadList.count > 0
            text: qsTr("Downloads — into %1").arg(page.hub.cacheFolder)
            color: Theme.mutedText
            font.pixelSize: Theme.smallFontSize
            elide: Text.ElideMiddle
            Layout.fillWidth: true
        }
        ListView {
            id: downloadList
            objectName: "hubDownloads"
            Layout.fillWidth: true
            Layout.preferredHeight: Math.min(contentHeight, 150)
            visible: count > 0
            clip: true
            model: page.hub.downloads
            delegate: RowLayout {
                id: dl
                required property int index
                required property string repo
                required property string label
                required property string fileName
                required property double doneBytes
                required property double totalBytes
                required property double bytesPerSecond
                required property double etaSeconds
                required property string state
                required property string detail
                required property string path
                width: ListView.view.width
                spacing: Theme.padding
                Label {
                    Layout.preferredWidth: 260
                    elide: Text.ElideMiddle
                    text: dl.repo + " · " + dl.label
                    color: Theme.text
                    font.pixelSize: Theme.smallFontSize
                }
                ProgressBar {
                    Layout.fillWidth: true
                    from: 0
                    to: Math.max(1, dl.totalBytes)
                    value: dl.doneBytes
                }
                Label {
                    Layout.preferredWidth: 330
                    elide: Text.ElideRight
                    text: dl.state === "downloading"
                          ? qsTr("%1 / %2 · %3 · ETA %4").arg(Units.bytes(dl.doneBytes)).arg(Units.bytes(dl.totalBytes))
                                .arg(Units.rate(dl.bytesPerSecond)).arg(page.duration(dl.etaSeconds))
                          : dl.state + (dl.detail.length > 0 ? ": " + dl.detail : "")
                    color: dl.state === "failed" ? Theme.errorText : Theme.mutedText
                    font.pixelSize: Theme.smallFontSize
                }
                Button {
                    text: dl.state === "paused" || dl.state === "failed" ? qsTr("Resume") : qsTr("Pause")
                    visible: dl.state !== "done" && dl.state !== "cancelled"
                    font.pixelSize: Theme.smallFontSize
                    onClicked: dl.state === "paused" || dl.state === "failed" ? page.hub.resume(dl.index) : page.hub.pause(dl.index)
                }
                Button {
                    text: qsTr("Cancel")
                    visible: dl.state !== "done" && dl.state !== "cancelled"
                    font.pixelSize: Theme.smallFontSize
                    onClicked: page.hub.cancel(dl.index)
                }
                PrimaryButton {
                    text: qsTr("Load")
                    visible: dl.state === "done"
                    onClicked: {
                        page.hub.load(dl.index)
                        page.close()
                    }
                }
            }
        }
    }

    GranuleDialog {
        id: tokenDialog
        title: qsTr("Hugging Face token")
        width: 460
        standardButtons: Dialog.Save | Dialog.Cancel
        onAccepted: page.hub.setToken(tokenField.text)
        ColumnLayout {
            anchors.fill: parent
            spacing: Theme.spacing
            Label {
                Layout.fillWidth: true
                wrapMode: Text.WordWrap
                text: qsTr("Gated and private repositories need an access token. It is kept in the system keychain, never in a file; HF_TOKEN, when set, is used instead.")
                color: Theme.mutedText
                font.pixelSize: Theme.smallFontSize
            }
            TextField {
                id: tokenField
                Layout.fillWidth: true
                echoMode: TextInput.Password
                placeholderText: qsTr("hf_…")
                font.pixelSize: Theme.fontSize
            }
            Button {
                text: qsTr("Forget the saved token")
                visible: page.hub.tokenSource === "keychain" || page.hub.tokenSource === "session"
                font.pixelSize: Theme.smallFontSize
                onClicked: {
                    page.hub.forgetToken()
                    tokenDialog.close()
                }
            }
        }
    }
}
