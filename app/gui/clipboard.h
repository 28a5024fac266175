// Clipboard: copying text from QML (code blocks, messages), which has no clipboard API.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QObject>

namespace granule::app {

class Clipboard : public QObject {
  Q_OBJECT
  QML_ELEMENT
  QML_SINGLETON

 public:
  using QObject::QObject;
  Q_INVOKABLE void copy(const QString& text) const;
  Q_INVOKABLE QString text() const;
};

}  // namespace granule::app
