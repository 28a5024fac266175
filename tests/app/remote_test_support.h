// What the remote-engine app tests share: the default model's path, a child process that
// prints its URL first (granule-cli serve, fault_proxy.py), a worker on its own thread wired to
// a ChatController, a keychain double, and readers of the worker's signals.
#pragma once
#include <QProcess>
#include <QRegularExpression>
#include <QSignalSpy>
#include <QTcpServer>
#include <QThread>
#include <QTimer>
#include <QtTest>
#include <map>
#include <memory>

#include "chat_controller.h"
#include "engine_worker.h"
#include "secret_store.h"

namespace granule::app::test {

inline QString defaultModel() {
  QString home = qEnvironmentVariable("XDG_DATA_HOME");
  if (home.isEmpty()) home = QDir::homePath() + QStringLiteral("/.local/share");
  const QString path = home + QStringLiteral("/granule/models/SmolLM2-135M-Instruct.Q4_1.gguf");
  return QFile::exists(path) ? path : QString();
}

// llama.cpp's llama-server as `setup.sh llamaserver` builds it ("" when it is not built).
inline QString llamaServerBinary() {
  QString home = qEnvironmentVariable("XDG_DATA_HOME");
  if (home.isEmpty()) home = QDir::homePath() + QStringLiteral("/.local/share");
  const QString path = home + QStringLiteral("/granule/third_party/llama-server/bin/llama-server");
  return QFile::exists(path) ? path : QString();
}

// A loopback port nobody listens on now (for a server that takes --port N).
inline int freePort() {
  QTcpServer s;
  s.listen(QHostAddress::LocalHost, 0);
  return s.serverPort();
}

// Waits until GET url answers 200 (llama-server loads its model before /health says so).
inline bool waitHealthy(const QString& url, int within_ms) {
  QElapsedTimer t;
  t.start();
  while (t.elapsed() < within_ms) {
    QProcess curl;
    curl.start(QStringLiteral("curl"),
               {QStringLiteral("-sf"), QStringLiteral("-o"), QStringLiteral("/dev/null"), url});
    if (curl.waitForFinished(5000) && curl.exitCode() == 0) return true;
    QTest::qWait(300);
  }
  return false;
}

// A child process that prints its URL on its first stdout line (granule-cli serve: serve());
// killed at the end.
struct Child {
  std::unique_ptr<QProcess> process = std::make_unique<QProcess>();
  int port = 0;
  bool start(const QString& program, const QStringList& args) {
    process->setProcessChannelMode(QProcess::SeparateChannels);
    process->start(program, args);
    if (!process->waitForStarted(10000)) return false;
    QElapsedTimer t;
    t.start();
    while (!process->canReadLine() && t.elapsed() < 60000) process->waitForReadyRead(500);
    const QString line = QString::fromUtf8(process->readLine());
    const QRegularExpressionMatch m =
        QRegularExpression(QStringLiteral("127\\.0\\.0\\.1:(\\d+)")).match(line);
    if (!m.hasMatch()) return false;
    port = m.captured(1).toInt();
    return true;
  }
#ifdef GRANULE_CLI
  // granule-cli serve on `model` with the CPU backend on a free port: a context of `context`
  // tokens, `chats` chats at once, then `extra` options.
  bool serve(const QString& model, int context, int chats, const QStringList& extra = {}) {
    return start(
        QStringLiteral(GRANULE_CLI),
        QStringList{QStringLiteral("serve"), model, QStringLiteral("--port"), QStringLiteral("0"),
                    QStringLiteral("--device"), QStringLiteral("cpu"), QStringLiteral("--ctx"),
                    QString::number(context), QStringLiteral("--chats"), QString::number(chats)} +
            extra);
  }
#endif
  ~Child() {
    process->terminate();
    if (!process->waitForFinished(10000)) process->kill();
  }
};

struct ThreadedWorker {
  explicit ThreadedWorker(EngineFactory factory, RemoteEngineFactory remote = {})
      : worker(new EngineWorker(std::move(factory))) {
    worker->setRemoteEngineFactory(std::move(remote));
    worker->moveToThread(&thread);
    thread.start();
    QMetaObject::invokeMethod(worker, &EngineWorker::start, Qt::QueuedConnection);
  }
  ~ThreadedWorker() {
    QMetaObject::invokeMethod(worker, &EngineWorker::shutdown, Qt::BlockingQueuedConnection);
    thread.quit();
    thread.wait();
    delete worker;
  }
  template <typename F>
  void call(F f) {
    QMetaObject::invokeMethod(worker, std::move(f), Qt::QueuedConnection);
  }
  QString load(const QString& path, ModelInfo* info = nullptr) {
    QSignalSpy loaded(worker, &EngineWorker::modelLoaded);
    QSignalSpy failed(worker, &EngineWorker::loadFailed);
    call([w = worker, path] { w->loadModel(path, 1024, 4); });
    if (!QTest::qWaitFor([&] { return loaded.count() + failed.count() > 0; }, 30000))
      return QStringLiteral("timed out");
    if (!failed.isEmpty()) return failed[0][1].toString();
    if (info) *info = loaded[0][0].value<ModelInfo>();
    return {};
  }
  QThread thread;
  EngineWorker* worker;
  QSignalSpy tokens{worker, &EngineWorker::tokensArrived};
  QSignalSpy finished{worker, &EngineWorker::generationFinished};
};

// The window's wiring of its chats to a worker (Application::connectWorker's part for them).
inline void connectChats(ChatController& chats, ThreadedWorker& w) {
  QObject::connect(&chats, &ChatController::generationRequested, w.worker, &EngineWorker::submit);
  QObject::connect(&chats, &ChatController::cancelRequested, w.worker, &EngineWorker::cancel);
  QObject::connect(w.worker, &EngineWorker::tokensArrived, &chats,
                   &ChatController::onTokensArrived);
  QObject::connect(w.worker, &EngineWorker::generationFinished, &chats,
                   &ChatController::onGenerationFinished);
}

// A keychain double: entries in memory; reads answer after `delay_ms` (a desktop keychain at
// start-up), or fail with `failure`.
class TestSecrets final : public SecretStore {
 public:
  int delay_ms = 0;
  QString failure;
  std::map<QString, QString> entries;
  int reads = 0;

