// Crash safety: the app's services (store, controllers, worker) with the real engine on a
// synthetic model run in a child process that chats without pause; the test kills it with
// SIGKILL in mid-generation and checks that the chat database passes PRAGMA integrity_check
// and lost at most the answer that was being written.
#include <signal.h>

#include <QCoreApplication>
#include <QProcess>
#include <QSqlDatabase>
#include <QSqlQuery>
#include <QTemporaryDir>
#include <QTimer>
#include <QtTest>
#include <cstdio>

#include "application.h"
#include "granule/testkit/synthetic_model.h"

using namespace granule::app;

namespace {

// The child: chats on `model` into `db`, one turn after another, and prints each finished
// answer ("DONE <message id> <characters>") and the first text of every answer ("STREAMING <n>").
int runChild(const QString& db, const QString& model) {
  Application app(granuleEngineFactory(), db);
  ChatController* chats = app.chats();
  int turn = 0;
  auto send = [&] {
    ++turn;
    chats->send(QStringLiteral("turn %1: tell me a long story").arg(turn));
  };
  QObject::connect(app.model(), &ModelController::statusChanged, [&] {
    if (app.model()->ready() && turn == 0) {
      chats->newChat();
      chats->samplingEditor()->setMaxTokens(400);
      send();
    }
  });
  bool streaming_told = false;
  QTimer poll;
  poll.setInterval(5);
  QObject::connect(&poll, &QTimer::timeout, [&] {
    if (turn == 0) return;
    MessageModel* messages = chats->messages();
    const int last = messages->count() - 1;
    if (last < 0) return;
    const StoredMessage& m = messages->message(last);
    if (chats->generatingCount() > 0) {
      if (!streaming_told && !m.content.isEmpty()) {
        std::printf("STREAMING %d\n", turn);
        std::fflush(stdout);
        streaming_told = true;
      }
      return;
    }
    if (m.role == QLatin1String("assistant")) {
      std::printf("DONE %lld %lld\n", static_cast<long long>(m.id),
                  static_cast<long long>(m.content.size()));
      std::fflush(stdout);
    }
    streaming_told = false;
    send();
  });
  poll.start();
  app.start(model);
  return QCoreApplication::exec();
}

}  // namespace

class CrashTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void sigkillMidGenerationLosesAtMostTheAnswerInFlight() {
    QTemporaryDir dir;
    const QString model = dir.filePath("tiny.gguf");
    granule::write_synthetic_model(granule::SyntheticModelSpec::preset("tiny"),
                                   model.toStdString());
    const QString db = dir.filePath("granule.sqlite");
    QProcess child;
    child.setProcessChannelMode(QProcess::SeparateChannels);
    child.start(QCoreApplication::applicationFilePath(), {"--child", db, model});
    QVERIFY(child.waitForStarted(10000));
    // Wait for the second answer to be streaming (the first is finished and saved).
    QMap<qint64, qint64> done;  // message id -> characters, as the child saw them
    QString out;
    bool second_streaming = false;
    QElapsedTimer waited;
    waited.start();
    while (!second_streaming && waited.elapsed() < 60000) {
      child.waitForReadyRead(200);
      out += QString::fromUtf8(child.readAllStandardOutput());
      for (const QString& line : out.split(QLatin1Char('\n'))) {
        const QStringList f = line.split(QLatin1Char(' '));
        if (f.size() == 3 && f[0] == QLatin1String("DONE"))
          done[f[1].toLongLong()] = f[2].toLongLong();
        if (f.size() == 2 && f[0] == QLatin1String("STREAMING") && f[1].toInt() >= 2)
          second_streaming = true;
      }
      QVERIFY2(child.state() == QProcess::Running,
               qPrintable(QString::fromUtf8(child.readAllStandardError())));
    }
    QVERIFY2(second_streaming, qPrintable(out));
    QTest::qWait(30);  // into the answer
    QCOMPARE(::kill(static_cast<pid_t>(child.processId()), SIGKILL), 0);
    QVERIFY(child.waitForFinished(10000));
    QCOMPARE(child.exitStatus(), QProcess::CrashExit);
    out += QString::fromUtf8(child.readAllStandardOutput());
    for (const QString& line : out.split(QLatin1Char('\n'))) {
      const QStringList f = line.split(QLatin1Char(' '));
      if (f.size() == 3 && f[0] == QLatin1String("DONE"))
        done[f[1].toLongLong()] = f[2].toLongLong();
    }
    QVERIFY(!done.isEmpty());

    // The file as the kill left it (its WAL beside it): sound.
    {
      QSqlDatabase raw = QSqlDatabase::addDatabase("QSQLITE", "after-kill");
      raw.setDatabaseName(db);
      QVERIFY(raw.open());
      QSqlQuery q(raw);
      QVERIFY(q.exec("PRAGMA integrity_check") && q.next());
      QCOMPARE(q.value(0).toString(), QStringLiteral("ok"));
      raw.close();
    }
    QSqlDatabase::removeDatabase("after-kill");

    ChatStore store(db);
    QVERIFY2(store.ok(), qPrintable(store.error()));
    const auto chats = store.conversations();
    QCOMPARE(chats.size(), 1);
    const auto messages = store.messages(chats[0].id);
    // Every finished answer is there with its text and stop reason; after the last of them
    // at most a question and an unfinished answer (empty: its text was in flight).
    int finished = 0;
    for (const StoredMessage& m : messages) {
      if (!done.contains(m.id)) continue;
      ++finished;
      QCOMPARE(m.role, QStringLiteral("assistant"));
      QCOMPARE(m.content.size(), done[m.id]);
      QVERIFY(!m.finish_reason.isEmpty());
      QVERIFY(m.token_count > 0 || m.content.isEmpty());
    }
    QCOMPARE(finished, done.size());
    QVERIFY(messages.size() >= 2 * done.size() + 1);
    QVERIFY(messages.size() <= 2 * done.size() + 2);
    for (qsizetype i = 0; i < messages.size(); ++i)
      QCOMPARE(messages[i].role, QString(i % 2 ? "assistant" : "user"));
    if (messages.size() == 2 * done.size() + 2) QVERIFY(messages.back().finish_reason.isEmpty());
    qInfo("killed during answer %lld: %lld answers kept, %lld messages",
          static_cast<long long>(done.size() + 1), static_cast<long long>(done.size()),
          static_cast<long long>(messages.size()));
  }
};

int main(int argc, char** argv) {
  if (argc == 4 && QByteArray(argv[1]) == "--child") {
    QCoreApplication app(argc, argv);
    return runChild(QString::fromLocal8Bit(argv[2]), QString::fromLocal8Bit(argv[3]));
  }
  QCoreApplication app(argc, argv);
  CrashTest test;
  return QTest::qExec(&test, argc, argv);
}

#include "app_crash_test.moc"
