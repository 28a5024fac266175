// ErrorReporter: the one place engine and storage errors go to be shown in the window's
// banner (never a dialog that blocks, never a crash).
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QObject>

namespace granule::app {

class ErrorReporter : public QObject {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("Errors are reported by the application")
  Q_PROPERTY(QString message READ message NOTIFY changed)
  Q_PROPERTY(QString hint READ hint NOTIFY changed)
  Q_PROPERTY(bool active READ active NOTIFY changed)

 public:
  using QObject::QObject;
  QString message() const { return message_; }
  QString hint() const { return hint_; }
  bool active() const { return !message_.isEmpty(); }

  // `message` is the engine's one-line text; `hint` says what the user can do about it.
  Q_INVOKABLE void report(const QString& message, const QString& hint = {});
  Q_INVOKABLE void dismiss();

 Q_SIGNALS:
  void changed();

 private:
  QString message_;
  QString hint_;
};

}  // namespace granule::app
