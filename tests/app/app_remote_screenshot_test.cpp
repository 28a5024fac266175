// The window on a remote engine, rendered offscreen and saved as PNGs under the build
// directory (GRANULE_SCREENSHOT_DIR): a chat streaming from `granule-cli serve`, and from
// llama.cpp's llama-server when `setup.sh llamaserver` built it, with the Server panel showing
// that server's /metrics (what it does not expose reads "unavailable"). While the window's
// chat runs, a second client streams from the same server, so its running requests show both.
// Per-chat engines: a local chat and a chat on the Granule server's model side by side (each
// chat open in turn, its header naming its engine, the panels following it), the header's
// engine menu open, and Settings' Endpoints listing the server's models.
#include <QtQml/qqmlextensionplugin.h>

#include <QDir>
#include <QProcess>
#include <QQmlApplicationEngine>
#include <QQuickItem>
#include <QQuickStyle>
#include <QQuickWindow>
#include <QTcpServer>
#include <QTemporaryDir>
#include <QtTest>
#include <algorithm>
#include <memory>

#include "application.h"
#include "remote_inference_engine.h"
#include "remote_test_support.h"
#include "window_test_support.h"

Q_IMPORT_QML_PLUGIN(GranulePlugin)

using namespace granule::app;
using namespace granule::app::test;

class RemoteScreenshotTest : public QObject {
  Q_OBJECT

  QString model_;

  static void save(QQuickWindow* window, const QString& name) { saveScreenshot(window, name); }