  void read(const QString& key, QObject* context, Done done) override {
    ++reads;
    Answer answer;
    if (!failure.isEmpty()) {
      answer.status = Status::Failed;
      answer.error = failure;
    } else if (const auto it = entries.find(key); it != entries.end()) {
      answer.status = Status::Found;
      answer.text = it->second;
    }
    QTimer::singleShot(delay_ms, context, [done = std::move(done), answer] { done(answer); });
  }
  void write(const QString& key, const QString& text, QObject* context, Done done) override {
    if (text.isEmpty())
      entries.erase(key);
    else
      entries[key] = text;
    if (done)
      QTimer::singleShot(0, context, [done = std::move(done)] { done({Status::Found, {}, {}}); });
  }
};

inline GenerationRequest turn(qint64 chat, const QString& text, int max_tokens) {
  GenerationRequest r;
  r.chat_id = chat;
  r.messages = {{"user", text}};
  r.sampling.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  r.sampling.top_k = 1;
  return r;
}

inline QString textOf(const QSignalSpy& spy, qint64 chat) {
  QString text;
  for (const QList<QVariant>& args : spy)
    for (const TokenChunk& c : args[0].value<QList<TokenChunk>>())
      if (c.chat_id == chat) text += c.text;
  return text;
}

inline GenerationResult resultOf(const QSignalSpy& spy, qint64 chat) {
  for (const QList<QVariant>& args : spy) {
    const auto r = args[0].value<GenerationResult>();
    if (r.chat_id == chat) return r;
  }
  return {};
}

inline bool finishedChat(const QSignalSpy& spy, qint64 chat) {
  for (const QList<QVariant>& args : spy)
    if (args[0].value<GenerationResult>().chat_id == chat) return true;
  return false;
}

// Queues one fault for the proxy's next request ("status:401", "drop:700", …).
inline bool queueFault(int proxy_port, const QString& fault) {
  QProcess curl;
  curl.start(QStringLiteral("curl"),
             {QStringLiteral("-s"), QStringLiteral("-XPOST"),
              QStringLiteral("http://127.0.0.1:%1/__fault/%2").arg(proxy_port).arg(fault)});
  return curl.waitForFinished(10000) && curl.exitCode() == 0;
}

}  // namespace granule::app::test
