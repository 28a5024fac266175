// WindowSettings: how the window was left — theme and whether the memory dock is open —
// kept in the chat database's settings table so the next start looks the same.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QObject>

#include "chat_store.h"

namespace granule::app {

class WindowSettings : public QObject {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("Created by the application")
  Q_PROPERTY(QString theme READ theme WRITE setTheme NOTIFY themeChanged)
  Q_PROPERTY(bool dockExpanded READ dockExpanded WRITE setDockExpanded NOTIFY dockExpandedChanged)

 public:
  explicit WindowSettings(ChatStore& store, QObject* parent = nullptr);

  // "system", "light" or "dark".
  QString theme() const { return theme_; }
  void setTheme(const QString& theme);
  bool dockExpanded() const { return dock_expanded_; }
  void setDockExpanded(bool expanded);

 Q_SIGNALS:
  void themeChanged();
  void dockExpandedChanged();

 private:
  ChatStore& store_;
  QString theme_;
  bool dock_expanded_;
};

}  // namespace granule::app
