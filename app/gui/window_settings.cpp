// Window state in the settings table.
#include "window_settings.h"

namespace granule::app {
namespace {
const QString kThemeKey = QStringLiteral("window/theme");
const QString kDockKey = QStringLiteral("window/dock_expanded");
}  // namespace

WindowSettings::WindowSettings(ChatStore& store, QObject* parent)
    : QObject(parent),
      store_(store),
      theme_(store.setting(kThemeKey, QStringLiteral("system"))),
      dock_expanded_(store.setting(kDockKey, QStringLiteral("1")) == QLatin1String("1")) {}

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

}  // namespace granule::app
