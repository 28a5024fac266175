// The presets' values. A repetition penalty above 1 keeps small models out of loops
// (the default SmolLM2 repeats one sentence at 1.0 and writes a coherent story at 1.1).
#include "sampling_presets.h"

#include <cmath>

namespace granule::app {
namespace {

struct Preset {
  const char* name;
  double temperature;
  qint32 top_k;
  double top_p;
  double min_p;
  double repetition_penalty;
};

constexpr Preset kPresets[] = {
    {"precise", 0.2, 20, 0.90, 0.10, 1.10},
    {"balanced", 0.7, 40, 0.95, 0.05, 1.10},
    {"creative", 1.0, 100, 0.98, 0.02, 1.05},
};

bool near(double a, double b) { return std::abs(a - b) < 1e-6; }

}  // namespace

QStringList samplingPresetNames() {
  QStringList names;
  for (const Preset& p : kPresets) names.append(QString::fromLatin1(p.name));
  return names;
}

std::optional<SamplingSettings> samplingPreset(const QString& name, SamplingSettings base) {
  for (const Preset& p : kPresets) {
    if (name != QLatin1String(p.name)) continue;
    base.temperature = p.temperature;
    base.top_k = p.top_k;
    base.top_p = p.top_p;
    base.min_p = p.min_p;
    base.repetition_penalty = p.repetition_penalty;
    return base;
  }
  return std::nullopt;
}

QString matchingSamplingPreset(const SamplingSettings& s) {
  for (const Preset& p : kPresets) {
    if (near(s.temperature, p.temperature) && s.top_k == p.top_k && near(s.top_p, p.top_p) &&
        near(s.min_p, p.min_p) && near(s.repetition_penalty, p.repetition_penalty))
      return QString::fromLatin1(p.name);
  }
  return {};
}

SamplingSettings defaultSamplingSettings() { return *samplingPreset(QStringLiteral("balanced")); }

}  // namespace granule::app
