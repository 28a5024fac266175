// Reads a GGUF file's header into ModelInfo and estimates whether it fits before loading
// (the fit preview): weights, KV per token and workspace against the memory budget.
#pragma once
#include <filesystem>

#include "granule/engine.h"
#include "worker_types.h"

namespace granule::app {

struct ModelInspection {
  ModelInfo info;
  quint64 weights_bytes = 0;
  quint64 kv_bytes_per_token = 0;  // K+V over all layers, fp16
};

// Throws granule::Error (FormatError for a bad file) with a one-line message.
ModelInspection inspectModel(const std::filesystem::path& path);

// The fit preview for opening `inspection` with `options` when `budget_bytes` are free.
FitReport estimateFit(const ModelInspection& inspection, const EngineOptions& options,
                      quint64 budget_bytes, bool gpu);

// Host memory figures from /proc (0 when unavailable).
quint64 hostAvailableBytes();
quint64 hostTotalBytes();
quint64 processResidentBytes();

// "1.2 GiB", "340 MiB", "12 KiB".
QString formatBytes(quint64 bytes);

}  // namespace granule::app
