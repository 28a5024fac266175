// The window's Hub page end to end against the fake hub (tests/hub/fake_hub.py): search,
// a repository's quants with their fit read from headers (the largest that fits
// recommended), a download with progress, then Load through the fit preview and a chat on
// the downloaded model with the real engine. Saves screenshots of each stage.
#include <QtQml/qqmlextensionplugin.h>

#include <QDir>
#include <QProcess>
#include <QQmlApplicationEngine>
#include <QQuickStyle>
#include <QQuickWindow>
#include <QTemporaryDir>
#include <QtTest>
#include <set>

#include "application.h"
#include "hub_controller.h"
#include "inference_engine.h"

Q_IMPORT_QML_PLUGIN(GranulePlugin)

using namespace granule::app;

namespace {

int distinctColours(const QImage& image) {
  std::set<QRgb> colours;
  for (int y = 0; y < image.height(); y += 7)
    for (int x = 0; x < image.width(); x += 7) colours.insert(image.pixel(x, y));
  return static_cast<int>(colours.size());
}

int rowOf(const HubQuantModel& quants, const QString& label) {
  for (int i = 0; i < quants.count(); ++i)
    if (quants.rows()[static_cast<size_t>(i)].label == label) return i;
  return -1;
}

}  // namespace

class HubPageTest : public QObject {
  Q_OBJECT

  QTemporaryDir dir_;
  QProcess hub_;
  QString endpoint_;

  void control(const QByteArray& json) {
    QProcess p;
    p.start(QStringLiteral("python3"),
            {QStringLiteral("-c"),
             QStringLiteral("import urllib.request,sys; urllib.request.urlopen(urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), method='POST'))"),
             endpoint_ + QStringLiteral("/_control"), QString::fromUtf8(json)});
    QVERIFY(p.waitForFinished(10000));
    QCOMPARE(p.exitCode(), 0);
  }

  void save(QQuickWindow* window, const QString& name) {
    QTest::qWait(200);
    const QImage image = window->grabWindow();
    QVERIFY(!image.isNull());
    QVERIFY2(distinctColours(image) > 40, qPrintable(name + " looks blank"));
    QDir().mkpath(QStringLiteral(GRANULE_SCREENSHOT_DIR));
    const QString path = QStringLiteral(GRANULE_SCREENSHOT_DIR) + QLatin1Char('/') + name;
    QVERIFY(image.save(path));
    qInfo("saved %s", qPrintable(path));
  }

 private Q_SLOTS:
  void initTestCase() {
    QQuickStyle::setStyle(QStringLiteral("Fusion"));
    QVERIFY(dir_.isValid());
    QCOMPARE(QProcess::execute(QStringLiteral(GRANULE_MAKE_HUB_REPOS), {dir_.filePath("repos")}), 0);
    hub_.start(QStringLiteral("python3"), {QStringLiteral(GRANULE_FAKE_HUB), QStringLiteral("--root"),
                                           dir_.filePath("repos"), QStringLiteral("--idle"), QStringLiteral("200")});
    QVERIFY(hub_.waitForReadyRead(20000));
    const QByteArray line = hub_.readLine().trimmed();
    QVERIFY2(line.startsWith("PORT "), line.constData());
    endpoint_ = QStringLiteral("http://127.0.0.1:") + QString::fromLatin1(line.mid(5));
    qputenv("HF_ENDPOINT", endpoint_.toUtf8());
    qputenv("HF_HUB_CACHE", dir_.filePath("hf-cache").toUtf8());
    qputenv("HF_HOME", dir_.filePath("hf-home").toUtf8());
    qunsetenv("HF_TOKEN");
    // No default model: the window starts empty, as for a newcomer.
    qputenv("XDG_DATA_HOME", dir_.filePath("data").toUtf8());
    qunsetenv("GRANULE_DEFAULT_MODEL");
  }
  void cleanupTestCase() {
    hub_.terminate();
    hub_.waitForFinished(5000);
  }

