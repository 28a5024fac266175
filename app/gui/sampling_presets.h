// The window's side of the engine's sampling rules (granule/sampling.h is the one source):
// the presets, defaults and ranges are the engine's tables; SamplingSettings converts to the
// engine's SamplingParams; a seed reads and writes as text, "random" for kRandomSeed.
#pragma once
#include <QString>
#include <QStringList>
#include <optional>

#include "granule/sampling.h"
#include "worker_types.h"

namespace granule::app {

// The engine's preset names, in its order ("precise", "balanced", "creative", "greedy").
QStringList samplingPresetNames();
// The engine's preset over `base`: its temperature, top-k, top-p, min-p and repetition
// penalty; `base`'s max tokens and seed are kept. nullopt for an unknown name.
std::optional<SamplingSettings> samplingPreset(const QString& name, SamplingSettings base = {});
// The engine's name for the preset whose values `s` has, or "" when it matches none.
QString matchingSamplingPreset(const SamplingSettings& s);
// What the engine runs for these settings (the fields the window does not set keep the
// engine's defaults; the seed stays kRandomSeed for the engine to draw).
SamplingParams toSamplingParams(const SamplingSettings& s);

// "random" for kRandomSeed, else the seed's digits.
QString seedText(quint64 seed);
// "random" or "" (trimmed): kRandomSeed; the digits of a 64-bit seed other than kRandomSeed:
// that seed; anything else: nullopt.
std::optional<quint64> seedFromText(const QString& text);

}  // namespace granule::app
