// WindowSettings: how the window was left — theme, whether the memory dock is open, the
// window's size and place — and the global default sampling new chats start from, kept in
// the chat database's settings table so the next start looks the same.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QObject>
#include <QRect>

#include "chat_store.h"
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
  Q_PROPERTY(double temperature READ temperature WRITE setTemperature NOTIFY samplingChanged)
  Q_PROPERTY(double topP READ topP WRITE setTopP NOTIFY samplingChanged)
  Q_PROPERTY(int topK READ topK WRITE setTopK NOTIFY samplingChanged)
  Q_PROPERTY(double minP READ minP WRITE setMinP NOTIFY samplingChanged)
  Q_PROPERTY(double repetitionPenalty READ repetitionPenalty WRITE setRepetitionPenalty NOTIFY
                 samplingChanged)
  Q_PROPERTY(int maxTokens READ maxTokens WRITE setMaxTokens NOTIFY samplingChanged)
  // The preset the values match ("precise", "balanced", "creative"), or "custom".
  Q_PROPERTY(QString samplingPreset READ samplingPreset NOTIFY samplingChanged)
  // The presets' names and "custom", for the preset box.
  Q_PROPERTY(QStringList samplingPresets READ samplingPresets CONSTANT)

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
  double temperature() const { return sampling_.temperature; }
  void setTemperature(double v);
  double topP() const { return sampling_.top_p; }
  void setTopP(double v);
  int topK() const { return sampling_.top_k; }
  void setTopK(int v);
  double minP() const { return sampling_.min_p; }
  void setMinP(double v);
  double repetitionPenalty() const { return sampling_.repetition_penalty; }
  void setRepetitionPenalty(double v);
  int maxTokens() const { return sampling_.max_tokens; }
  void setMaxTokens(int v);
  QString samplingPreset() const;
  QStringList samplingPresets() const;
  Q_INVOKABLE void applySamplingPreset(const QString& name);

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
};

}  // namespace granule::app
