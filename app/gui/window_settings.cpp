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
const QString kSamplingKey = QStringLiteral("sampling/defaults");
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

// "t k p minp rep max seed"; a value from before seeds were kept has no seed (random).
SamplingSettings parseSampling(const QString& text) {
  const QStringList parts = text.split(QLatin1Char(' '), Qt::SkipEmptyParts);
  if (parts.size() != 6 && parts.size() != 7) return {};
  bool ok[6];
  SamplingSettings read{parts[0].toDouble(&ok[0]), parts[1].toInt(&ok[1]),
                        parts[2].toDouble(&ok[2]), parts[3].toDouble(&ok[3]),
                        parts[4].toDouble(&ok[4]), parts[5].toInt(&ok[5])};
  const std::optional<quint64> seed = parts.size() == 7 ? seedFromText(parts[6]) : kRandomSeed;
  if (!seed || !std::all_of(std::begin(ok), std::end(ok), [](bool b) { return b; })) return {};
  read.seed = *seed;
  return read;
}
}  // namespace

WindowSettings::WindowSettings(ChatStore& store, QObject* parent)
    : QObject(parent),
      store_(store),
      theme_(store.setting(kThemeKey, QStringLiteral("system"))),
      dock_expanded_(store.setting(kDockKey, QStringLiteral("1")) == QLatin1String("1")),
      geometry_(parseGeometry(store.setting(kGeometryKey))),
      maximized_(store.setting(kMaximizedKey, QStringLiteral("0")) == QLatin1String("1")),
      sampling_(parseSampling(store.setting(kSamplingKey))),
      sampling_editor_([this]() -> const SamplingSettings& { return sampling_; },
                       [this](const SamplingSettings& s) { setSampling(s); }) {
  connect(this, &WindowSettings::samplingChanged, &sampling_editor_, &SamplingEditor::changed);
}

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
  store_.setSetting(kSamplingKey, QStringLiteral("%1 %2 %3 %4 %5 %6 %7")
                                      .arg(s.temperature)
                                      .arg(s.top_k)
                                      .arg(s.top_p)
                                      .arg(s.min_p)
                                      .arg(s.repetition_penalty)
                                      .arg(s.max_tokens)
                                      .arg(seedText(s.seed)));
  Q_EMIT samplingChanged();
}

}  // namespace granule::app
