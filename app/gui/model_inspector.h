// What the window shows about a model file before loading, from the engine's estimate
// (granule::Engine::estimate: the app reads no GGUF itself) — the model's facts and the fit
// preview's wording — and the host memory figures from /proc.
#pragma once
#include <filesystem>

#include "granule/engine.h"
#include "worker_types.h"

namespace granule::app {

// The facts of the model at `path`, as the estimate read them.
ModelInfo modelInfo(const std::filesystem::path& path, const FitEstimate& estimate);

// One line for the fit dialog: fits, tight (how many tokens per chat fit), or does not fit.
QString fitSummary(const FitEstimate& fit);

// Host memory figures from /proc (0 when unavailable).
quint64 hostAvailableBytes();
quint64 hostTotalBytes();
quint64 processResidentBytes();

// "1.2 GiB", "340 MiB", "12 KiB".
QString formatBytes(quint64 bytes);

}  // namespace granule::app
