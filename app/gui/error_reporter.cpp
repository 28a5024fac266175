// Banner state for errors.
#include "error_reporter.h"

#include "granule/log.h"

namespace granule::app {

void ErrorReporter::report(const QString& message, const QString& hint) {
  granule::logger("app")->warn("{}", message.toStdString());
  message_ = message;
  hint_ = hint;
  Q_EMIT changed();
}

void ErrorReporter::dismiss() {
  if (message_.isEmpty()) return;
  message_.clear();
  hint_.clear();
  Q_EMIT changed();
}

}  // namespace granule::app
