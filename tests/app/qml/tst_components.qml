// Qt Quick Test for the window's components: Theme, CodeBlock's copy button,
// ErrorBanner, MessageDelegate's Markdown/code split, and the telemetry plot.
import QtQuick
import QtTest
import Granule
import GranuleTest

Item {
    id: root
    width: 800
    height: 600

    Component {
        id: codeBlockComponent
        CodeBlock { width: 400; code: "int main() {\n  return 0;\n}" }
    }
    Component {
        id: bannerComponent
        ErrorBanner { width: 600; errors: Services.errors }
    }
    Component {
        id: messageComponent
        MessageDelegate {
            width: 600
            chats: Services.chats
            index: 0
            speaker: "assistant"
            content: "Intro\n```\nlet x = 1;\n```\nOutro"
            blocks: ["Intro", "let x = 1;", "Outro"]
            generating: false
            tokensPerSecond: 12.5
            finishReason: "eos"
            tokenCount: 20
            version: 1
            versionCount: 1
            timeToFirstTokenMs: 150
            viewStartsHere: false
            reasoning: ""
            reasoningMs: 0
            thinking: false
            tool: ({})
        }
    }
    Component {
        id: userMessageComponent
        MessageDelegate {
            width: 600
            chats: Services.chats
            index: 0
            speaker: "user"
            content: "first try"
            blocks: ["first try"]
            generating: false
            tokensPerSecond: 0
            finishReason: ""
            tokenCount: 0
            version: 2
            versionCount: 3
            timeToFirstTokenMs: 0
            viewStartsHere: false
            reasoning: ""
            reasoningMs: 0
            thinking: false
            tool: ({})
        }
    }
    Component {
        id: cutMessageComponent
        MessageDelegate {
            width: 600
            chats: Services.chats
            index: 1
            speaker: "assistant"
            content: "Once upon a time"
            blocks: ["Once upon a time"]
            generating: false
            tokensPerSecond: 20
            finishReason: "length"
            tokenCount: 4
            version: 1
            versionCount: 1
            timeToFirstTokenMs: 90
            viewStartsHere: true
            reasoning: ""
            reasoningMs: 0
            thinking: false
            tool: ({})
            isLast: true
        }
    }
    Component {
        id: thinkingMessageComponent
        MessageDelegate {
            width: 600
            chats: Services.chats
            index: 1
            speaker: "assistant"
            content: ""
            blocks: []
            generating: true
            tokensPerSecond: 0
            finishReason: ""
            tokenCount: 9
            version: 1
            versionCount: 1
            timeToFirstTokenMs: 80
            viewStartsHere: false
            reasoning: "The user asks for 2+2. That is 4."
            reasoningMs: 1234
            thinking: true
            tool: ({})
        }
    }
    Component {
        id: composerComponent
        Composer { width: 600; chats: Services.chats; model: Services.model }
    }
    Component {
        id: plotComponent
        TimeSeriesPlot {
            width: 300
            height: 100
            telemetry: Services.telemetry
            metric: TimeSeriesPlot.Memory
            seriesColors: Theme.ledgerColors
        }
    }

    TestCase {
        name: "Components"
        when: windowShown

        function test_themeHasDistinctLightAndDarkSchemes() {
            Theme.preference = "light"
            // Strings: a color read from a property is a live reference in QML.
            const lightWindow = Theme.window.toString()
            const lightText = Theme.text.toString()
            verify(!Theme.dark)
            Theme.preference = "dark"
            verify(Theme.dark)
            verify(!Qt.colorEqual(Theme.window, lightWindow))
            verify(!Qt.colorEqual(Theme.text, lightText))
            // Text stays readable: dark text on light, light text on dark.
            verify(Theme.text.hslLightness > Theme.window.hslLightness)
            Theme.preference = "light"
            verify(Theme.text.hslLightness < Theme.window.hslLightness)
            compare(Theme.ledgerColors.length, Services.telemetry.ledgerCategories.length)
        }

        function test_codeBlockCopiesItsCode() {
            const block = createTemporaryObject(codeBlockComponent, root)
            verify(block)
            const button = findChild(block, "copyButton")
            verify(button)
            mouseClick(button)
            compare(Clipboard.text(), "int main() {\n  return 0;\n}")
            compare(button.text, "Copied ✓")
        }

        function test_errorBannerShowsAndDismisses() {
            const banner = createTemporaryObject(bannerComponent, root)
            verify(!banner.visible)
            Services.errors.report("model.gguf: not a GGUF file", "Choose another file.")
            verify(banner.visible)
            verify(banner.implicitHeight > 20)
            Services.errors.dismiss()
            verify(!banner.visible)
        }

        function test_messageRendersProseAndCodeApart() {
            const message = createTemporaryObject(messageComponent, root)
            verify(message)
            const code = findChild(message, "codeBlock")
            verify(code, "the odd part is a CodeBlock")
            compare(code.code, "let x = 1;")
            verify(message.implicitHeight > code.implicitHeight)
        }

        // Edit focuses the field, so typed keys land in it; the field has a visible border.
        function test_editingFocusesTheFieldAndKeepsKeystrokes() {
            const message = createTemporaryObject(userMessageComponent, root)
            verify(message)
            message.startEditing()
            const field = findChild(message, "editField")
            verify(field)
            verify(field.visible)
            verify(field.activeFocus)
            keyClick("s")
            keyClick("!")
            compare(field.text, "first trys!")
            verify(field.background.border.width >= 1)
            verify(field.background.border.color !== field.background.color)
            // The versions of the turn: ‹ 2/3 ›.
            verify(findChild(message, "previousVersion").visible)
            verify(findChild(message, "nextVersion").visible)
        }

        function test_stopReasonCaptionAndContinue() {
            const done = createTemporaryObject(messageComponent, root)
            compare(findChild(done, "stopCaption").text, "end of text")
            verify(!findChild(done, "continueButton").visible)
            const cut = createTemporaryObject(cutMessageComponent, root)
            compare(findChild(cut, "stopCaption").text, "length limit")
            verify(findChild(cut, "continueButton").visible)
        }

        // The Thinking block: open while the model thinks, collapsed once the answer starts,
        // a click opens it again; absent for a message without reasoning.
        function test_thinkingBlockOpensWhileThinkingAndCollapsesAfter() {
            const message = createTemporaryObject(thinkingMessageComponent, root)
            verify(message)
            const toggle = findChild(message, "thinkingToggle")
            const text = findChild(message, "thinkingText")
            verify(toggle && text)
            verify(toggle.visible)
            verify(text.visible, "open while thinking")
            compare(text.text, "The user asks for 2+2. That is 4.")
            verify(toggle.contentItem.text.indexOf("Thinking") >= 0)
            message.thinking = false
            message.content = "4"
            verify(!text.visible, "collapsed once the answer starts")
            verify(toggle.contentItem.text.indexOf("Thought for 1.2 s") >= 0, toggle.contentItem.text)
            toggle.clicked()
            verify(text.visible, "a click opens it")
            const plain = createTemporaryObject(messageComponent, root)
            verify(!findChild(plain, "thinkingToggle").visible)
        }

        function test_composerEnterSendsShiftEnterBreaksTheLine() {
            Services.chats.modelReady = true
            const composer = createTemporaryObject(composerComponent, root)
            const input = findChild(composer, "messageInput")
            verify(input)
            input.forceActiveFocus()
            keyClick("h")
            keyClick("i")
            keyClick(Qt.Key_Return, Qt.ShiftModifier)
            keyClick("x")
            compare(input.text, "hi\nx")
            const before = Services.chats.messages.count
            keyClick(Qt.Key_Return)
            compare(input.text, "")
            // The user message and the assistant message being generated.
            compare(Services.chats.messages.count, before + 2)
            compare(Services.chats.currentGenerating, true)
            Services.chats.modelReady = false
        }

        function test_plotScalesToTheDataAndBudget() {
            for (let i = 0; i < 20; ++i)
                Services.addTelemetrySample(i * 0.1, 100e6, i * 1e6, 200e6)
            const plot = createTemporaryObject(plotComponent, root)
            verify(plot)
            // Painted at least once: the scale covers the 200 MB budget, which is on scale.
            tryVerify(() => plot.scaleMax >= 200e6, 3000)
            verify(plot.limitOnScale)
        }
    }
}
