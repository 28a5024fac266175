// Named spdlog loggers shared by the engine and the app.
#include "granule/log.h"

#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace granule {
namespace {
std::mutex g_mutex;
spdlog::level::level_enum g_level = spdlog::level::warn;
}  // namespace

std::shared_ptr<spdlog::logger> logger(const std::string& name) {
  std::lock_guard lock(g_mutex);
  if (auto existing = spdlog::get(name)) return existing;
  auto created = spdlog::stderr_color_mt(name);
  created->set_level(g_level);
  created->set_pattern("[%H:%M:%S.%e] [%n] [%^%l%$] %v");
  return created;
}

void set_log_level(spdlog::level::level_enum level) {
  std::lock_guard lock(g_mutex);
  g_level = level;
  spdlog::set_level(level);
}

}  // namespace granule