  void searchFitDownloadLoadChat() {
    Application app(granuleEngineFactory(), dir_.filePath("granule.sqlite"));
    QQmlApplicationEngine qml;
    qml.addImportPath(QStringLiteral("qrc:/qt/qml"));
    qml.setInitialProperties(app.windowProperties());
    qml.load(QUrl(QStringLiteral("qrc:/qt/qml/Granule/Main.qml")));
    QVERIFY(!qml.rootObjects().isEmpty());
    auto* window = qobject_cast<QQuickWindow*>(qml.rootObjects().first());
    QVERIFY(window);
    app.start();
    HubController* hub = app.hub();
    QVERIFY(hub->available());
    // The fit is planned for the budget, context and chats the settings hold.
    app.model()->setVramBudgetBytes(8.0 * (1ull << 30));
    app.model()->setContextLength(8192);
    app.model()->setMaxChats(1);

    QObject* page = window->findChild<QObject*>(QStringLiteral("hubPage"));
    QVERIFY(page);
    QMetaObject::invokeMethod(page, "open");
    if (QObject* query = window->findChild<QObject*>(QStringLiteral("hubQuery")))
      query->setProperty("text", QStringLiteral("shaped"));
    hub->search(QStringLiteral("shaped"), false);
    QTRY_COMPARE_WITH_TIMEOUT(hub->searchResults()->count(), 2, 20000);
    QCOMPARE(hub->searchResults()->rows()[0].repo, QStringLiteral("granule-test/Llama-3-8B-Shaped-GGUF"));
    QVERIFY(hub->searchResults()->rows()[0].supported);
    QVERIFY(!hub->searchResults()->rows()[1].supported);
    save(window, QStringLiteral("hub-search.png"));

    hub->openRepo(QStringLiteral("granule-test/Llama-3-8B-Shaped-GGUF"));
    QTRY_VERIFY_WITH_TIMEOUT(hub->quants()->count() == 6 && !hub->busy(), 60000);
    const HubQuantModel& quants = *hub->quants();
    for (const HubQuantRow& r : quants.rows()) QVERIFY2(r.fitted, qPrintable(r.label + ": " + r.error));
    const int q6 = rowOf(quants, QStringLiteral("Q6_K"));
    const int q8 = rowOf(quants, QStringLiteral("Q8_0"));
    QVERIFY(quants.rows()[static_cast<size_t>(q6)].recommended);
    QVERIFY(quants.rows()[static_cast<size_t>(q6)].fits);
    QVERIFY(!quants.rows()[static_cast<size_t>(q8)].fits);
    QVERIFY(quants.rows()[static_cast<size_t>(q8)].loads);
    QVERIFY(quants.rows()[static_cast<size_t>(q8)].streamText.contains(QStringLiteral("tokens/s")));
    QVERIFY(quants.rows()[static_cast<size_t>(q6)].headerBytes < 16.0 * (1 << 20));
    save(window, QStringLiteral("hub-quants-fit.png"));

    // A small model to download, slowly enough to see the progress.
    if (QObject* query = window->findChild<QObject*>(QStringLiteral("hubQuery")))
      query->setProperty("text", QStringLiteral("tiny"));
    hub->search(QStringLiteral("tiny"), false);
    QTRY_VERIFY_WITH_TIMEOUT(hub->searchResults()->count() >= 1 && !hub->busy(), 20000);
    app.model()->setVramBudgetBytes(0);  // this machine's own device for the real load
    hub->openRepo(QStringLiteral("granule-test/Tiny-Chat-GGUF"));
    QTRY_VERIFY_WITH_TIMEOUT(hub->quants()->count() == 2 && !hub->busy(), 60000);
    const int tiny = rowOf(*hub->quants(), QStringLiteral("Q8_0"));
    QVERIFY(tiny >= 0);
    QVERIFY(hub->quants()->rows()[static_cast<size_t>(tiny)].fits);
    control(R"({"throttle": 400000})");
    hub->download(tiny);
    QTRY_VERIFY_WITH_TIMEOUT(hub->downloads()->count() == 1 &&
                                 hub->downloads()->rows()[0].doneBytes > 300000 &&
                                 hub->downloads()->rows()[0].bytesPerSecond > 0,
                             30000);
    QCOMPARE(hub->downloads()->rows()[0].state, QStringLiteral("downloading"));
    save(window, QStringLiteral("hub-download-progress.png"));
    QTRY_COMPARE_WITH_TIMEOUT(hub->downloads()->rows()[0].state, QStringLiteral("done"), 60000);
    control(R"({"reset": true})");
    const QString path = hub->downloads()->rows()[0].path;
    QVERIFY2(path.startsWith(dir_.filePath("hf-cache")), qPrintable(path));
    // The quant's row now offers the cached file.
    QTRY_VERIFY(hub->quants()->rows()[static_cast<size_t>(tiny)].cached);
    QCOMPARE(hub->quants()->rows()[static_cast<size_t>(tiny)].cachedPath, path);

    // Load: the fit preview, then the model, then a chat.
    QMetaObject::invokeMethod(page, "close");
    hub->load(0);
    QTRY_COMPARE_WITH_TIMEOUT(app.model()->status(), ModelController::Status::Previewing, 30000);
    app.model()->confirmLoad();
    QTRY_VERIFY_WITH_TIMEOUT(app.model()->ready(), 60000);
    QCOMPARE(app.model()->modelPath(), path);
    ChatController* chats = app.chats();
    chats->newChat();
    chats->samplingEditor()->setMaxTokens(24);
    chats->send(QStringLiteral("Hello from the Hub page"));
    QTRY_VERIFY_WITH_TIMEOUT(chats->generatingCount() == 0, 60000);
    save(window, QStringLiteral("hub-loaded-chat.png"));
    app.shutdown();
  }
};

QTEST_MAIN(HubPageTest)
#include "app_hub_test.moc"
