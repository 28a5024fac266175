// QtTest for the window's look and settings without QML: the code highlighter (formats at
// positions in sample snippets of each language), the Markdown prose rendering (line
// breaks, spacing, link and inline-code colours), the sampling presets and global defaults,
// the remembered window geometry, the ModelController's preview/reload rules and the
// models folder's listing with fits.
#include <QFile>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QTextBlock>
#include <QTextCursor>
#include <QTextDocument>
#include <QTextLayout>
#include <QTextList>
#include <QtTest>

#include "chat_controller.h"
#include "code_highlighter.h"
#include "error_reporter.h"
#include "granule/testkit/synthetic_model.h"
#include "markdown_blocks.h"
#include "model_controller.h"
#include "model_library.h"
#include "sampling_editor.h"
#include "sampling_presets.h"
#include "telemetry_idle_filter.h"
#include "window_settings.h"

using namespace granule::app;

namespace {

// Highlights `code` as `language` and returns the document (the highlighter is its child).
std::unique_ptr<QTextDocument> highlighted(const QString& code, const QString& language,
                                           bool dark = true) {
  auto doc = std::make_unique<QTextDocument>();
  doc->setPlainText(code);
  auto* h =
      new SyntaxHighlighter(doc.get(), codeLanguageFor(language), CodeColors::forScheme(dark));
  h->rehighlight();
  return doc;
}

// The highlighter's colour at character `offset` of the first occurrence of `needle` in the
// document (an invalid colour where the text is unformatted).
QColor colorAt(const QTextDocument& doc, const QString& needle, int offset = 0,
               int occurrence = 0) {
  int from = 0;
  int at = -1;
  const QString text = doc.toPlainText();
  for (int i = 0; i <= occurrence; ++i) {
    at = static_cast<int>(text.indexOf(needle, from));
    if (at < 0) return QColor();
    from = at + 1;
  }
  const int position = at + offset;
  const QTextBlock block = doc.findBlock(position);
  const int in_block = position - block.position();
  for (const QTextLayout::FormatRange& r : block.layout()->formats()) {
    if (in_block >= r.start && in_block < r.start + r.length) return r.format.foreground().color();
  }
  return QColor();
}

std::unique_ptr<QTextDocument> documentFromHtml(const QString& html) {
  auto doc = std::make_unique<QTextDocument>();
  doc->setHtml(html);
  return doc;
}

}  // namespace

class LookTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  // --- the highlighter ---------------------------------------------------------------
  void highlighterKnowsTheLanguagesAndTheirAliases() {
    for (const char* name : {"c", "cpp", "C++", "python", "py", "js", "typescript", "tsx", "rust",
                             "go", "java", "bash", "sh", "json"})
      QVERIFY2(codeLanguageFor(QString::fromLatin1(name)).known, name);
    QVERIFY(!codeLanguageFor(QStringLiteral("brainfuck")).known);
    QCOMPARE(codeLanguageFor(QStringLiteral("python title=x.py")).name, QStringLiteral("python"));
  }

  void highlighterColoursCppKeywordsStringsCommentsNumbers() {
    const CodeColors c = CodeColors::forScheme(true);
    const auto doc = highlighted(
        "#include <vector>\n"
        "int main() {  // entry\n"
        "  const char* s = \"a \\\" b\";\n"
        "  /* several\n"
        "     lines */ return 42;\n"
        "}\n",
        "cpp");
    QCOMPARE(colorAt(*doc, "#include"), c.keyword);
    QCOMPARE(colorAt(*doc, "int main"), c.type);
    QCOMPARE(colorAt(*doc, "main"), QColor());  // a plain name
    QCOMPARE(colorAt(*doc, "// entry", 3), c.comment);
    QCOMPARE(colorAt(*doc, "const"), c.keyword);
    QCOMPARE(colorAt(*doc, "\"a", 0), c.string);
    QCOMPARE(colorAt(*doc, " b\"", 1), c.string);  // an escaped quote does not end it
    QCOMPARE(colorAt(*doc, "several"), c.comment);
    QCOMPARE(colorAt(*doc, "lines */"), c.comment);  // the comment runs across lines
    QCOMPARE(colorAt(*doc, "return"), c.keyword);    // and ends where it closes
    QCOMPARE(colorAt(*doc, "42"), c.number);
  }

  void highlighterColoursPython() {
    const CodeColors c = CodeColors::forScheme(false);
    const auto doc = highlighted(
        "def area(r):\n"
        "    \"\"\"Area of a circle.\n"
        "    More text.\"\"\"\n"
        "    x2 = 3.14 * r ** 2  # pi r squared\n"
        "    return None if r < 0 else x2\n",
        "python", false);
    QCOMPARE(colorAt(*doc, "def"), c.keyword);
    QCOMPARE(colorAt(*doc, "Area of"), c.string);
    QCOMPARE(colorAt(*doc, "More text"), c.string);  // the triple-quoted string spans lines
    QCOMPARE(colorAt(*doc, "x2 ="), QColor());       // digits inside a name are no number
    QCOMPARE(colorAt(*doc, "3.14", 2), c.number);
    QCOMPARE(colorAt(*doc, "# pi", 4), c.comment);
    QCOMPARE(colorAt(*doc, "return"), c.keyword);
    QCOMPARE(colorAt(*doc, "None"), c.type);
  }

  void highlighterColoursJavaScriptRustGoJava() {
    const CodeColors c = CodeColors::forScheme(true);
    {
      const auto doc = highlighted("const f = async (x) => `t ${x}`; // note\nlet n = 0x1F;", "js");
      QCOMPARE(colorAt(*doc, "const"), c.keyword);
      QCOMPARE(colorAt(*doc, "async"), c.keyword);
      QCOMPARE(colorAt(*doc, "`t", 1), c.string);
      QCOMPARE(colorAt(*doc, "note"), c.comment);
      QCOMPARE(colorAt(*doc, "0x1F", 3), c.number);
    }
    {
      const auto doc = highlighted("fn first<'a>(s: &'a str) -> char { let c = 'x'; c }", "rust");
      QCOMPARE(colorAt(*doc, "fn"), c.keyword);
      QCOMPARE(colorAt(*doc, "str"), c.type);
      QCOMPARE(colorAt(*doc, "'a>", 1), QColor());  // a lifetime, not a string
      QCOMPARE(colorAt(*doc, "'x'", 1), c.string);
    }
    {
      const auto doc = highlighted("func main() {\n\tfmt.Println(\"hi\", 1.5e-3)\n}", "go");
      QCOMPARE(colorAt(*doc, "func"), c.keyword);
      QCOMPARE(colorAt(*doc, "\"hi\"", 1), c.string);
      QCOMPARE(colorAt(*doc, "1.5e-3", 4), c.number);  // the exponent's sign belongs to it
    }
    {
      const auto doc = highlighted("public class A { String s = null; }", "java");
      QCOMPARE(colorAt(*doc, "public"), c.keyword);
      QCOMPARE(colorAt(*doc, "String"), c.type);
      QCOMPARE(colorAt(*doc, "null"), c.type);
    }
  }

  void highlighterColoursBashAndJson() {
    const CodeColors c = CodeColors::forScheme(true);
    {
      const auto doc = highlighted("for f in *.gguf; do echo \"$f\"; done # list\nurl=a#b", "bash");
      QCOMPARE(colorAt(*doc, "for"), c.keyword);
      QCOMPARE(colorAt(*doc, "echo"), c.type);
      QCOMPARE(colorAt(*doc, "\"$f\"", 1), c.string);
      QCOMPARE(colorAt(*doc, "# list", 2), c.comment);
      QCOMPARE(colorAt(*doc, "#b"), QColor());  // '#' inside a word is no comment
    }
    {
      const auto doc = highlighted("{\"name\": \"granule\", \"n\": -12.5, \"ok\": true}", "json");
      QCOMPARE(colorAt(*doc, "name"), c.string);
      QCOMPARE(colorAt(*doc, "12.5"), c.number);
      QCOMPARE(colorAt(*doc, "true"), c.type);
    }
  }

  void highlighterLeavesAnUnknownLanguagePlain() {
    const auto doc = highlighted("int x = 1; // c", "text");
    QCOMPARE(colorAt(*doc, "int"), QColor());
    QCOMPARE(colorAt(*doc, "// c"), QColor());
  }

  void highlighterFollowsTheScheme() {
    QVERIFY(CodeColors::forScheme(true).keyword != CodeColors::forScheme(false).keyword);
    QTextDocument doc;
    doc.setPlainText("return 1;");
    SyntaxHighlighter h(&doc, codeLanguageFor("cpp"), CodeColors::forScheme(false));
    h.rehighlight();
    QCOMPARE(colorAt(doc, "return"), CodeColors::forScheme(false).keyword);
    h.setColors(CodeColors::forScheme(true));
    QCOMPARE(colorAt(doc, "return"), CodeColors::forScheme(true).keyword);
  }

  // --- Markdown ----------------------------------------------------------------------
  void markdownNamesEachCodeBlocksLanguage() {
    const QString text = QStringLiteral(
        "Intro\n```python title=a.py\nprint(1)\n```\nmid\n~~~\nraw\n~~~\n```c++\nint x;");
    QCOMPARE(markdownCodeLanguages(text), (QStringList{"python", "", "c++"}));
    Markdown md;
    QCOMPARE(md.codeLanguage(text, 2), QStringLiteral("c++"));
    QCOMPARE(md.codeLanguage(text, 3), QString());
  }

  void markdownKeepsSingleLineBreaks() {
    const QChar ls(QChar::LineSeparator);
    QCOMPARE(keepMarkdownLineBreaks("Roses are red,\nviolets are blue.\n\nNext"),
             QStringLiteral("Roses are red,") + ls + "violets are blue.\n\nNext");
    QCOMPARE(keepMarkdownLineBreaks("hard  \nbreak\\\nend"),
             QStringLiteral("hard") + ls + "break" + ls + "end");
    // A list, a heading, a quote and table rows still start where they did.
    QCOMPARE(keepMarkdownLineBreaks("Steps:\n- one\n- two\n1. three"),
             QStringLiteral("Steps:\n- one\n- two\n1. three"));
    QCOMPARE(keepMarkdownLineBreaks("# Title\ntext\n> quote"),
             QStringLiteral("# Title\ntext\n> quote"));
    QCOMPARE(keepMarkdownLineBreaks("| a | b |\n|---|---|\n| 1 | 2 |"),
             QStringLiteral("| a | b |\n|---|---|\n| 1 | 2 |"));
  }

  void markdownPoemStaysOnItsLines() {
    MarkdownStyle style{QColor("#8ab4ff"), QColor("#2e323a"), "DejaVu Sans Mono"};
    const auto html_doc = documentFromHtml(
        markdownProseToHtml("The fog comes\non little cat feet.\nIt sits looking", style));
    const QTextDocument& doc = *html_doc;
    const QString text = doc.begin().text();  // toPlainText would turn separators into \n
    // One paragraph, three lines: hard breaks are line separators in one block.
    QCOMPARE(doc.blockCount(), 1);
    QCOMPARE(text.count(QChar::LineSeparator), 2);
  }

  void markdownSpacesParagraphsAndHeadings() {
    MarkdownStyle style{QColor("#8ab4ff"), QColor("#2e323a"), "DejaVu Sans Mono", 10, 14};
    const auto html_doc =
        documentFromHtml(markdownProseToHtml("First para.\n\n## Heading\n\nSecond para.", style));
    const QTextDocument& doc = *html_doc;
    QCOMPARE(doc.blockCount(), 3);
    const QTextBlock first = doc.begin();
    const QTextBlock heading = first.next();
    const QTextBlock last = heading.next();
    QCOMPARE(first.blockFormat().bottomMargin(), 10.0);
    QCOMPARE(heading.blockFormat().topMargin(), 14.0);
    QVERIFY(heading.blockFormat().headingLevel() == 2);
    QCOMPARE(last.blockFormat().bottomMargin(), 0.0);
  }

  void markdownColoursLinksAndInlineCodeFromTheTheme() {
    const QColor link("#8ab4ff");
    const QColor code_bg("#2e323a");
    MarkdownStyle style{link, code_bg, "DejaVu Sans Mono"};
    const QString html = markdownProseToHtml(
        "See [the docs](https://example.org/d) and call `granule-cli fit`.", style);
    QVERIFY(!html.contains("font-size:9pt"));  // the view's font applies
    const auto html_doc = documentFromHtml(html);
    const QTextDocument& doc = *html_doc;
    bool saw_link = false, saw_code = false;
    for (auto it = doc.begin().begin(); !it.atEnd(); ++it) {
      const QTextFragment f = it.fragment();
      if (f.text().contains("docs")) {
        saw_link = true;
        QVERIFY(f.charFormat().isAnchor());
        QCOMPARE(f.charFormat().anchorHref(), QStringLiteral("https://example.org/d"));
        QCOMPARE(f.charFormat().foreground().color(), link);  // not the palette's pure blue
      }
      if (f.text().contains("granule-cli")) {
        saw_code = true;
        QCOMPARE(f.charFormat().background().color(), code_bg);
        QVERIFY(f.charFormat().fontFamilies().toStringList().contains("DejaVu Sans Mono"));
      }
    }
    QVERIFY(saw_link);
    QVERIFY(saw_code);
  }

  // --- sampling defaults and presets -------------------------------------------------
  // The window's presets are the engine's (granule/sampling.h): the same names in the same
  // order, and each preset's values the engine's row; a preset keeps the answer length.
  void presetsAreTheEnginesPresets() {
    QStringList engine_names;
    for (std::string_view name : granule::SamplingParams::preset_names())
      engine_names << QString::fromLatin1(name.data(), static_cast<qsizetype>(name.size()));
    QCOMPARE(samplingPresetNames(), engine_names);
    QCOMPARE(samplingPresetNames(), (QStringList{"precise", "balanced", "creative", "greedy"}));
    SamplingSettings base;
    base.max_tokens = 1000;
    base.seed = 0;
    for (const granule::SamplingPreset& row : granule::kSamplingPresets) {
      const QString name =
          QString::fromLatin1(row.name.data(), static_cast<qsizetype>(row.name.size()));
      const SamplingSettings s = *samplingPreset(name, base);
      QCOMPARE(s.temperature, row.temperature);
      QCOMPARE(s.top_k, row.top_k);
      QCOMPARE(s.top_p, row.top_p);
      QCOMPARE(s.min_p, row.min_p);
      QCOMPARE(s.repetition_penalty, row.repetition_penalty);
      QCOMPARE(s.max_tokens, 1000);
      QCOMPARE(s.seed, quint64{0});
      QCOMPARE(matchingSamplingPreset(s), name);
      const granule::SamplingParams engine = granule::SamplingParams::preset(row.name);
      const granule::SamplingParams window = toSamplingParams(s);
      QCOMPARE(window.temperature, engine.temperature);
      QCOMPARE(window.top_p, engine.top_p);
      QCOMPARE(window.min_p, engine.min_p);
      QCOMPARE(window.repetition_penalty, engine.repetition_penalty);
    }
    QVERIFY(!samplingPreset("wild").has_value());
    // A new chat's defaults are the engine's defaults: "balanced", a random seed.
    QCOMPARE(matchingSamplingPreset(SamplingSettings{}), QStringLiteral("balanced"));
    QCOMPARE(SamplingSettings{}.seed, granule::kRandomSeed);
    QCOMPARE(toSamplingParams(SamplingSettings{}).seed, granule::kRandomSeed);
  }

  // Seeds as the window reads and writes them: "random" is kRandomSeed, 0 is a seed.
  void seedTextFollowsTheEnginesRule() {
    QCOMPARE(seedText(granule::kRandomSeed), QStringLiteral("random"));
    QCOMPARE(seedText(0), QStringLiteral("0"));
    QCOMPARE(seedFromText("0"), std::optional<quint64>(0));
    QCOMPARE(seedFromText(" random "), std::optional<quint64>(granule::kRandomSeed));
    QCOMPARE(seedFromText(""), std::optional<quint64>(granule::kRandomSeed));
    QCOMPARE(seedFromText("18446744073709551614"), std::optional<quint64>(18446744073709551614ull));
    QVERIFY(!seedFromText("18446744073709551615").has_value());  // kRandomSeed is not typed
    QVERIFY(!seedFromText("-1").has_value());
    QVERIFY(!seedFromText("12ab").has_value());
  }

  // WindowSettings and ChatController clamp through the same editor to the engine's ranges.
  void samplingEditorsClampToTheEnginesRanges() {
    QTemporaryDir dir;
    ChatStore store(dir.filePath("granule.sqlite"));
    ErrorReporter errors;
    WindowSettings settings(store);
    ChatController chats(store, errors);
    chats.newChat();
    const granule::SamplingRanges& r = granule::kSamplingRanges;
    for (SamplingEditor* e : {settings.samplingEditor(), chats.samplingEditor()}) {
      e->setTemperature(99);
      QCOMPARE(e->temperature(), r.temperature.max);
      e->setTemperature(-1);
      QCOMPARE(e->temperature(), r.temperature.min);
      e->setTopP(2);
      QCOMPARE(e->topP(), r.top_p.max);
      e->setMinP(-1);
      QCOMPARE(e->minP(), r.min_p.min);
      e->setTopK(1 << 30);
      QCOMPARE(e->topK(), r.top_k.max);
      e->setTopK(-5);
      QCOMPARE(e->topK(), r.top_k.min);
      e->setRepetitionPenalty(0);
      QCOMPARE(e->repetitionPenalty(), r.repetition_penalty.min);
      e->setRepetitionPenalty(1000);
      QCOMPARE(e->repetitionPenalty(), r.repetition_penalty.max);
      e->setMaxTokens(0);
      QCOMPARE(e->maxTokens(), r.max_tokens.min);
      e->setMaxTokens(1 << 30);
      QCOMPARE(e->maxTokens(), r.max_tokens.max);
      e->setSeed("0");
      QCOMPARE(e->seed(), QStringLiteral("0"));
      e->setSeed("not a seed");  // ignored
      QCOMPARE(e->seed(), QStringLiteral("0"));
      e->setSeed("random");
      QCOMPARE(e->seed(), QStringLiteral("random"));
      QCOMPARE(e->presets(), samplingPresetNames() << QStringLiteral("custom"));
      for (const QString field :
           {"temperature", "topP", "topK", "minP", "repetitionPenalty", "maxTokens"}) {
        QVERIFY2(e->sliderFrom(field) < e->sliderTo(field), qPrintable(field));
        QVERIFY2(e->sliderStep(field) > 0, qPrintable(field));
      }
    }
  }

  void windowSettingsKeepDefaultSamplingAndGeometry() {
    QTemporaryDir dir;
    const QString path = dir.filePath("granule.sqlite");
    {
      ChatStore store(path);
      WindowSettings settings(store);
      SamplingEditor& sampling = *settings.samplingEditor();
      QCOMPARE(sampling.preset(), QStringLiteral("balanced"));
      QCOMPARE(sampling.seed(), QStringLiteral("random"));
      QVERIFY(settings.geometry().isEmpty());  // nothing remembered yet
      QSignalSpy changed(&settings, &WindowSettings::samplingChanged);
      QSignalSpy editor_changed(&sampling, &SamplingEditor::changed);
      sampling.applyPreset("precise");
      QCOMPARE(sampling.preset(), QStringLiteral("precise"));
      sampling.setMaxTokens(1024);
      QCOMPARE(sampling.preset(), QStringLiteral("precise"));  // length is no part of it
      sampling.setTemperature(0.33);
      QCOMPARE(sampling.preset(), QStringLiteral("custom"));
      sampling.setSeed("0");
      QCOMPARE(changed.count(), 4);
      QCOMPARE(editor_changed.count(), 4);
      settings.saveGeometry(40, 30, 1280, 800, false);
      settings.saveGeometry(0, 0, 2560, 1440, true);  // maximised: the normal size stays
    }
    ChatStore store(path);
    WindowSettings settings(store);
    QCOMPARE(settings.sampling().temperature, 0.33);
    QCOMPARE(settings.sampling().max_tokens, 1024);
    QCOMPARE(settings.sampling().seed, quint64{0});  // seed 0 round-trips as 0, not "random"
    QCOMPARE(settings.samplingEditor()->seed(), QStringLiteral("0"));
    QCOMPARE(settings.geometry(), QRect(40, 30, 1280, 800));
    QVERIFY(settings.maximized());
    settings.saveGeometry(0, 0, 300, 200, false);  // below the minimum: not kept
    QCOMPARE(settings.geometry(), QRect(40, 30, 1280, 800));
    // A value saved before seeds were kept ("t k p minp rep max") reads with a random seed.
    store.setSetting("sampling/defaults", "0.5 20 0.9 0.1 1.2 300");
    WindowSettings older(store);
    QCOMPARE(older.sampling().temperature, 0.5);
    QCOMPARE(older.sampling().seed, granule::kRandomSeed);
  }

  // --- the idle window -------------------------------------------------------------
  void telemetryThatShowsNothingNewIsDropped() {
    TelemetryFrame shown;
    shown.time_s = 1.0;
    shown.has_engine = true;
    shown.engine.device.used_bytes = 100 << 20;
    shown.host.total_bytes = 16ull << 30;
    shown.host.available_bytes = 8ull << 30;
    shown.host.process_resident_bytes = 300 << 20;
    TelemetryFrame next = shown;
    next.time_s = 1.1;                     // only time passed
    next.host.available_bytes += 3 << 20;  // another program took 3 MiB
    QVERIFY(telemetryLooksTheSame(shown, next));
    next.host.available_bytes += 200 << 20;  // a visible change of free memory
    QVERIFY(!telemetryLooksTheSame(shown, next));
    next = shown;
    next.engine.device.used_bytes += 2 << 20;  // the engine's ledger moved
    QVERIFY(!telemetryLooksTheSame(shown, next));
    next = shown;
    next.chats.append(ChatTelemetry{7, {}});  // a chat started
    QVERIFY(!telemetryLooksTheSame(shown, next));
    next = shown;
    next.has_engine = false;
    QVERIFY(!telemetryLooksTheSame(shown, next));
  }

  // --- the model controller ----------------------------------------------------------
  void previewingAnotherModelLeavesTheLoadedOneLoaded() {
    ErrorReporter errors;
    ModelController model(errors);
    ModelInfo loaded;
    loaded.path = "/models/a.gguf";
    loaded.name = "Model A";
    model.load(loaded.path);
    QVERIFY(!model.ready());  // loading
    model.onModelLoaded(loaded);
    QVERIFY(model.ready());

    model.previewFile("/models/b.gguf");
    QCOMPARE(model.status(), ModelController::Status::Inspecting);
    QVERIFY(model.ready());
    QCOMPARE(model.modelName(), QStringLiteral("Model A"));
    ModelInfo other;
    other.path = "/models/b.gguf";
    other.name = "Model B";
    model.onModelInspected(other, {});
    QCOMPARE(model.status(), ModelController::Status::Previewing);
    QVERIFY(model.ready());
    QCOMPARE(model.modelName(), QStringLiteral("Model A"));
    model.cancelPreview();
    QCOMPARE(model.status(), ModelController::Status::Ready);
    QCOMPARE(model.modelPath(), QStringLiteral("/models/a.gguf"));
  }

  void reloadAppliesChangedEngineSettings() {
    ErrorReporter errors;
    ModelController model(errors);
    QSignalSpy loads(&model, &ModelController::loadRequested);
    QSignalSpy threads(&model, &ModelController::cpuThreadsRequested);
    model.setContextLength(2048);
    model.load("/models/a.gguf");
    ModelInfo info;
    info.path = "/models/a.gguf";
    model.onModelLoaded(info);
    QVERIFY(!model.reloadNeeded());
    model.setCpuThreads(3);
    QCOMPARE(threads.count(), 1);
    QCOMPARE(threads.last().at(0).toInt(), 3);
    model.setContextLength(1024);
    QVERIFY(model.reloadNeeded());
    model.reload();
    QCOMPARE(loads.count(), 2);
    QCOMPARE(loads.last().at(0).toString(), QStringLiteral("/models/a.gguf"));
    QCOMPARE(loads.last().at(1).toLongLong(), 1024);
    model.onModelLoaded(info);
    QVERIFY(!model.reloadNeeded());
  }

  void modelsFolderOpensTheDialogThere() {
    QTemporaryDir dir;
    qputenv("XDG_DATA_HOME", dir.path().toUtf8());
    ErrorReporter errors;
    ModelController model(errors);
    QCOMPARE(model.defaultModelsFolder(), dir.filePath("granule/models"));
    QDir().mkpath(model.defaultModelsFolder());
    QCOMPARE(model.modelsFolderUrl(), QUrl::fromLocalFile(dir.filePath("granule/models")));
    QDir().mkpath(dir.filePath("mine"));
    model.setModelsFolder(dir.filePath("mine"));
    QCOMPARE(model.modelsFolderUrl(), QUrl::fromLocalFile(dir.filePath("mine")));
    QCOMPARE(model.library()->folders(),
             (QStringList{dir.filePath("granule/models"), dir.filePath("mine")}));
    qunsetenv("XDG_DATA_HOME");
  }

  void libraryListsTheFoldersModelsWithTheirFit() {
    QTemporaryDir dir;
    const QString a = dir.filePath("tiny.gguf");
    granule::write_synthetic_model(granule::SyntheticModelSpec::preset("tiny"), a.toStdString());
    {
      QFile junk(dir.filePath("broken.gguf"));
      QVERIFY(junk.open(QIODevice::WriteOnly));
      junk.write("not a gguf file");
    }
    QFile(dir.filePath("notes.txt")).open(QIODevice::WriteOnly);
    ModelLibrary library;
    library.setFolders({dir.path()});
    QSignalSpy done(&library, &ModelLibrary::scanningChanged);
    library.refresh(256, 2, 0);
    QCOMPARE(library.count(), 2);  // *.gguf only, sorted by name
    QCOMPARE(library.data(library.index(0), ModelLibrary::FileNameRole).toString(),
             QStringLiteral("broken.gguf"));
    QTRY_VERIFY_WITH_TIMEOUT(!library.scanning(), 20000);
    const LocalModel& tiny = library.models()[1];
    QVERIFY(tiny.readable);
    QVERIFY(!tiny.block_type.isEmpty());
    QVERIFY(tiny.file_bytes > 0);
    QVERIFY(tiny.loads);
    const QString details = library.data(library.index(1), ModelLibrary::DetailsRole).toString();
    QVERIFY2(details.startsWith("tiny.gguf  ·  ") && details.contains(tiny.block_type),
             qPrintable(details));
    QVERIFY(!tiny.fit_text.isEmpty());
    const LocalModel& broken = library.models()[0];
    QVERIFY(!broken.readable);
    QVERIFY(!broken.fit_text.isEmpty());  // the reason, one line
    QVERIFY(broken.fit_text != QStringLiteral("reading…"));
  }
};

QTEST_MAIN(LookTest)
#include "app_look_test.moc"
