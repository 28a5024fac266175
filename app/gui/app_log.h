// Routes Qt's own messages (QML warnings, qDebug) into the "app" spdlog logger, so the
// application has one log.
#pragma once

namespace granule::app {

void routeQtMessagesToLog();

}  // namespace granule::app
