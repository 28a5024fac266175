// QtTest for the GUI-thread pieces without QML: Markdown splitting, MessageModel,
// ConversationListModel, TelemetryModel and its frame value, the fit preview's wording and
// ChatStore (migrations, WAL, round trips, search, undoable deletion).
#include <QSignalSpy>
#include <QSqlDatabase>
#include <QSqlQuery>
#include <QTemporaryDir>
#include <QtTest>

#include "chat_store.h"
#include "conversation_list_model.h"
#include "markdown_blocks.h"
#include "message_model.h"
#include "model_inspector.h"
#include "telemetry_model.h"
#include "window_settings.h"

using namespace granule::app;

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
    QCOMPARE(model.roleNames().value(MessageModel::RoleNameRole), QByteArray("role"));
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
             (QStringList{"weights", "staging", "kv", "kvPool", "workspace", "graphs", "other"}));
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
    QSqlDatabase db = QSqlDatabase::addDatabase("QSQLITE", "wal-check");
    db.setDatabaseName(dir.filePath("sub/granule.sqlite"));
    QVERIFY(db.open());
    {
      QSqlQuery q(db);
      QVERIFY(q.exec("PRAGMA journal_mode") && q.next());
      QCOMPARE(q.value(0).toString(), QStringLiteral("wal"));
    }
    db.close();
    db = {};
    QSqlDatabase::removeDatabase("wal-check");
  }

  void storeUpgradesASchemaOneDatabase() {
    QTemporaryDir dir;
    const QString path = dir.filePath("v1.sqlite");
    {
      // A database as migration 1 left it, with a chat in it.
      QSqlDatabase db = QSqlDatabase::addDatabase("QSQLITE", "v1");
      db.setDatabaseName(path);
      QVERIFY(db.open());
      QSqlQuery q(db);
      QVERIFY(q.exec(
          "CREATE TABLE conversations (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL, "
          "system_prompt TEXT NOT NULL DEFAULT '', sampling_json TEXT NOT NULL DEFAULT '{}', "
          "created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL)"));
      QVERIFY(
          q.exec("CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, conversation_id "
                 "INTEGER NOT NULL "
                 "REFERENCES conversations(id) ON DELETE CASCADE, position INTEGER NOT NULL, role "
                 "TEXT NOT NULL, "
                 "content TEXT NOT NULL, tokens_per_second REAL NOT NULL DEFAULT 0, finish_reason "
                 "TEXT NOT NULL "
                 "DEFAULT '', created_at INTEGER NOT NULL)"));
      QVERIFY(q.exec("CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)"));
      QVERIFY(q.exec(
          "INSERT INTO conversations (title, created_at, updated_at) VALUES ('kept', 1, 1)"));
      QVERIFY(q.exec("PRAGMA user_version = 1"));
      db.close();
    }
    QSqlDatabase::removeDatabase("v1");
    ChatStore store(path);
    QVERIFY2(store.ok(), qPrintable(store.error()));
    QCOMPARE(store.schemaVersion(), 2);
    const auto chats = store.conversations();
    QCOMPARE(chats.size(), 1);
    QCOMPARE(chats[0].title, QStringLiteral("kept"));
    QVERIFY(store.setDeleted(chats[0].id, true));  // the column migration 2 added
  }

  void storeRefusesANewerSchema() {
    QTemporaryDir dir;
    const QString path = dir.filePath("future.sqlite");
    {
      QSqlDatabase db = QSqlDatabase::addDatabase("QSQLITE", "future");
      db.setDatabaseName(path);
      QVERIFY(db.open());
      QSqlQuery(db).exec("PRAGMA user_version = 99");
      db.close();
    }
    QSqlDatabase::removeDatabase("future");
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
      QVERIFY(store.insertMessage({0, chat_id, 0, "user", "Plan a trip to Kyoto", 0, "", 0}));
      const qint64 reply = store.insertMessage({0, chat_id, 1, "assistant", "", 0, "", 0}).value();
      QVERIFY(store.updateMessage(
          {reply, chat_id, 1, "assistant", "Day 1: **Fushimi Inari**", 41.5, "eos", 0}));
      QVERIFY(store.setSetting("model/last_path", "/m.gguf"));
      QVERIFY(store.setSetting("model/last_path", "/n.gguf"));  // replaces
    }
    ChatStore store(path);
    const auto chats = store.conversations();
    QCOMPARE(chats.size(), 1);
    QCOMPARE(chats[0].title, QStringLiteral("Trip plan"));
    QCOMPARE(chats[0].system_prompt, QStringLiteral("Be brief."));
    QCOMPARE(chats[0].sampling.temperature, 0.3);
    QCOMPARE(chats[0].sampling.top_k, 12);
    QCOMPARE(chats[0].sampling.seed, 18446744073709551557ull);
    const auto messages = store.messages(chat_id);
    QCOMPARE(messages.size(), 2);
    QCOMPARE(messages[1].content, QStringLiteral("Day 1: **Fushimi Inari**"));
    QCOMPARE(messages[1].tokens_per_second, 41.5);
    QCOMPARE(messages[1].finish_reason, QStringLiteral("eos"));
    QCOMPARE(store.setting("model/last_path"), QStringLiteral("/n.gguf"));
    QCOMPARE(store.setting("missing", "fallback"), QStringLiteral("fallback"));
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
    {
      QSqlDatabase db = QSqlDatabase::addDatabase("QSQLITE", "v1-clash");
      db.setDatabaseName(path);
      QVERIFY(db.open());
      QSqlQuery q(db);
      QVERIFY(q.exec(
          "CREATE TABLE conversations (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL, "
          "system_prompt TEXT NOT NULL DEFAULT '', sampling_json TEXT NOT NULL DEFAULT '{}', "
          "created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL)"));
      QVERIFY(
          q.exec("CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, "
                 "conversation_id INTEGER NOT NULL, position INTEGER NOT NULL, role TEXT NOT "
                 "NULL, content TEXT NOT NULL, tokens_per_second REAL NOT NULL DEFAULT 0, "
                 "finish_reason TEXT NOT NULL DEFAULT '', created_at INTEGER NOT NULL)"));
      QVERIFY(q.exec("CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)"));
      // The name migration 2 creates, taken already: its second statement fails.
      QVERIFY(q.exec("CREATE INDEX messages_by_conversation ON messages(position)"));
      QVERIFY(q.exec(
          "INSERT INTO conversations (title, created_at, updated_at) VALUES ('kept', 1, 1)"));
      QVERIFY(q.exec("PRAGMA user_version = 1"));
      db.close();
    }
    QSqlDatabase::removeDatabase("v1-clash");
    {
      ChatStore store(path);
      QVERIFY(!store.ok());
      QVERIFY2(store.error().contains(QStringLiteral("messages_by_conversation")),
               qPrintable(store.error()));
      QVERIFY2(!store.error().contains(QLatin1Char('\n')), qPrintable(store.error()));
      QVERIFY2(store.error().contains(path), qPrintable(store.error()));
    }
    QVERIFY(QFileInfo(path).size() > 0);
    QSqlDatabase db = QSqlDatabase::addDatabase("QSQLITE", "v1-after");
    db.setDatabaseName(path);
    QVERIFY(db.open());
    {
      QSqlQuery q(db);
      QVERIFY(q.exec("PRAGMA user_version") && q.next());
      QCOMPARE(q.value(0).toInt(), 1);
      QVERIFY(q.exec("SELECT title FROM conversations") && q.next());
      QCOMPARE(q.value(0).toString(), QStringLiteral("kept"));
      // The ALTER TABLE of the failed migration was rolled back with it.
      QVERIFY(!q.exec("SELECT deleted_at FROM conversations"));
    }
    db.close();
    db = {};
    QSqlDatabase::removeDatabase("v1-after");
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
