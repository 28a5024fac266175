// The named sampling presets (precise, balanced, creative) and the global default: one
// table in one place. When the engine's SamplingParams::preset(name) is available, this
// table becomes a translation of it.
#pragma once
#include <QStringList>
#include <optional>

#include "worker_types.h"

namespace granule::app {

// "precise", "balanced", "creative".
QStringList samplingPresetNames();
// The preset's temperature, top-k, top-p, min-p and repetition penalty over `base` (whose
// max tokens and seed it keeps); nullopt for an unknown name.
std::optional<SamplingSettings> samplingPreset(const QString& name, SamplingSettings base = {});
// The preset whose values `s` has, or "" when it matches none (custom).
QString matchingSamplingPreset(const SamplingSettings& s);
// What a new chat takes unless the user chose other defaults: "balanced".
SamplingSettings defaultSamplingSettings();

}  // namespace granule::app
