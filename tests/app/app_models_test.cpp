// QtTest for the GUI-thread pieces without QML: Markdown splitting, MessageModel,
// ConversationListModel, TelemetryModel, the fit preview arithmetic and ChatStore
// (migrations, WAL, round trips, search, undoable deletion).
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

  void telemetryKeepsAMinuteAndSumsTheLedger() {
    TelemetryModel model;
    model.setTitleLookup([](qint64 id) { return QStringLiteral("chat %1").arg(id); });
    for (int i = 0; i <= 700; ++i) {  // 70 s at 10 Hz
      TelemetryFrame f;
      f.time_s = i * 0.1;
      f.budget_bytes = 1000;
      f.ledger_bytes = {100, 0, static_cast<quint64>(i), 0, 10, 0, 0};
      if (i == 700) {
        f.chats = {{5, 12, 4096, 1 << 20, 33.0}, {6, 0, 0, 1 << 20, 0.0, true, 2}};
        f.waiting_chats = 1;
        f.preemptions = 2;
        f.recomputed_tokens = 140;
      }
      model.addFrame(f);
    }
    // Frames older than 61 s before the newest are dropped.
    QVERIFY(model.history().front().time_s >= 70.0 - TelemetryModel::kHistorySeconds - 1.0 - 1e-9);
    QVERIFY(model.history().size() < 700);
    QCOMPARE(model.usedBytes(), 100.0 + 700 + 10);
    QCOMPARE(model.ledgerBytes().size(), 7);
    QCOMPARE(model.ledgerCategories().at(2), QStringLiteral("kv"));
    QCOMPARE(model.rowCount(), 2);
    QCOMPARE(model.data(model.index(0), TelemetryModel::TitleRole).toString(),
             QStringLiteral("chat 5"));
    QCOMPARE(model.data(model.index(0), TelemetryModel::KvCommittedRole).toDouble(), 4096.0);
    // A chat the KV budget holds back: waiting, after two preemptions.
    QCOMPARE(model.data(model.index(0), TelemetryModel::WaitingRole).toBool(), false);
    QCOMPARE(model.data(model.index(1), TelemetryModel::WaitingRole).toBool(), true);
    QCOMPARE(model.data(model.index(1), TelemetryModel::PreemptionsRole).toInt(), 2);
    QCOMPARE(model.waitingChats(), 1);
    QCOMPARE(model.preemptions(), 2.0);
    QCOMPARE(model.recomputedTokens(), 140.0);
    QVERIFY(model.isWaiting(6));
    QVERIFY(!model.isWaiting(5));
    model.setHighlightedChatId(5);
    QCOMPARE(model.data(model.index(0), TelemetryModel::HighlightedRole).toBool(), true);
  }

  void ledgerCategoriesKeepTheKvPoolBesideKv() {
    // The panels' colours and legend names are indexed in this order (Theme.qml).
    TelemetryModel model;
    QCOMPARE(model.ledgerCategories(),
             (QStringList{"weights", "staging", "kv", "kv_pool", "workspace", "graphs", "other"}));
    QCOMPARE(ledgerCategoryIndex("kv"), size_t{2});
    QCOMPARE(ledgerCategoryIndex("kv_pool"), size_t{3});
    QCOMPARE(ledgerCategoryIndex("workspace"), size_t{4});
    QCOMPARE(ledgerCategoryIndex("something_new"), kLedgerCategories.size() - 1);  // "other"
  }

  void telemetryCarriesTheGranulePool() {
    TelemetryModel model;
    QSignalSpy updated(&model, &TelemetryModel::updated);
    TelemetryFrame f;
    f.time_s = 1.0;
    f.budget_bytes = 1ull << 30;
    f.ledger_bytes[ledgerCategoryIndex("kv")] = 6ull << 20;
    f.ledger_bytes[ledgerCategoryIndex("kv_pool")] = 28ull << 20;
    f.kv_pool_bytes = 28ull << 20;
    f.granules_mapped = 1234;
    f.granules_mapped_last_step = 3;
    f.granules_created_last_step = 2;
    f.mapping_us_last_step = 12.5;
    model.addFrame(f);
    QCOMPARE(updated.count(), 1);
    QCOMPARE(model.ledgerBytes().at(3), double(28ull << 20));
    QCOMPARE(model.ledgerBytes().last(), 0.0);               // not lumped into "other"
    QCOMPARE(model.usedBytes(), double((6ull + 28) << 20));  // the pool counts as used
    QCOMPARE(model.kvPoolBytes(), double(28ull << 20));
    QCOMPARE(model.granulesMapped(), 1234.0);
    QCOMPARE(model.granulesMappedLastStep(), 3.0);
    QCOMPARE(model.granulesCreatedLastStep(), 2.0);
    QCOMPARE(model.mappingUsLastStep(), 12.5);
    // What QML reads.
    QCOMPARE(model.property("kvPoolBytes").toDouble(), double(28ull << 20));
    QCOMPARE(model.property("granulesMappedLastStep").toDouble(), 3.0);
    QCOMPARE(model.property("granulesCreatedLastStep").toDouble(), 2.0);
    QCOMPARE(model.property("mappingUsLastStep").toDouble(), 12.5);
  }

  void fitPreviewArithmetic() {
    QLocale::setDefault(QLocale(QLocale::English, QLocale::UnitedStates));  // "2,000"
    // SmolLM2-135M-like: 30 layers, 3 KV heads of 64, fp16 K and V = 23,040 bytes per token.
    ModelInspection m;
    m.info.vocab = 49152;
    m.info.trained_context = 8192;
    m.weights_bytes = 100ull << 20;
    m.kv_bytes_per_token = 30 * 2 * 3 * 64 * 2;
    granule::EngineOptions options;
    options.context_length = 4096;
    options.max_sequences = 8;
    const quint64 workspace = 49152ull * 4 * 8 + (64ull << 20);
    const FitReport roomy = estimateFit(m, options, 8ull << 30, false);
    QVERIFY(roomy.fits);
    QCOMPARE(roomy.workspace_bytes, workspace);
    QCOMPARE(roomy.max_context_that_fits, 8192);  // capped at the trained context
    const quint64 budget = (100ull << 20) + workspace + 8 * 2000 * m.kv_bytes_per_token;
    const FitReport tight = estimateFit(m, options, budget, false);
    QVERIFY(!tight.fits);
    QCOMPARE(tight.max_context_that_fits, 2000);
    QVERIFY(tight.summary.contains(QStringLiteral("2,000")));
    const FitReport none = estimateFit(m, options, 50ull << 20, false);
    QCOMPARE(none.max_context_that_fits, 0);
    QVERIFY(none.summary.startsWith(QStringLiteral("Does not fit")));
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
};

QTEST_GUILESS_MAIN(ModelsTest)
#include "app_models_test.moc"