  // A local chat and a chat on the server at `port` in one window, at once.
  void shootPerChat(int port, const QString& model_id) {
    QTemporaryDir dir;
    Application app(granuleEngineFactory(), dir.filePath(QStringLiteral("granule.sqlite")));
    app.setRemoteEngineFactory(remoteEngineFactory());
    QQmlApplicationEngine qml;
    qml.addImportPath(QStringLiteral("qrc:/qt/qml"));
    qml.setInitialProperties(app.windowProperties());
    qml.load(QUrl(QStringLiteral("qrc:/qt/qml/Granule/Main.qml")));
    QVERIFY(!qml.rootObjects().isEmpty());
    auto* window = qobject_cast<QQuickWindow*>(qml.rootObjects().first());
    window->resize(1400, 900);
    app.start(model_);
    QTRY_VERIFY_WITH_TIMEOUT(app.model()->ready(), 60000);
    EndpointsController* endpoints = app.endpoints();
    const QString id = endpoints->add(QStringLiteral("granule-box"),
                                      QStringLiteral("http://127.0.0.1:%1/v1").arg(port), {});
    QTRY_VERIFY_WITH_TIMEOUT(endpoints->engineChoices().size() == 1, 20000);
    const QString ref = endpoints->engineChoices()[0].toMap()[QStringLiteral("ref")].toString();

    ChatController* chats = app.chats();
    const qint64 local = chats->newChat();
    chats->send(QStringLiteral("Name three rivers."));
    const qint64 remote = chats->newChat();
    QVERIFY(remote != local);
    chats->setCurrentEngine(ref);
    chats->send(QStringLiteral("Explain what a KV cache is, in three sentences."));
    QTRY_VERIFY_WITH_TIMEOUT(chats->generatingCount() == 2, 10000);
    QTRY_VERIFY_WITH_TIMEOUT(chats->generatingCount() == 0, 180000);
    for (qint64 chat : {local, remote}) {
      const StoredMessage answer = chats->messagesOf(chat)->message(1);
      QVERIFY2(answer.content.size() > 10 && answer.finish_reason != QLatin1String("error"),
               qPrintable(answer.content));
    }
    // The endpoint's chat open: its header names the endpoint's model; the Server panel.
    QQuickItem* button = nullptr;
    QTRY_VERIFY_WITH_TIMEOUT(
        (button = findItem(window->contentItem(), QStringLiteral("engineButton"))) != nullptr,
        10000);
    QTRY_VERIFY_WITH_TIMEOUT(
        button->property("text").toString().startsWith(QStringLiteral("granule-box · ")), 5000);
    QTRY_VERIFY_WITH_TIMEOUT(
        findItem(window->contentItem(), QStringLiteral("remoteRunning")) != nullptr, 10000);
    QTest::qWait(1500);
    save(window, QStringLiteral("remote-per-chat-endpoint.png"));
    // Its engine menu: the local engine and the endpoint's model, the latter checked.
    QMetaObject::invokeMethod(button, "clicked");
    QTest::qWait(800);
    save(window, QStringLiteral("remote-per-chat-menu.png"));
    QTest::keyClick(window, Qt::Key_Escape);
    // The local chat open: the local engine's panels again.
    chats->selectChat(local);
    QTRY_VERIFY_WITH_TIMEOUT(
        findItem(window->contentItem(), QStringLiteral("remoteRunning")) == nullptr, 10000);
    QTRY_COMPARE_WITH_TIMEOUT(button->property("text").toString(),
                              QStringLiteral("Loaded model  ▾"), 5000);
    QTest::qWait(500);
    save(window, QStringLiteral("remote-per-chat-local.png"));
    // Settings → Endpoints.
    QObject* settings = nullptr;
    for (QObject* o : window->findChildren<QObject*>(QStringLiteral("settingsDialog")))
      settings = o;
    QVERIFY(settings);
    QMetaObject::invokeMethod(settings, "open");
    QQuickItem* status = nullptr;
    // A dialog lives in the window's overlay, beside the content.
    QQuickItem* root = window->contentItem()->parentItem() ? window->contentItem()->parentItem()
                                                           : window->contentItem();
    QTRY_VERIFY_WITH_TIMEOUT((status = findItem(root, QStringLiteral("endpointStatus"))) != nullptr,
                             10000);
    // Scroll the dialog to the endpoints (again while it opens and lays out: its height grows
    // during the enter transition): the Endpoints title a little below the top.
    QQuickItem* flickable = status;
    while (flickable && !flickable->inherits("QQuickFlickable"))
      flickable = flickable->parentItem();
    QVERIFY(flickable);
    auto* content = flickable->property("contentItem").value<QQuickItem*>();
    QVERIFY(content);
    for (int i = 0; i < 6; ++i) {
      QTest::qWait(300);
      const double at = status->mapToItem(content, QPointF(0, 0)).y() - 140;
      const double most = flickable->property("contentHeight").toDouble() -
                          flickable->property("height").toDouble();
      flickable->setProperty("contentY", std::clamp(at, 0.0, std::max(0.0, most)));
    }
    QTest::qWait(300);
    QVERIFY2(status->property("text").toString().startsWith(QStringLiteral("reachable")),
             qPrintable(status->property("text").toString()));
    save(window, QStringLiteral("remote-settings-endpoints.png"));
    (void)id;
    window->close();
    app.shutdown();
  }

