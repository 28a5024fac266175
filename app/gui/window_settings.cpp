// Window state and default sampling in the settings table.
#include "window_settings.h"

#include <algorithm>

#include "sampling_presets.h"

namespace granule::app {
namespace {
const QString kThemeKey = QStringLiteral("window/theme");
const QString kDockKey = QStringLiteral("window/dock_expanded");
const QString kGeometryKey = QStringLiteral("window/geometry");  // "x y width height"
const QString kMaximizedKey = QStringLiteral("window/maximized");
const QString kSamplingKey = QStringLiteral("sampling/defaults");  // "t k p minp rep max"
constexpr int kMinimumWidth = 900;
constexpr int kMinimumHeight = 560;

QRect parseGeometry(const QString& text) {
  const QStringList parts = text.split(QLatin1Char(' '), Qt::SkipEmptyParts);
  if (parts.size() != 4) return {};
  int v[4];
  for (int i = 0; i < 4; ++i) {
    bool ok = false;
    v[i] = parts[i].toInt(&ok);
    if (!ok) return {};
  }
  if (v[2] < kMinimumWidth || v[3] < kMinimumHeight) return {};
  return QRect(v[0], v[1], v[2], v[3]);
}

SamplingSettings parseSampling(const QString& text) {
  SamplingSettings s = defaultSamplingSettings();
  const QStringList parts = text.split(QLatin1Char(' '), Qt::SkipEmptyParts);
  if (parts.size() != 6) return s;
  bool ok[6];
  const SamplingSettings read{parts[0].toDouble(&ok[0]),
                              parts[1].toInt(&ok[1]),
                              parts[2].toDouble(&ok[2]),
                              parts[3].toDouble(&ok[3]),
                              parts[4].toDouble(&ok[4]),
                              parts[5].toInt(&ok[5]),
                              0};
  return std::all_of(std::begin(ok), std::end(ok), [](bool b) { return b; }) ? read : s;
}
}  // namespace

WindowSettings::WindowSettings(ChatStore& store, QObject* parent)
    : QObject(parent),
      store_(store),
      theme_(store.setting(kThemeKey, QStringLiteral("system"))),
      dock_expanded_(store.setting(kDockKey, QStringLiteral("1")) == QLatin1String("1")),
      geometry_(parseGeometry(store.setting(kGeometryKey))),
      maximized_(store.setting(kMaximizedKey, QStringLiteral("0")) == QLatin1String("1")),
      sampling_(parseSampling(store.setting(kSamplingKey))) {}

void WindowSettings::setTheme(const QString& theme) {
  if (theme == theme_ || !QStringList{"system", "light", "dark"}.contains(theme)) return;
  theme_ = theme;
  store_.setSetting(kThemeKey, theme);
  Q_EMIT themeChanged();
}

void WindowSettings::setDockExpanded(bool expanded) {
  if (expanded == dock_expanded_) return;
  dock_expanded_ = expanded;
  store_.setSetting(kDockKey, expanded ? QStringLiteral("1") : QStringLiteral("0"));
  Q_EMIT dockExpandedChanged();
}

void WindowSettings::saveGeometry(int x, int y, int width, int height, bool maximized) {
  // A maximised window keeps the normal geometry it had before, so un-maximising restores it.
  if (!maximized && width >= kMinimumWidth && height >= kMinimumHeight) {
    geometry_ = QRect(x, y, width, height);
    store_.setSetting(kGeometryKey,
                      QStringLiteral("%1 %2 %3 %4").arg(x).arg(y).arg(width).arg(height));
  }
  maximized_ = maximized;
  store_.setSetting(kMaximizedKey, maximized ? QStringLiteral("1") : QStringLiteral("0"));
  Q_EMIT geometryChanged();
}

void WindowSettings::setSampling(const SamplingSettings& s) {
  sampling_ = s;
  store_.setSetting(kSamplingKey, QStringLiteral("%1 %2 %3 %4 %5 %6")
                                      .arg(s.temperature)
                                      .arg(s.top_k)
                                      .arg(s.top_p)
                                      .arg(s.min_p)
                                      .arg(s.repetition_penalty)
                                      .arg(s.max_tokens));
  Q_EMIT samplingChanged();
}

void WindowSettings::setTemperature(double v) {
  SamplingSettings s = sampling_;
  s.temperature = std::clamp(v, 0.0, 2.0);
  if (s.temperature != sampling_.temperature) setSampling(s);
}
void WindowSettings::setTopP(double v) {
  SamplingSettings s = sampling_;
  s.top_p = std::clamp(v, 0.0, 1.0);
  if (s.top_p != sampling_.top_p) setSampling(s);
}
void WindowSettings::setTopK(int v) {
  SamplingSettings s = sampling_;
  s.top_k = std::clamp(v, 0, 1000);
  if (s.top_k != sampling_.top_k) setSampling(s);
}
void WindowSettings::setMinP(double v) {
  SamplingSettings s = sampling_;
  s.min_p = std::clamp(v, 0.0, 1.0);
  if (s.min_p != sampling_.min_p) setSampling(s);
}
void WindowSettings::setRepetitionPenalty(double v) {
  SamplingSettings s = sampling_;
  s.repetition_penalty = std::clamp(v, 0.5, 2.0);
  if (s.repetition_penalty != sampling_.repetition_penalty) setSampling(s);
}
void WindowSettings::setMaxTokens(int v) {
  SamplingSettings s = sampling_;
  s.max_tokens = std::clamp(v, 1, 1 << 20);
  if (s.max_tokens != sampling_.max_tokens) setSampling(s);
}

QString WindowSettings::samplingPreset() const {
  const QString name = matchingSamplingPreset(sampling_);
  return name.isEmpty() ? QStringLiteral("custom") : name;
}

QStringList WindowSettings::samplingPresets() const {
  return samplingPresetNames() << QStringLiteral("custom");
}

void WindowSettings::applySamplingPreset(const QString& name) {
  if (const auto preset = granule::app::samplingPreset(name, sampling_)) setSampling(*preset);
}

}  // namespace granule::app
