// The Granule window: parses the command line, starts the application's services, shows
// Main.qml, and shuts down in a fixed order when the window closes.
#include <QtQml/qqmlextensionplugin.h>

#include <QCommandLineParser>
#include <QElapsedTimer>
#include <QGuiApplication>
#include <QQmlApplicationEngine>
#include <QQuickStyle>
#include <QQuickWindow>
#include <QStyleHints>
#include <QTimer>
#include <memory>

#include "app_log.h"
#include "application.h"
#ifdef GRANULE_HAVE_REMOTE
#include "remote_inference_engine.h"
#endif
#include "granule/log.h"
#include "quit_on_signal.h"
#include "window_screenshot.h"

Q_IMPORT_QML_PLUGIN(GranulePlugin)

namespace {

// --help and --version print anywhere, also without a display: they are answered by a
// QCoreApplication, before any platform plugin is needed.
bool asksHelpOrVersion(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const QByteArray arg(argv[i]);
    if (arg == "-h" || arg == "--help" || arg == "--help-all" || arg == "-v" || arg == "--version")
      return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const std::unique_ptr<QCoreApplication> app_holder =
      asksHelpOrVersion(argc, argv) ? std::make_unique<QCoreApplication>(argc, argv)
                                    : std::make_unique<QGuiApplication>(argc, argv);
  QCoreApplication& qt_app = *app_holder;
  QGuiApplication::setApplicationName(QStringLiteral("Granule"));
  QGuiApplication::setApplicationVersion(QStringLiteral(GRANULE_VERSION));
  QGuiApplication::setDesktopFileName(QStringLiteral("granule"));
  granule::app::routeQtMessagesToLog();
  granule::app::quitOnTerminationSignals();

  QCommandLineParser cli;
  cli.setApplicationDescription(QStringLiteral("Desktop chat for local language models"));
  cli.addHelpOption();
  cli.addVersionOption();
  const QCommandLineOption model_option(
      QStringLiteral("model"), QStringLiteral("GGUF model to load"), QStringLiteral("path"));
  const QCommandLineOption database_option(
      QStringLiteral("database"),
      QStringLiteral("Chat database (default: %1)").arg(granule::app::ChatStore::defaultPath()),
      QStringLiteral("path"));
  const QCommandLineOption theme_option(QStringLiteral("theme"),
                                        QStringLiteral("system, light or dark (remembered)"),
                                        QStringLiteral("scheme"));
  const QCommandLineOption verbose_option(QStringLiteral("verbose"),
                                          QStringLiteral("Log at debug level"));
  const QCommandLineOption replay_option(
      QStringLiteral("replay"),
      QStringLiteral("Show telemetry frames recorded as JSON lines instead of loading a model"),
      QStringLiteral("frames.jsonl"));
  const QCommandLineOption replay_speed_option(
      QStringLiteral("replay-speed"), QStringLiteral("Replay this many times faster (default 1)"),
      QStringLiteral("factor"), QStringLiteral("1"));
  const QCommandLineOption replay_loop_option(
      QStringLiteral("replay-loop"),
      QStringLiteral("Start the replay again at its end (default: hold the last frame)"));
  const QCommandLineOption screenshot_option(
      QStringLiteral("screenshot"),
      QStringLiteral("Save the window as a PNG after --screenshot-after-ms, then quit"),
      QStringLiteral("path"));
  const QCommandLineOption screenshot_dock_option(
      QStringLiteral("screenshot-dock"),
      QStringLiteral("With --screenshot: also save the memory dock alone"), QStringLiteral("path"));
  const QCommandLineOption screenshot_after_option(
      QStringLiteral("screenshot-after-ms"),
      QStringLiteral("Delay before --screenshot (default 3000)"), QStringLiteral("ms"),
      QStringLiteral("3000"));
  const QCommandLineOption screenshot_open_option(
      QStringLiteral("screenshot-open"),
      QStringLiteral("With --screenshot: open this dialog first (settings, models, hub)"),
      QStringLiteral("dialog"));
  cli.addOptions({model_option, database_option, theme_option, verbose_option, replay_option,
                  replay_speed_option, replay_loop_option, screenshot_option,
                  screenshot_dock_option, screenshot_after_option, screenshot_open_option});
  cli.process(qt_app);
  bool speed_ok = false;
  const double replay_speed = cli.value(replay_speed_option).toDouble(&speed_ok);
  if (!speed_ok || replay_speed <= 0) {
    granule::logger("app")->error("--replay-speed wants a positive number, not '{}'",
                                  cli.value(replay_speed_option).toStdString());
    return 2;
  }
  granule::set_log_level(cli.isSet(verbose_option) ? spdlog::level::debug : spdlog::level::info);

  // A blinking text cursor repaints the whole window twice a second, forever (on a software
  // renderer ~7% of a core while idle): the cursor stays steady, as GTK's does after a while.
  QGuiApplication::styleHints()->setCursorFlashTime(0);
  // Fusion renders the same offscreen, under Xvfb and on a desktop; the Theme sets its palette.
  QQuickStyle::setStyle(QStringLiteral("Fusion"));

  // Declared in this order so that they are destroyed in reverse: the QML engine (which
  // points at the services) before the services, the services before QGuiApplication.
#ifdef GRANULE_HAVE_REMOTE
  // A model path "URL#model" is a model on an OpenAI-compatible server (remote_inference_engine.h),
  // reached with the key and stall timeout of the endpoint at that URL (Settings → Endpoints,
  // the keychain). The lookup is set below, before the engine thread starts.
  auto endpoint_access = std::make_shared<granule::app::EndpointAccessLookup>();
  granule::app::Application granule_app(
      granule::app::remoteAwareEngineFactory(granule::app::granuleEngineFactory(),
                                             [endpoint_access](const std::string& url) {
                                               return *endpoint_access
                                                          ? (*endpoint_access)(url)
                                                          : granule::app::EndpointAccess{};
                                             }),
#else
  granule::app::Application granule_app(
      granule::app::granuleEngineFactory(),
#endif
      cli.isSet(database_option) ? cli.value(database_option)
                                 : granule::app::ChatStore::defaultPath());
#ifdef GRANULE_HAVE_REMOTE
  // Chats that run on an endpoint's model (Settings → Endpoints, the chat header's menu).
  granule_app.setRemoteEngineFactory(granule::app::remoteEngineFactory());
  *endpoint_access = granule_app.endpoints()->accessLookup();
#endif
  QQmlApplicationEngine qml;
  qml.addImportPath(QStringLiteral("qrc:/qt/qml"));
  if (cli.isSet(theme_option)) granule_app.windowSettings()->setTheme(cli.value(theme_option));
  qml.setInitialProperties(granule_app.windowProperties());
  qml.load(QUrl(QStringLiteral("qrc:/qt/qml/Granule/Main.qml")));
  if (qml.rootObjects().isEmpty()) {
    granule::logger("app")->error("the main window could not be created");
    return 1;
  }
  if (cli.isSet(replay_option)) {
    // A file that cannot be replayed is one line on stderr (the log) and in the banner.
    granule_app.startReplay(cli.value(replay_option), replay_speed, cli.isSet(replay_loop_option));
  } else {
    granule_app.start(cli.value(model_option));
  }
  if (cli.isSet(screenshot_option)) {
    auto* window = qobject_cast<QQuickWindow*>(qml.rootObjects().first());
    const QString dialog = cli.value(screenshot_open_option);
    const char* dialog_name = dialog == QLatin1String("settings") ? "settingsDialog"
                              : dialog == QLatin1String("models") ? "modelsPage"
                              : dialog == QLatin1String("hub")    ? "hubPage"
                                                                  : nullptr;
    if (window && dialog_name) {
      QTimer::singleShot(cli.value(screenshot_after_option).toInt() / 2, window,
                         [window, dialog_name] {
                           if (QObject* popup = window->findChild<QObject*>(dialog_name))
                             QMetaObject::invokeMethod(popup, "open");
                         });
    }
    if (window)
      granule::app::scheduleWindowScreenshot(
          window, {cli.value(screenshot_option), cli.value(screenshot_dock_option),
                   cli.value(screenshot_after_option).toInt(), true});
  }
  const int rc = QGuiApplication::exec();
  // The window is closed (or SIGINT/SIGTERM came): save the chats and join the engine
  // thread before QML and Qt go.
  QElapsedTimer shutdown_timer;
  shutdown_timer.start();
  granule_app.shutdown();
  granule::logger("app")->info("shut down in {} ms", shutdown_timer.elapsed());
  return rc;
}
