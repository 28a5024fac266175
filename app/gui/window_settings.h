// WindowSettings: how the window was left — theme, whether the memory dock is open, the
// window's size and place — and the global default sampling new chats start from, kept in
// the chat database's settings table so the next start looks the same.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QObject>
#include <QRect>

#include "chat_store.h"
#include "sampling_editor.h"
#include "worker_types.h"

namespace granule::app {

class WindowSettings : public QObject {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("Created by the application")
  Q_PROPERTY(QString theme READ theme WRITE setTheme NOTIFY themeChanged)
  Q_PROPERTY(bool dockExpanded READ dockExpanded WRITE setDockExpanded NOTIFY dockExpandedChanged)
  // The window's last geometry (an empty rect before the first close) and maximised state.
  Q_PROPERTY(QRect geometry READ geometry NOTIFY geometryChanged)
  Q_PROPERTY(bool maximized READ maximized NOTIFY geometryChanged)
  // Global default sampling: new chats start from these (a chat's drawer overrides them).
  Q_PROPERTY(granule::app::SamplingEditor* sampling READ samplingEditor CONSTANT)

 public:
  explicit WindowSettings(ChatStore& store, QObject* parent = nullptr);

  // "system", "light" or "dark".
  QString theme() const { return theme_; }
  void setTheme(const QString& theme);
  bool dockExpanded() const { return dock_expanded_; }
  void setDockExpanded(bool expanded);

  QRect geometry() const { return geometry_; }
  bool maximized() const { return maximized_; }
  // Called when the window closes; a size below the minimum is not kept.
  Q_INVOKABLE void saveGeometry(int x, int y, int width, int height, bool maximized);

  const SamplingSettings& sampling() const { return sampling_; }
  SamplingEditor* samplingEditor() { return &sampling_editor_; }

 Q_SIGNALS:
  void themeChanged();
  void dockExpandedChanged();
  void geometryChanged();
  void samplingChanged();

 private:
  void setSampling(const SamplingSettings& s);

  ChatStore& store_;
  QString theme_;
  bool dock_expanded_;
  QRect geometry_;
  bool maximized_ = false;
  SamplingSettings sampling_;
  SamplingEditor sampling_editor_;
};

}  // namespace granule::app
