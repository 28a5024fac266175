// QtTest for the GUI-thread pieces without QML: Markdown splitting, MessageModel,
// ConversationListModel, TelemetryModel and its frame value, the fit preview's wording and
// ChatStore (migrations, WAL, round trips, search, undoable deletion).
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QSignalSpy>
#include <QSqlDatabase>
#include <QSqlQuery>
#include <QTemporaryDir>
#include <QtTest>

#include "chat_controller.h"
#include "chat_store.h"
#include "conversation_list_model.h"
#include "granule/error.h"
#include "json_output.h"
#include "markdown_blocks.h"
#include "mcp_controller.h"
#include "message_model.h"
#include "model_inspector.h"
#include "reply_parser.h"
#include "telemetry_model.h"
#include "window_settings.h"

using namespace granule::app;

namespace {

// Runs `check` with a query on the database file at `path`, over a connection of its own
// that is closed and removed afterwards (a ChatStore keeps its own).
template <class Check>
void onDatabase(const QString& path, Check check) {
  {
    QSqlDatabase db = QSqlDatabase::addDatabase("QSQLITE", "direct");
    db.setDatabaseName(path);
    QVERIFY(db.open());
    QSqlQuery q(db);
    check(q);
  }
  QSqlDatabase::removeDatabase("direct");
}

// A database as an older build left it: migration 1's tables, then `statements`, at schema
// `version` (the tests write the later migrations' statements they need).
void writeOldDatabase(const QString& path, int version, const QStringList& statements) {
  onDatabase(path, [&](QSqlQuery& q) {
    const QStringList schema_one = {
        "CREATE TABLE conversations (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL, "
        "system_prompt TEXT NOT NULL DEFAULT '', sampling_json TEXT NOT NULL DEFAULT '{}', "
        "created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL)",
        "CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id INTEGER NOT "
        "NULL REFERENCES conversations(id) ON DELETE CASCADE, position INTEGER NOT NULL, role "
        "TEXT NOT NULL, content TEXT NOT NULL, tokens_per_second REAL NOT NULL DEFAULT 0, "
        "finish_reason TEXT NOT NULL DEFAULT '', created_at INTEGER NOT NULL)",
        "CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)"};
    for (const QString& sql : schema_one + statements) QVERIFY2(q.exec(sql), qPrintable(sql));
    QVERIFY(q.exec(QStringLiteral("PRAGMA user_version = %1").arg(version)));
  });
}

// A database as schema 2 left it (the shipped schema before versions), with one chat of two
// turns; `extra` runs before the version is written (to plant a clash).
void writeSchemaTwoDatabase(const QString& path, const QString& extra = {}) {
  QStringList statements = {
      "ALTER TABLE conversations ADD COLUMN deleted_at INTEGER",
      "CREATE INDEX messages_by_conversation ON messages(conversation_id, position)",
      "INSERT INTO conversations (title, created_at, updated_at) VALUES ('Kyoto', 1, 2)",
      // Saved when seed 0 meant "a new seed per reply" (migration 4 keeps that meaning).
      "INSERT INTO conversations (title, sampling_json, created_at, updated_at) VALUES "
      "('Other', '{\"seed\":\"0\",\"temperature\":0.5}', 1, 1)",
      // Inserted out of id order across chats, as two chats written in turns are.
      "INSERT INTO messages (conversation_id, position, role, content, tokens_per_second, "
      "finish_reason, created_at) VALUES (1, 0, 'user', 'Plan a trip', 0, '', 10)",
      "INSERT INTO messages (conversation_id, position, role, content, tokens_per_second, "
      "finish_reason, created_at) VALUES (2, 0, 'user', 'Hi', 0, '', 11)",
      "INSERT INTO messages (conversation_id, position, role, content, tokens_per_second, "
      "finish_reason, created_at) VALUES (1, 1, 'assistant', 'Day 1: temples', 30.5, 'eos', 12)",
      "INSERT INTO messages (conversation_id, position, role, content, tokens_per_second, "
      "finish_reason, created_at) VALUES (1, 2, 'user', 'And day 2?', 0, '', 13)",
      "INSERT INTO messages (conversation_id, position, role, content, tokens_per_second, "
      "finish_reason, created_at) VALUES (1, 3, 'assistant', 'Day 2: markets', 28.0, "
      "'length', 14)"};
  if (!extra.isEmpty()) statements.append(extra);
  writeOldDatabase(path, 2, statements);
}

const QString kInsertKeptChat = QStringLiteral(
    "INSERT INTO conversations (title, created_at, updated_at) VALUES ('kept', 1, 1)");

}  // namespace

class ModelsTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void markdownWithoutCodeIsOneProsePart() {
    QCOMPARE(splitMarkdownCodeBlocks(QStringLiteral("Hello **world**\n")),
             QStringList{"Hello **world**"});
  }

  void markdownCodeBlocksAlternateWithProse() {
    const QString text =
        QStringLiteral("Intro\n```python\nprint(1)\n  x = 2\n```\nMiddle\n~~~\nraw\n~~~");
    const QStringList parts = splitMarkdownCodeBlocks(text);
    QCOMPARE(parts, (QStringList{"Intro", "print(1)\n  x = 2", "Middle", "raw", ""}));
  }

  void markdownUnclosedFenceRunsToTheEnd() {
    // A block still streaming: everything after the fence is code.
    QCOMPARE(splitMarkdownCodeBlocks(QStringLiteral("See:\n```\nint x;\nint y;")),
             (QStringList{"See:", "int x;\nint y;"}));
  }

  void markdownFenceClosesOnlyWithSameCharacterAndLength() {
    const QStringList parts =
        splitMarkdownCodeBlocks(QStringLiteral("````\n```\ninner\n````\nafter"));
    QCOMPARE(parts, (QStringList{"", "```\ninner", "after"}));
  }

  void messageModelStreamsIntoARow() {
    MessageModel model;
    QSignalSpy count(&model, &MessageModel::countChanged);
    StoredMessage user{1, 7, 0, "user", "hi", 0, "", 0};
    model.append(user);
    const int row = model.append(StoredMessage{2, 7, 1, "assistant", "", 0, "", 0}, true);
    QCOMPARE(row, 1);
    QCOMPARE(count.count(), 2);
    QCOMPARE(model.generatingRow(), 1);
    QSignalSpy changed(&model, &QAbstractItemModel::dataChanged);
    model.appendText(row, "Hello\n", 2, 0.5);
    model.appendText(row, "```\ncode", 2, 1.0);
    QCOMPARE(changed.count(), 2);
    const QModelIndex i = model.index(row);
    QCOMPARE(model.data(i, MessageModel::ContentRole).toString(),
             QStringLiteral("Hello\n```\ncode"));
    QCOMPARE(model.data(i, MessageModel::TokenCountRole).toInt(), 4);
    // 2 tokens after the first chunk, 1 s after it.
    QCOMPARE(model.data(i, MessageModel::TokensPerSecondRole).toDouble(), 2.0);
    QCOMPARE(model.data(i, MessageModel::BlocksRole).toStringList(),
             (QStringList{"Hello", "code"}));
    model.finish(row, "eos");
    QCOMPARE(model.generatingRow(), -1);
    QCOMPARE(model.data(i, MessageModel::FinishReasonRole).toString(), QStringLiteral("eos"));
    model.removeFrom(1);
    QCOMPARE(model.count(), 1);
    QCOMPARE(model.roleNames().value(MessageModel::SpeakerRole), QByteArray("speaker"));
    QCOMPARE(model.roleNames().value(MessageModel::TimeToFirstTokenMsRole),
             QByteArray("timeToFirstTokenMs"));
    QCOMPARE(model.roleNames().size(), 17);
  }

  // A reasoning model's reply: reasoning streams apart from the answer, its time runs until
  // the answer starts, Thinking holds while there is no answer; the store keeps both.
  void messageModelKeepsReasoningApartAndTheStoreKeepsIt() {
    MessageModel model;
    const int row = model.append(StoredMessage{0, 7, 1, "assistant", "", 0, "", 0}, true);
    const QModelIndex i = model.index(row);
    model.appendText(row, "", 3, 0.0, "The user asks");
    QVERIFY(model.data(i, MessageModel::ThinkingRole).toBool());
    model.appendText(row, "", 2, 1.5, " for 2+2.");
    QCOMPARE(model.data(i, MessageModel::ReasoningMsRole).toDouble(), 1500.0);
    QVERIFY(model.data(i, MessageModel::ThinkingRole).toBool());
    model.appendText(row, "4.", 1, 2.0);
    QVERIFY(!model.data(i, MessageModel::ThinkingRole).toBool());
    QCOMPARE(model.data(i, MessageModel::ReasoningMsRole).toDouble(), 2000.0);
    model.appendText(row, " Done.", 1, 3.0);
    QCOMPARE(model.data(i, MessageModel::ReasoningMsRole).toDouble(), 2000.0);  // stopped
    QCOMPARE(model.data(i, MessageModel::ReasoningRole).toString(),
             QStringLiteral("The user asks for 2+2."));
    QCOMPARE(model.data(i, MessageModel::ContentRole).toString(), QStringLiteral("4. Done."));
    QCOMPARE(model.roleNames().value(MessageModel::ReasoningMsRole), QByteArray("reasoningMs"));

    QTemporaryDir dir;
    ChatStore store(dir.filePath("granule.sqlite"));
    QVERIFY2(store.ok(), qPrintable(store.error()));
    StoredConversation chat;
    chat.title = "math";
    chat.sampling.reasoning = "off";
    const qint64 chat_id = store.createConversation(chat).value();
    StoredMessage reply = model.message(row);
    reply.conversation_id = chat_id;
    reply.position = 0;
    reply.id = store.insertMessage(reply).value();
    reply.reasoning += " Sure.";
    QVERIFY(store.updateMessage(reply));
    const QList<StoredMessage> stored = store.messages(chat_id);
    QCOMPARE(stored.size(), 1);
    QCOMPARE(stored[0].reasoning, QStringLiteral("The user asks for 2+2. Sure."));
    QCOMPARE(stored[0].reasoning_ms, 2000.0);
    QCOMPARE(store.conversations().at(0).sampling.reasoning, QStringLiteral("off"));
    QVERIFY(chatToJson(store.conversations().at(0), stored).contains("\"reasoning\""));
  }

  // The chat's JSON output: a schema is checked when entered (one line when refused, nothing
  // stored), the setting is saved with the chat, and it is the engine's constraint.
  void jsonOutputIsCheckedStoredAndConstrains() {
    SamplingSettings settings;
    SamplingEditor editor([&]() -> const SamplingSettings& { return settings; },
                          [&](const SamplingSettings& s) { settings = s; });
    QCOMPARE(jsonOutputConstraint(settings).kind, granule::ConstraintKind::None);
    editor.setJsonOutput("schema");  // no schema yet: stays off
    QCOMPARE(editor.jsonOutput(), QString());
    editor.setJsonOutput("object");
    QCOMPARE(jsonOutputConstraint(settings).kind, granule::ConstraintKind::JsonObject);
    const QString not_json = editor.setJsonSchema("{\"type\": ");
    QVERIFY2(not_json.startsWith("Not JSON: parse error at line 1"), qPrintable(not_json));
    QVERIFY(!not_json.contains('\n'));
    QCOMPARE(editor.setJsonSchema("[1, 2]"),
             QStringLiteral("A JSON Schema is an object, like {\"type\": \"object\"}."));
    // The server's rule (when the window has the server library): a keyword the constraint
    // would not enforce is refused.
    if (toolCallsAvailable()) {
      const QString unsupported =
          editor.setJsonSchema(R"({"type": "string", "format": "idn-email"})");
      QVERIFY2(unsupported.contains("'format'"), qPrintable(unsupported));
    }
    QCOMPARE(editor.jsonOutput(), QStringLiteral("object"));  // nothing stored by a refusal
    const QString schema = R"({"type": "object", "properties": {"name": {"type": "string"}}})";
    QCOMPARE(editor.setJsonSchema(schema), QString());
    QCOMPARE(editor.jsonOutput(), QStringLiteral("schema"));
    const granule::Constraint c = jsonOutputConstraint(settings);
    QCOMPARE(c.kind, granule::ConstraintKind::JsonSchema);
    QCOMPARE(QString::fromStdString(c.source), schema);
    QTemporaryDir dir;
    const QString file = dir.filePath("schema.json");
    {
      QFile out(file);
      QVERIFY(out.open(QIODevice::WriteOnly));
      out.write(R"({"type": "array", "items": {"type": "integer"}})");
    }
    QCOMPARE(editor.loadJsonSchema(QUrl::fromLocalFile(file)), QString());
    QVERIFY(editor.jsonSchema().contains("integer"));
    QVERIFY(editor.loadJsonSchema(QUrl::fromLocalFile(dir.filePath("missing.json")))
                .startsWith("Cannot read"));

    ChatStore store(dir.filePath("granule.sqlite"));
    QVERIFY2(store.ok(), qPrintable(store.error()));
    StoredConversation chat;
    chat.title = "json";
    chat.sampling = settings;
    QVERIFY(store.createConversation(chat));
    const SamplingSettings back = store.conversations().at(0).sampling;
    QCOMPARE(back.json_output, QStringLiteral("schema"));
    QCOMPARE(back.json_schema, settings.json_schema);
    editor.setJsonOutput("");
    QCOMPARE(jsonOutputConstraint(settings).kind, granule::ConstraintKind::None);
  }

  // The worker's reply parser: reasoning first, then the answer's tool calls (Hermes, for a
  // ChatML model), split at every byte.
  void replyParserSplitsReasoningAnswerAndCalls() {
    if (!toolCallsAvailable()) QSKIP("this build parses no tool calls (no server library)");
    const granule::ChatTemplate chatml = granule::ChatTemplate::from_name("chatml");
    const std::string reply =
        "<think>Need the weather.</think>Checking.<tool_call>\n{\"name\": \"weather\", "
        "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    for (size_t piece : {size_t(1), size_t(5), reply.size()}) {
      ReplyParser parser(granule::ReasoningFormat::Think, &chatml, /*tools=*/true, "call_7");
      std::string reasoning, content;
      QList<ToolCallText> calls;
      const auto take = [&](ReplyDelta d) {
        reasoning += d.reasoning;
        content += d.content;
        calls.append(d.calls);
      };
      for (size_t i = 0; i < reply.size(); i += piece) take(parser.push(reply.substr(i, piece)));
      take(parser.finish());
      QCOMPARE(QString::fromStdString(reasoning), QStringLiteral("Need the weather."));
      QCOMPARE(QString::fromStdString(content), QStringLiteral("Checking."));
      QCOMPARE(calls.size(), 1);
      QCOMPARE(calls[0].id, QStringLiteral("call_7_0"));
      QCOMPARE(calls[0].name, QStringLiteral("weather"));
      QCOMPARE(calls[0].arguments, QStringLiteral(R"({"city":"Paris"})"));
    }
    // gpt-oss: the call is a whole harmony message, taken before the reasoning is split.
    if (granule::ChatTemplate::jinja_available()) {
      QFile source(GRANULE_SOURCE_DIR "/tests/data/chat/gpt_oss.jinja");
      QVERIFY(source.open(QIODevice::ReadOnly));
      const granule::ChatTemplate gpt_oss =
          granule::ChatTemplate::detect(source.readAll().toStdString());
      const std::string harmony =
          "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>"
          "commentary to=functions.weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}";
      for (size_t piece : {size_t(1), size_t(4), harmony.size()}) {
        ReplyParser parser(granule::ReasoningFormat::Harmony, &gpt_oss, /*tools=*/true, "call_9");
        std::string reasoning, content;
        QList<ToolCallText> calls;
        const auto take = [&](ReplyDelta d) {
          reasoning += d.reasoning;
          content += d.content;
          calls.append(d.calls);
        };
        for (size_t i = 0; i < harmony.size(); i += piece)
          take(parser.push(harmony.substr(i, piece)));
        take(parser.finish());
        QCOMPARE(QString::fromStdString(reasoning), QStringLiteral("Need the weather."));
        QCOMPARE(QString::fromStdString(content), QString());
        QCOMPARE(calls.size(), 1);
        QCOMPARE(calls[0].name, QStringLiteral("weather"));
        QCOMPARE(calls[0].arguments, QStringLiteral(R"({"city":"Oslo"})"));
      }
      // A forced call cannot be constrained in harmony (its markers are control tokens).
      QVERIFY_THROWS_EXCEPTION(granule::UsageError,
                               toolChoiceConstraint(&gpt_oss, "[]", "required"));
    }
    // Without tools the same reply is text.
    ReplyParser plain(granule::ReasoningFormat::None, &chatml, /*tools=*/false, "call_8");
    ReplyDelta d = plain.push("<tool_call>x</tool_call>");
    QCOMPARE(QString::fromStdString(d.content + plain.finish().content),
             QStringLiteral("<tool_call>x</tool_call>"));
    // A forced call: the structural tag for a named tool, refused for an unknown one.
    const std::string tools =
        R"([{"type":"function","function":{"name":"weather","parameters":{"type":"object"}}}])";
    QCOMPARE(toolChoiceConstraint(&chatml, tools, "weather").kind,
             granule::ConstraintKind::StructuralTag);
    QVERIFY_THROWS_EXCEPTION(granule::UsageError, toolChoiceConstraint(&chatml, tools, "nope"));
  }

  // An MCP server's command line, split as a shell splits words.
  void mcpCommandLinesSplitAsAShellWould() {
    QString error;
    QCOMPARE(splitCommandLine("python3 '/a b/c.py'  stdio \"x \\\"y\\\"\" a\\ b ''", &error),
             (QStringList{"python3", "/a b/c.py", "stdio", "x \"y\"", "a b", ""}));
    QVERIFY(error.isEmpty());
    QVERIFY(splitCommandLine("npx 'unclosed", &error).isEmpty());
    QCOMPARE(error, QStringLiteral("The command has an unclosed ' quote."));
  }

  // Tool use in the store: an assistant message's calls and a tool card (schema 6).
  void storeKeepsToolCallsAndCards() {
    QTemporaryDir dir;
    ChatStore store(dir.filePath("granule.sqlite"));
    QVERIFY2(store.ok(), qPrintable(store.error()));
    StoredConversation chat;
    chat.title = "tools";
    const qint64 chat_id = store.createConversation(chat).value();
    StoredMessage reply{0, chat_id, 0, "assistant", "", 0, "eos", 0};
    // (Not a raw string: moc misreads one holding \".)
    reply.tool =
        "{\"calls\":[{\"id\":\"call_1\",\"name\":\"weather\",\"arguments\":\"{\\\"city\\\":"
        "\\\"Paris\\\"}\"}]}";
    reply.id = store.insertMessage(reply).value();
    StoredMessage card{0, chat_id, 1, "tool", "", 0, "", 0};
    card.parent_id = reply.id;
    card.tool = R"({"id":"call_1","name":"weather","state":"asking"})";
    card.id = store.insertMessage(card).value();
    card.content = "Paris: 21 °C";
    card.tool = R"({"id":"call_1","name":"weather","state":"done"})";
    QVERIFY(store.updateMessage(card));
    const QList<StoredMessage> stored = store.messages(chat_id);
    QCOMPARE(stored.size(), 2);
    QCOMPARE(stored[0].tool, reply.tool);
    QCOMPARE(stored[1].role, QStringLiteral("tool"));
    QCOMPARE(stored[1].content, QStringLiteral("Paris: 21 °C"));
    QVERIFY(stored[1].tool.contains("\"done\""));
    MessageModel model;
    model.setMessages(stored);
    QCOMPARE(model.data(model.index(1), MessageModel::ToolRole).toMap().value("state").toString(),
             QStringLiteral("done"));
    QCOMPARE(model.roleNames().value(MessageModel::ToolRole), QByteArray("tool"));
  }

  void conversationListOrdersFiltersAndRestores() {
    ConversationListModel list;
    list.setConversations(
        {{1, "old", "", {}, 10, 10}, {2, "new", "", {}, 20, 30}, {3, "mid", "", {}, 15, 20}});
    QCOMPARE(list.count(), 3);
    QCOMPARE(list.idAt(0), 2);  // most recently updated first
    QCOMPARE(list.idAt(2), 1);
    list.touch(1, 40);
    QCOMPARE(list.idAt(0), 1);
    list.setFilter(QList<qint64>{3});
    QCOMPARE(list.count(), 1);
    QCOMPARE(list.totalCount(), 3);
    QCOMPARE(list.idAt(0), 3);
    list.setFilter(std::nullopt);
    const auto taken = list.take(2);
    QVERIFY(taken);
    QCOMPARE(taken->title, QStringLiteral("new"));
    QCOMPARE(list.count(), 2);
    list.restore(*taken);
    QCOMPARE(list.rowOf(2), 1);  // updated 30: after chat 1 (40), before chat 3 (20)
    QSignalSpy changed(&list, &QAbstractItemModel::dataChanged);
    list.setGenerating(3, true);
    QCOMPARE(changed.count(), 1);
    QVERIFY(list.isGenerating(3));
    QCOMPARE(list.data(list.index(list.rowOf(3)), ConversationListModel::GeneratingRole).toBool(),
             true);
  }

  void telemetryKeepsAMinuteAndTheLatestFrame() {
    TelemetryModel model;
    model.setTitleLookup([](qint64 id) { return QStringLiteral("chat %1").arg(id); });
    for (int i = 0; i <= 700; ++i) {  // 70 s at 10 Hz
      TelemetryFrame f;
      f.time_s = i * 0.1;
      f.has_engine = true;
      f.engine.device.budget_bytes = 1000;
      f.engine.device.ledger[static_cast<size_t>(granule::MemoryCategory::KvCommitted)] =
          static_cast<quint64>(i);
      if (i == 700) {
        granule::SequenceTelemetry running;
        running.kv_committed_bytes = 4096;
        running.tokens_per_second = 33.0;
        granule::SequenceTelemetry preempted;
        preempted.waiting = true;
        preempted.preemptions = 2;
        f.chats = {{5, running}, {6, preempted}};
        f.engine.scheduler.waiting = 1;
        f.engine.scheduler.preemptions = 2;
      }
      model.addFrame(f);
    }
    // Frames older than 61 s before the newest are dropped.
    QVERIFY(model.history().front().time_s >= 70.0 - TelemetryModel::kHistorySeconds - 1.0 - 1e-9);
    QVERIFY(model.history().size() < 700);
    QCOMPARE(model.latest().engine.device.ledger_bytes(granule::MemoryCategory::KvCommitted), 700u);
    QCOMPARE(model.rowCount(), 2);
    QCOMPARE(model.data(model.index(0), TelemetryModel::TitleRole).toString(),
             QStringLiteral("chat 5"));
    // Each row carries the engine's figures for the chat's sequence, named as in the engine.
    const QVariantMap first = model.data(model.index(0), TelemetryModel::SequenceRole).toMap();
    QCOMPARE(first.value("kvCommittedBytes").toDouble(), 4096.0);
    QCOMPARE(first.value("tokensPerSecond").toDouble(), 33.0);
    QCOMPARE(first.value("waiting").toBool(), false);
    // A chat the KV budget holds back: waiting, after two preemptions.
    const QVariantMap second = model.data(model.index(1), TelemetryModel::SequenceRole).toMap();
    QCOMPARE(second.value("waiting").toBool(), true);
    QCOMPARE(second.value("preemptions").toInt(), 2);
    QVERIFY(model.isWaiting(6));
    QVERIFY(!model.isWaiting(5));
    model.setHighlightedChatId(5);
    QCOMPARE(model.data(model.index(0), TelemetryModel::HighlightedRole).toBool(), true);
  }

  void ledgerCategoriesKeepTheKvPoolBesideKv() {
    // The panels stack in this order; Theme.qml's colours and legend names follow it.
    TelemetryModel model;
    QCOMPARE(model.ledgerCategories(),
             (QStringList{"weights", "staging", "kv", "kvPool", "workspace", "graphs", "other",
                          "recurrentState"}));
  }

  void telemetryFrameIsOneValueWithEverySectionField() {
    // QML reads the latest frame as one value: each section a map of the engine's fields in
    // camelCase, with nothing listed in the app.
    TelemetryModel model;
    QSignalSpy updated(&model, &TelemetryModel::updated);
    TelemetryFrame f;
    f.time_s = 1.0;
    f.has_engine = true;
    f.engine.device.name = "CPU (2 threads)";
    f.engine.device.budget_bytes = 1ull << 30;
    f.engine.device.ledger[static_cast<size_t>(granule::MemoryCategory::KvCommitted)] = 6ull << 20;
    f.engine.device.ledger[static_cast<size_t>(granule::MemoryCategory::KvPool)] = 28ull << 20;
    f.engine.kv.pool_bytes = 28ull << 20;
    f.engine.kv.granules_mapped = 1234;
    f.engine.kv.last_granules_created = 2;
    f.engine.kv.last_mapping_us = 12.5;
    f.engine.graphs.buckets = {1, 2, 4};
    f.engine.throughput.steps = 77;
    f.host.process_resident_bytes = 5000;
    model.addFrame(f);
    QCOMPARE(updated.count(), 1);

    const QVariant value = model.property("frame");
    QVERIFY(value.canConvert<TelemetryFrame>());
    const QMetaObject& meta = TelemetryFrame::staticMetaObject;
    auto section = [&](const char* name) {
      return meta.property(meta.indexOfProperty(name)).readOnGadget(value.constData()).toMap();
    };
    QCOMPARE(meta.property(meta.indexOfProperty("hasEngine")).readOnGadget(value.constData()),
             QVariant(true));
    QCOMPARE(section("kv").value("poolBytes").toDouble(), double(28ull << 20));
    QCOMPARE(section("kv").value("granulesMapped").toDouble(), 1234.0);
    QCOMPARE(section("kv").value("lastGranulesCreated").toDouble(), 2.0);
    QCOMPARE(section("kv").value("lastMappingUs").toDouble(), 12.5);
    // Every field of the section is there, the two the KV space adds next included.
    QVERIFY(section("kv").contains("retiringBytes"));
    QVERIFY(section("kv").contains("unmapsDeferred"));
    QCOMPARE(section("device").value("name").toString(), QStringLiteral("CPU (2 threads)"));
    const QVariantMap ledger = section("device").value("ledger").toMap();
    QCOMPARE(ledger.value("kvPool").toDouble(), double(28ull << 20));
    QCOMPARE(ledger.value("kv").toDouble(), double(6ull << 20));
    QCOMPARE(ledger.value("other").toDouble(), 0.0);
    QCOMPARE(section("graphs").value("buckets").toList(), (QVariantList{1, 2, 4}));
    QCOMPARE(section("throughput").value("steps").toDouble(), 77.0);
    QCOMPARE(section("host").value("processResidentBytes").toDouble(), 5000.0);
  }

  void fitPreviewWording() {
    QLocale::setDefault(QLocale(QLocale::English, QLocale::UnitedStates));  // "2,000"
    granule::FitEstimate fit;
    fit.weights_bytes = 100ull << 20;
    fit.workspace_bytes = 70ull << 20;
    fit.kv_bytes_per_token = 30 * 2 * 3 * 64 * 4;
    fit.budget_bytes = 8ull << 30;
    fit.context_per_chat = 4096;
    fit.chats = 8;
    fit.max_context_per_chat = 8192;
    fit.fits = true;
    QVERIFY(fitSummary(fit).startsWith(QStringLiteral("Fits: weights 100 MiB")));
    QVERIFY(fitSummary(fit).contains(QStringLiteral("8 chats × 4,096 tokens")));
    QVERIFY(fitSummary(fit).contains(QStringLiteral("host memory")));
    fit.fits = false;
    fit.max_context_per_chat = 2000;
    fit.gpu = true;
    QVERIFY(fitSummary(fit).startsWith(QStringLiteral("Tight")));
    QVERIFY(fitSummary(fit).contains(QStringLiteral("2,000")));
    QVERIFY(fitSummary(fit).contains(QStringLiteral("VRAM budget")));
    fit.max_context_per_chat = 0;
    QVERIFY(fitSummary(fit).startsWith(QStringLiteral("Does not fit")));
  }

  void storeMigratesToTheCurrentSchemaWithWal() {
    QTemporaryDir dir;
    ChatStore store(dir.filePath("sub/granule.sqlite"));
    QVERIFY2(store.ok(), qPrintable(store.error()));
    QCOMPARE(store.schemaVersion(), ChatStore::kSchemaVersion);
    onDatabase(dir.filePath("sub/granule.sqlite"), [](QSqlQuery& q) {
      QVERIFY(q.exec("PRAGMA journal_mode") && q.next());
      QCOMPARE(q.value(0).toString(), QStringLiteral("wal"));
    });
  }

  void storeUpgradesASchemaOneDatabase() {
    QTemporaryDir dir;
    const QString path = dir.filePath("v1.sqlite");
    writeOldDatabase(path, 1, {kInsertKeptChat});  // as migration 1 left it, with a chat
    ChatStore store(path);
    QVERIFY2(store.ok(), qPrintable(store.error()));
    QCOMPARE(store.schemaVersion(), ChatStore::kSchemaVersion);
    const auto chats = store.conversations();
    QCOMPARE(chats.size(), 1);
    QCOMPARE(chats[0].title, QStringLiteral("kept"));
    QVERIFY(store.setDeleted(chats[0].id, true));  // the column migration 2 added
  }

  void storeRefusesANewerSchema() {
    QTemporaryDir dir;
    const QString path = dir.filePath("future.sqlite");
    onDatabase(path, [](QSqlQuery& q) { QVERIFY(q.exec("PRAGMA user_version = 99")); });
    ChatStore store(path);
    QVERIFY(!store.ok());
    QVERIFY(store.error().contains(QStringLiteral("newer Granule")));
  }

  void storeRoundTripsChatsMessagesAndSettings() {
    QTemporaryDir dir;
    const QString path = dir.filePath("granule.sqlite");
    qint64 chat_id = 0;
    {
      ChatStore store(path);
      StoredConversation c;
      c.title = "Trip plan";
      c.system_prompt = "Be brief.";
      c.sampling.temperature = 0.3;
      c.sampling.top_k = 12;
      c.sampling.seed = 18446744073709551557ull;  // needs all 64 bits
      chat_id = store.createConversation(c).value();
      StoredConversation zero;  // seed 0 is a seed like any other
      zero.title = "Seed zero";
      zero.sampling.seed = 0;
      QVERIFY(store.createConversation(zero).has_value());
      QVERIFY(store.insertMessage({0, chat_id, 0, "user", "Plan a trip to Kyoto", 0, "", 0}));
      const qint64 reply = store.insertMessage({0, chat_id, 1, "assistant", "", 0, "", 0}).value();
      QVERIFY(store.updateMessage(
          {reply, chat_id, 1, "assistant", "Day 1: **Fushimi Inari**", 41.5, "eos", 0}));
      QVERIFY(store.setSetting("model/last_path", "/m.gguf"));
      QVERIFY(store.setSetting("model/last_path", "/n.gguf"));  // replaces
    }
    ChatStore store(path);
    const auto chats = store.conversations();
    QCOMPARE(chats.size(), 2);
    const auto zero = std::find_if(chats.begin(), chats.end(), [](const StoredConversation& c) {
      return c.title == "Seed zero";
    });
    QVERIFY(zero != chats.end());
    QCOMPARE(zero->sampling.seed, quint64{0});
    const StoredConversation& trip = *std::find_if(
        chats.begin(), chats.end(), [&](const StoredConversation& c) { return c.id == chat_id; });
    QCOMPARE(trip.title, QStringLiteral("Trip plan"));
    QCOMPARE(trip.system_prompt, QStringLiteral("Be brief."));
    QCOMPARE(trip.sampling.temperature, 0.3);
    QCOMPARE(trip.sampling.top_k, 12);
    QCOMPARE(trip.sampling.seed, 18446744073709551557ull);
    const auto messages = store.messages(chat_id);
    QCOMPARE(messages.size(), 2);
    QCOMPARE(messages[1].content, QStringLiteral("Day 1: **Fushimi Inari**"));
    QCOMPARE(messages[1].tokens_per_second, 41.5);
    QCOMPARE(messages[1].finish_reason, QStringLiteral("eos"));
    QCOMPARE(store.setting("model/last_path"), QStringLiteral("/n.gguf"));
    QCOMPARE(store.setting("missing", "fallback"), QStringLiteral("fallback"));
  }

  // Schema 2 to 3 on a file with real chats: every message keeps its text and figures, each
  // chat becomes one branch (each message's parent the one before it), one version per turn.
  void storeMigratesSchemaTwoChatsIntoBranches() {
    QTemporaryDir dir;
    const QString path = dir.filePath("v2.sqlite");
    writeSchemaTwoDatabase(path);
    ChatStore store(path);
    QVERIFY2(store.ok(), qPrintable(store.error()));
    QCOMPARE(store.schemaVersion(), ChatStore::kSchemaVersion);
    for (const StoredConversation& c : store.conversations()) {
      QCOMPARE(c.sampling.seed, granule::kRandomSeed);  // none saved, or the old "0 = random"
      if (c.title == QLatin1String("Other")) QCOMPARE(c.sampling.temperature, 0.5);
    }
    const auto kyoto = store.messages(1);
    QCOMPARE(kyoto.size(), 4);
    QCOMPARE(kyoto[0].content, QStringLiteral("Plan a trip"));
    QCOMPARE(kyoto[0].parent_id, 0);
    for (int i = 1; i < 4; ++i) QCOMPARE(kyoto[i].parent_id, kyoto[i - 1].id);
    for (const auto& m : kyoto) QCOMPARE(m.version_count, 1);
    QCOMPARE(kyoto[1].tokens_per_second, 30.5);
    QCOMPARE(kyoto[3].finish_reason, QStringLiteral("length"));
    QCOMPARE(store.messages(2).size(), 1);
    // New versions work on the migrated chat: a second answer to the first question.
    StoredMessage again{0, 1, 1, "assistant", "Day 1: gardens", 0, "eos", 0};
    again.parent_id = kyoto[0].id;
    QVERIFY(store.insertMessage(again));
    const auto branched = store.messages(1);
    QCOMPARE(branched.size(), 2);  // the new answer has no later turns yet
    QCOMPARE(branched[1].content, QStringLiteral("Day 1: gardens"));
    QCOMPARE(branched[1].version, 2);
    QCOMPARE(branched[1].version_count, 2);
    QCOMPARE(store.allMessages(1).size(), 5);  // nothing deleted
  }

  // Migration 3 failing at its last statement (the index name is taken in this file): its
  // ALTER TABLEs and the UPDATE are rolled back, the file stays at schema 2 with its chats.
  void storeMigrationThreeFailingHalfwayRollsBack() {
    QTemporaryDir dir;
    const QString path = dir.filePath("v2-clash.sqlite");
    writeSchemaTwoDatabase(path, "CREATE INDEX messages_by_parent ON messages(role)");
    {
      ChatStore store(path);
      QVERIFY(!store.ok());
      QVERIFY2(store.error().contains(QStringLiteral("messages_by_parent")),
               qPrintable(store.error()));
      QVERIFY2(store.error().contains(path), qPrintable(store.error()));
    }
    onDatabase(path, [](QSqlQuery& q) {
      QVERIFY(q.exec("PRAGMA user_version") && q.next());
      QCOMPARE(q.value(0).toInt(), 2);
      QVERIFY(!q.exec("SELECT parent_id FROM messages"));  // ALTER rolled back
      QVERIFY(!q.exec("SELECT token_count FROM messages"));
      QVERIFY(q.exec("SELECT count(*) FROM messages") && q.next());
      QCOMPARE(q.value(0).toInt(), 5);
      QVERIFY(q.exec("PRAGMA integrity_check") && q.next());
      QCOMPARE(q.value(0).toString(), QStringLiteral("ok"));
    });
    // The clash removed, the same file migrates.
    onDatabase(path, [](QSqlQuery& q) { QVERIFY(q.exec("DROP INDEX messages_by_parent")); });
    ChatStore store(path);
    QVERIFY2(store.ok(), qPrintable(store.error()));
    QCOMPARE(store.messages(1).size(), 4);
  }

  // Versions and branches: each version of a turn keeps its own later turns; choosing a
  // version shows its branch; figures survive a reopen.
  void storeKeepsVersionsWithTheirBranches() {
    QTemporaryDir dir;
    const QString path = dir.filePath("granule.sqlite");
    qint64 c = 0, q1 = 0, a1 = 0, a2 = 0, q2 = 0;
    {
      ChatStore store(path);
      c = store.createConversation({0, "x", "", {}, 1, 1}).value();
      auto add = [&](qint64 parent, int position, const char* role, const char* text) {
        StoredMessage m{0, c, position, role, text, 0, "", 0};
        m.parent_id = parent;
        return store.insertMessage(m).value();
      };
      q1 = add(0, 0, "user", "question");
      a1 = add(q1, 1, "assistant", "answer one");
      q2 = add(a1, 2, "user", "follow-up on one");
      add(q2, 3, "assistant", "reply on one");
      a2 = add(q1, 1, "assistant", "answer two");  // regenerated: the new branch shows
      StoredMessage figures = store.messages(c)[1];
      figures.token_count = 17;
      figures.prompt_tokens = 23;
      figures.time_to_first_token_ms = 145.5;
      figures.finish_reason = "length";
      QVERIFY(store.updateMessage(figures));
    }
    ChatStore store(path);
    auto shown = store.messages(c);
    QCOMPARE(shown.size(), 2);
    QCOMPARE(shown[1].id, a2);
    QCOMPARE(shown[1].version, 2);
    QCOMPARE(shown[1].version_count, 2);
    QCOMPARE(shown[1].token_count, 17);
    QCOMPARE(shown[1].prompt_tokens, 23);
    QCOMPARE(shown[1].time_to_first_token_ms, 145.5);
    QCOMPARE(store.versionsOf(a2), (QList<qint64>{a1, a2}));
    QVERIFY(store.setActiveVersion(a1));
    shown = store.messages(c);
    QCOMPARE(shown.size(), 4);  // version 1 with its own later turns
    QCOMPARE(shown[1].version, 1);
    QCOMPARE(shown[2].content, QStringLiteral("follow-up on one"));
    QCOMPARE(shown[3].content, QStringLiteral("reply on one"));
    // A message with later turns is not removed; a leaf is, and its sibling shows.
    QVERIFY(!store.deleteLeafMessage(a1));
    QVERIFY(store.setActiveVersion(a2));
    QVERIFY(store.deleteLeafMessage(a2));
    shown = store.messages(c);
    QCOMPARE(shown.size(), 4);
    QCOMPARE(shown[1].id, a1);
    QCOMPARE(shown[1].version_count, 1);
  }

  void chatExportsAsMarkdownAndJson() {
    StoredConversation chat{7, "Trip *plan*", "Be brief.", {}, 1, 2};
    StoredMessage q{1, 7, 0, "user", "Plan a trip to Kyoto", 0, "", 100};
    StoredMessage a{2,    7,        1,  "assistant", "Day 1: **Fushimi Inari**\n\n```\ncode\n```",
                    41.5, "length", 200};
    a.parent_id = 1;
    a.token_count = 12;
    a.prompt_tokens = 30;
    a.time_to_first_token_ms = 88;
    a.version = 2;
    a.version_count = 3;
    const QString md = chatToMarkdown(chat, {q, a});
    QVERIFY(md.startsWith(QStringLiteral(
        "# Trip *plan*\n\n**System:** Be brief.\n\n## You\n\nPlan a trip to Kyoto\n\n")));
    QVERIFY2(md.contains(QStringLiteral(
                 "## Model (version 2 of 3)\n\nDay 1: **Fushimi Inari**\n\n```\ncode\n```\n\n")),
             qPrintable(md));
    QVERIFY(md.contains(QStringLiteral("*12 tokens · stop: length*")));
    const QJsonObject root = QJsonDocument::fromJson(chatToJson(chat, {q, a})).object();
    QCOMPARE(root.value("title").toString(), QStringLiteral("Trip *plan*"));
    QCOMPARE(root.value("system_prompt").toString(), QStringLiteral("Be brief."));
    const QJsonArray messages = root.value("messages").toArray();
    QCOMPARE(messages.size(), 2);
    QCOMPARE(messages[0].toObject().value("role").toString(), QStringLiteral("user"));
    QVERIFY(!messages[0].toObject().contains("finish_reason"));
    const QJsonObject reply = messages[1].toObject();
    QCOMPARE(reply.value("content").toString(), a.content);
    QCOMPARE(reply.value("finish_reason").toString(), QStringLiteral("length"));
    QCOMPARE(reply.value("tokens").toInt(), 12);
    QCOMPARE(reply.value("prompt_tokens").toInt(), 30);
    QCOMPARE(reply.value("time_to_first_token_ms").toDouble(), 88.0);
    QCOMPARE(reply.value("versions").toInt(), 3);
    QCOMPARE(root.value("sampling").toObject().value("temperature").toDouble(), 0.7);
  }

  void titlesDropMarkdownMarks() {
    QCOMPARE(titleFrom(QStringLiteral("# **Explain** the `KV cache`")),
             QStringLiteral("Explain the KV cache"));
    QCOMPARE(titleFrom(QStringLiteral("> see [the docs](https://x.y/z) and _this_")),
             QStringLiteral("see the docs and this"));
    QCOMPARE(titleFrom(QStringLiteral("- item one\n- item two")),
             QStringLiteral("item one item two"));
    QCOMPARE(titleFrom(QStringLiteral("2 * 3 = ?")), QStringLiteral("2 3 = ?"));
    QCOMPARE(titleFrom(QStringLiteral("**")), QStringLiteral("**"));  // nothing but marks: kept
  }

  // The throughput figure is the decode rate over the last seconds, from the worker's token
  // count: it follows a burst and falls to 0 once nothing is generated.
  void telemetryDecodeRateIsRecentAndZeroWhenIdle() {
    TelemetryModel model;
    quint64 tokens = 0;
    auto frame = [&](double t) {
      TelemetryFrame f;
      f.time_s = t;
      f.has_engine = true;
      f.counts_tokens = true;
      f.generated_tokens = tokens;
      f.engine.throughput.decode_tokens_per_second = 31.7;  // the engine's lifetime average
      model.addFrame(f);
    };
    for (int i = 0; i <= 50; ++i) {  // 5 s at 20 tok/s
      frame(i * 0.1);
      tokens += 2;
    }
    QVERIFY2(qAbs(model.recentTokensPerSecond() - 20.0) < 0.01,
             qPrintable(QString::number(model.recentTokensPerSecond())));
    for (int i = 51; i <= 60; ++i) frame(i * 0.1);  // idle for 1 s: 2 of the last 3 s busy
    QVERIFY(model.recentTokensPerSecond() > 10 && model.recentTokensPerSecond() < 15);
    for (int i = 61; i <= 90; ++i) frame(i * 0.1);  // idle for over 3 s
    QCOMPARE(model.recentTokensPerSecond(), 0.0);
    QCOMPARE(model.latest().engine.throughput.decode_tokens_per_second, 0.0);
    QCOMPARE(model.history().back().engine.throughput.decode_tokens_per_second, 0.0);
    // A replayed frame (no worker count) keeps what was recorded.
    TelemetryFrame replayed;
    replayed.time_s = 10;
    replayed.engine.throughput.decode_tokens_per_second = 31.7;
    model.addFrame(replayed);
    QCOMPARE(model.recentTokensPerSecond(), 31.7);
  }

  void telemetrySaysWhyAChatWaits() {
    TelemetryModel model;
    TelemetryFrame f;
    granule::SequenceTelemetry waiting, running;
    waiting.waiting = true;
    f.chats = {{1, waiting, true}, {2, waiting, false}, {3, running, false}};
    model.addFrame(f);
    QCOMPARE(model.waitingReason(1), QStringLiteral("slot"));
    QCOMPARE(model.waitingReason(2), QStringLiteral("memory"));
    QCOMPARE(model.waitingReason(3), QString());
  }

  void messageModelCountsContextAndMarksTheModelsView() {
    MessageModel model;
    StoredMessage q{1, 7, 0, "user", "hi", 0, "", 0};
    StoredMessage a{2, 7, 1, "assistant", "hello", 0, "eos", 0};
    a.prompt_tokens = 20;
    a.token_count = 5;
    model.setMessages({q, a});
    QCOMPARE(model.contextTokens(), 25);
    QCOMPARE(model.data(model.index(1), MessageModel::TokenCountRole).toInt(), 5);  // kept
    StoredMessage next{0, 7, 2, "assistant", "", 0, "", 0};
    const int row = model.append(next, true);
    QCOMPARE(model.contextTokens(), 25);  // no prompt yet: the last known figure
    model.setPromptTokens(row, 30);
    model.appendText(row, "a b", 2, 0.1);
    QCOMPARE(model.contextTokens(), 32);
    QCOMPARE(model.data(model.index(1), MessageModel::ViewStartsHereRole).toBool(), false);
    QSignalSpy changed(&model, &QAbstractItemModel::dataChanged);
    model.setViewStartRow(1);
    QCOMPARE(model.data(model.index(1), MessageModel::ViewStartsHereRole).toBool(), true);
    QCOMPARE(model.data(model.index(0), MessageModel::ViewStartsHereRole).toBool(), false);
    QCOMPARE(changed.count(), 1);
  }

  void storeSearchesTitlesAndTextAndUndoesDeletion() {
    QTemporaryDir dir;
    ChatStore store(dir.filePath("granule.sqlite"));
    const qint64 a = store.createConversation({0, "Recipes", "", {}, 1, 1}).value();
    const qint64 b = store.createConversation({0, "KV cache", "", {}, 2, 2}).value();
    store.insertMessage({0, a, 0, "user", "How long to boil an egg?", 0, "", 0});
    store.insertMessage({0, b, 0, "user", "what is 100% of the_cache", 0, "", 0});
    QCOMPARE(store.search("EGG"), QList<qint64>{a});   // case-insensitive, message text
    QCOMPARE(store.search("kv"), QList<qint64>{b});    // title
    QCOMPARE(store.search("100%"), QList<qint64>{b});  // % is literal
    QCOMPARE(store.search("s_1"), QList<qint64>{});    // _ is literal: "is 100" does not match
    QVERIFY(store.setDeleted(a, true));
    QCOMPARE(store.conversations().size(), 1);
    QCOMPARE(store.search("egg"), QList<qint64>{});
    QVERIFY(store.setDeleted(a, false));
    QCOMPARE(store.conversations().size(), 2);
    QVERIFY(store.setDeleted(a, true));
    QVERIFY(store.purgeDeleted());
    QVERIFY(store.setDeleted(a, false));
    QCOMPARE(store.conversations().size(), 1);  // purged for good
    QCOMPARE(store.messages(a).size(), 0);      // messages went with it (cascade)
  }

  void windowSettingsPersistThemeAndDock() {
    QTemporaryDir dir;
    const QString path = dir.filePath("granule.sqlite");
    {
      ChatStore store(path);
      WindowSettings settings(store);
      QCOMPARE(settings.theme(), QStringLiteral("system"));  // defaults
      QVERIFY(settings.dockExpanded());
      settings.setTheme("dark");
      settings.setTheme("purple");  // not a scheme: ignored
      settings.setDockExpanded(false);
    }
    ChatStore store(path);
    WindowSettings settings(store);
    QCOMPARE(settings.theme(), QStringLiteral("dark"));
    QVERIFY(!settings.dockExpanded());
  }

  void storeDeletesMessagesFromAPosition() {
    QTemporaryDir dir;
    ChatStore store(dir.filePath("granule.sqlite"));
    const qint64 c = store.createConversation({0, "x", "", {}, 1, 1}).value();
    for (int i = 0; i < 4; ++i)
      store.insertMessage({0, c, i, i % 2 ? "assistant" : "user", QString::number(i), 0, "", 0});
    QVERIFY(store.deleteMessagesFrom(c, 2));
    const auto left = store.messages(c);
    QCOMPARE(left.size(), 2);
    QCOMPARE(left.back().content, QStringLiteral("1"));
  }
  // A migration that fails halfway (migration 2's ALTER TABLE runs, its CREATE INDEX fails on
  // an index a v1 file already has): nothing of it stays, the file is still at schema 1 with
  // its chat, and the error is one line.
  void storeMigrationFailingHalfwayRollsBackAndKeepsTheFile() {
    QTemporaryDir dir;
    const QString path = dir.filePath("v1.sqlite");
    // The name migration 2 creates, taken already: its second statement fails.
    writeOldDatabase(
        path, 1, {"CREATE INDEX messages_by_conversation ON messages(position)", kInsertKeptChat});
    {
      ChatStore store(path);
      QVERIFY(!store.ok());
      QVERIFY2(store.error().contains(QStringLiteral("messages_by_conversation")),
               qPrintable(store.error()));
      QVERIFY2(!store.error().contains(QLatin1Char('\n')), qPrintable(store.error()));
      QVERIFY2(store.error().contains(path), qPrintable(store.error()));
    }
    QVERIFY(QFileInfo(path).size() > 0);
    onDatabase(path, [](QSqlQuery& q) {
      QVERIFY(q.exec("PRAGMA user_version") && q.next());
      QCOMPARE(q.value(0).toInt(), 1);
      QVERIFY(q.exec("SELECT title FROM conversations") && q.next());
      QCOMPARE(q.value(0).toString(), QStringLiteral("kept"));
      // The ALTER TABLE of the failed migration was rolled back with it.
      QVERIFY(!q.exec("SELECT deleted_at FROM conversations"));
    });
  }

  // Files that are not a chat database: text, and a real database with its pages overwritten.
  // The store reports one line, is not ok, and leaves the file byte for byte as it was (no
  // migration written into it, nothing truncated), so the user's chats can still be rescued.
  void storeRefusesACorruptFileAndLeavesItAsItWas() {
    QTemporaryDir dir;
    const QString text = dir.filePath("text.sqlite");
    {
      QFile f(text);
      QVERIFY(f.open(QIODevice::WriteOnly));
      QByteArray junk;
      for (int i = 0; i < 512; ++i) junk += "this is not a database\n";
      f.write(junk);
    }
    const QString damaged = dir.filePath("damaged.sqlite");
    {
      ChatStore store(damaged);
      QVERIFY(store.ok());
      const qint64 c = store.createConversation({0, "kept", "", {}, 1, 1}).value();
      for (int i = 0; i < 200; ++i)
        store.insertMessage({0, c, i, "user", QString(300, QLatin1Char('a' + i % 26)), 0, "", 0});
    }
    {
      // Checkpointed into the main file by the close; overwrite everything after the first
      // page (the header stays valid, the b-tree pages do not).
      QFile f(damaged);
      QVERIFY(f.open(QIODevice::ReadWrite));
      QVERIFY(f.size() > 16384);
      f.seek(4096);
      f.write(QByteArray(static_cast<int>(f.size()) - 4096, '\xA5'));
    }
    for (const QString& path : {text, damaged}) {
      QFile before(path);
      QVERIFY(before.open(QIODevice::ReadOnly));
      const QByteArray bytes = before.readAll();
      before.close();
      {
        ChatStore store(path);
        QVERIFY2(!store.ok(), qPrintable(path));
        QVERIFY2(!store.error().isEmpty() && !store.error().contains(QLatin1Char('\n')),
                 qPrintable(store.error()));
        QVERIFY2(store.error().contains(path), qPrintable(store.error()));
        store.conversations();  // what the window asks at start: no crash, nothing written
        store.setSetting(QStringLiteral("window/theme"), QStringLiteral("dark"));
      }
      QFile after(path);
      QVERIFY(after.open(QIODevice::ReadOnly));
      QVERIFY2(after.readAll() == bytes, qPrintable(path + " changed"));
    }
  }
};

QTEST_GUILESS_MAIN(ModelsTest)
#include "app_models_test.moc"
