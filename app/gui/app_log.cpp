// A Qt message handler writing to spdlog.
#include "app_log.h"

#include <QString>
#include <QtGlobal>

#include "granule/log.h"

namespace granule::app {
namespace {

void toSpdlog(QtMsgType type, const QMessageLogContext& context, const QString& message) {
  static const auto log = granule::logger("app");
  const std::string text = message.toStdString();
  const char* category = context.category ? context.category : "qt";
  switch (type) {
    case QtDebugMsg:
      log->debug("[{}] {}", category, text);
      break;
    case QtInfoMsg:
      log->info("[{}] {}", category, text);
      break;
    case QtWarningMsg:
      log->warn("[{}] {}", category, text);
      break;
    case QtCriticalMsg:
    case QtFatalMsg:
      log->error("[{}] {}", category, text);
      break;
  }
}

}  // namespace

void routeQtMessagesToLog() { qInstallMessageHandler(toSpdlog); }

}  // namespace granule::app
