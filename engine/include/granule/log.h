// Named spdlog loggers, one per subsystem ("engine.gguf", "engine.kv", "app", ...).
#pragma once
#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace granule {

// Returns the logger of that name, creating it (stderr, shared level) on first use.
std::shared_ptr<spdlog::logger> logger(const std::string& name);

// Sets the level of every Granule logger (and of those created later).
void set_log_level(spdlog::level::level_enum level);

}  // namespace granule
