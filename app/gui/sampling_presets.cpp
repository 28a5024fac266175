// Presets, conversions and seed text over the engine's tables. Preset values are doubles in
// the engine's table, so the window shows and stores 0.3 where the engine runs 0.3f.
#include "sampling_presets.h"

namespace granule::app {
namespace {

const SamplingPreset* findPreset(const QString& name) {
  for (const SamplingPreset& p : kSamplingPresets)
    if (name == QLatin1String(p.name.data(), static_cast<qsizetype>(p.name.size()))) return &p;
  return nullptr;
}

const QString kRandomSeedText = QStringLiteral("random");

}  // namespace

QStringList samplingPresetNames() {
  QStringList names;
  for (const SamplingPreset& p : kSamplingPresets)
    names.append(QString::fromLatin1(p.name.data(), static_cast<qsizetype>(p.name.size())));
  return names;
}

std::optional<SamplingSettings> samplingPreset(const QString& name, SamplingSettings base) {
  const SamplingPreset* p = findPreset(name);
  if (!p) return std::nullopt;
  base.temperature = p->temperature;
  base.top_k = p->top_k;
  base.top_p = p->top_p;
  base.min_p = p->min_p;
  base.repetition_penalty = p->repetition_penalty;
  return base;
}

QString matchingSamplingPreset(const SamplingSettings& s) {
  const std::string_view name = SamplingParams::preset_name_of(toSamplingParams(s));
  return QString::fromLatin1(name.data(), static_cast<qsizetype>(name.size()));
}

SamplingParams toSamplingParams(const SamplingSettings& s) {
  // The window's sampling fields are a preset's fields: the engine converts them.
  SamplingParams p = SamplingParams::preset(
      SamplingPreset{"", s.temperature, s.top_k, s.top_p, s.min_p, s.repetition_penalty});
  p.max_tokens = s.max_tokens;
  p.seed = s.seed;
  return p;
}

QString seedText(quint64 seed) {
  return seed == kRandomSeed ? kRandomSeedText : QString::number(seed);
}

std::optional<quint64> seedFromText(const QString& text) {
  const QString t = text.trimmed();
  if (t.isEmpty() || t.compare(kRandomSeedText, Qt::CaseInsensitive) == 0) return kRandomSeed;
  bool ok = false;
  const quint64 seed = t.toULongLong(&ok);
  if (!ok || seed == kRandomSeed) return std::nullopt;
  return seed;
}

}  // namespace granule::app