  // Chats once on the server at `port` (model id `model_id`) and saves `name`.
  void shoot(int port, const QString& model_id, const QString& name, const QString& server_name) {
    QTemporaryDir dir;
    Application app(remoteAwareEngineFactory({}, {}),
                    dir.filePath(QStringLiteral("granule.sqlite")));
    QQmlApplicationEngine qml;
    qml.addImportPath(QStringLiteral("qrc:/qt/qml"));
    qml.setInitialProperties(app.windowProperties());
    qml.load(QUrl(QStringLiteral("qrc:/qt/qml/Granule/Main.qml")));
    QVERIFY(!qml.rootObjects().isEmpty());
    auto* window = qobject_cast<QQuickWindow*>(qml.rootObjects().first());
    window->resize(1400, 900);
    app.start(QStringLiteral("http://127.0.0.1:%1/v1#%2").arg(port).arg(model_id));
    QTRY_VERIFY_WITH_TIMEOUT(app.model()->ready(), 60000);
    // Another client of the same server, streaming a long answer meanwhile.
    QProcess other;
    other.start(
        QStringLiteral("curl"),
        {QStringLiteral("-sN"), QStringLiteral("http://127.0.0.1:%1/v1/chat/completions").arg(port),
         QStringLiteral("-H"), QStringLiteral("Content-Type: application/json"),
         QStringLiteral("-d"),
         QStringLiteral(
             R"({"model":"%1","messages":[{"role":"user","content":"Tell a long story about a lighthouse."}],"max_tokens":300,"stream":true})")
             .arg(model_id)});
    ChatController* chats = app.chats();
    chats->newChat();
    chats->send(QStringLiteral("Explain what a KV cache is, in three sentences."));
    QTRY_VERIFY_WITH_TIMEOUT(chats->generatingCount() == 0, 120000);
    // The panel after at least two scrapes (one a second), the other client still running.
    QQuickItem* running = nullptr;
    QTRY_VERIFY_WITH_TIMEOUT(
        (running = findItem(window->contentItem(), QStringLiteral("remoteRunning"))) != nullptr,
        10000);
    QTest::qWait(2500);
    const QVariantMap remote = app.telemetry()->latest().remote;
    QCOMPARE(remote.value(QStringLiteral("server")).toString(), server_name);
    QVERIFY2(remote.contains(QStringLiteral("running")),
             qPrintable(remote.value(QStringLiteral("error")).toString()));
    qInfo("%s: running %s, waiting %s, KV usage %s, generation %s tok/s", qPrintable(server_name),
          qPrintable(remote.value(QStringLiteral("running")).toString()),
          qPrintable(remote.value(QStringLiteral("waiting")).toString()),
          remote.contains(QStringLiteral("kvUsage"))
              ? qPrintable(remote.value(QStringLiteral("kvUsage")).toString())
              : "unavailable",
          qPrintable(remote.value(QStringLiteral("generationTokensPerSecond")).toString()));
    save(window, name);
    // The chat and its answer are in the database.
    const qint64 chat = chats->conversations()->idAt(0);
    QVERIFY(chats->messagesOf(chat)->message(1).content.size() > 10);
    other.kill();
    other.waitForFinished(5000);
    window->close();
    app.shutdown();
  }

 private Q_SLOTS:
  void initTestCase() {
    QQuickStyle::setStyle(QStringLiteral("Fusion"));
    model_ = defaultModel();
    if (model_.isEmpty()) QSKIP("the default model is absent (bash packaging/setup.sh model)");
  }

  void granuleServer() {
    Child s;
    QVERIFY(s.serve(model_, 1024, 4));
    shoot(s.port, QFileInfo(model_).completeBaseName(), QStringLiteral("remote-granule.png"),
          QStringLiteral("Granule"));
    shootPerChat(s.port, QFileInfo(model_).completeBaseName());
  }

  void llamaServer() {
    const QString bin = llamaServerBinary();
    if (bin.isEmpty()) QSKIP("llama-server is not built (bash packaging/setup.sh llamaserver)");
    Child s;  // not start()ed: llama-server prints no URL line; its port is ours
    s.port = freePort();
    s.process->setProcessChannelMode(QProcess::ForwardedErrorChannel);
    s.process->start(
        bin,
        {QStringLiteral("-m"), model_, QStringLiteral("--host"), QStringLiteral("127.0.0.1"),
         QStringLiteral("--port"), QString::number(s.port), QStringLiteral("-c"),
         QStringLiteral("2048"), QStringLiteral("-np"), QStringLiteral("2"), QStringLiteral("-t"),
         QStringLiteral("2"), QStringLiteral("--metrics"), QStringLiteral("--no-webui"),
         QStringLiteral("--alias"), QStringLiteral("SmolLM2-135M")});
    QVERIFY(s.process->waitForStarted(10000));
    QVERIFY(waitHealthy(QStringLiteral("http://127.0.0.1:%1/health").arg(s.port), 120000));
    shoot(s.port, QStringLiteral("SmolLM2-135M"), QStringLiteral("remote-llama-server.png"),
          QStringLiteral("llama-server"));
  }
};

QTEST_MAIN(RemoteScreenshotTest)
#include "app_remote_screenshot_test.moc"
