// /metrics: the engine's telemetry and the server's counters in the Prometheus text format.
#pragma once
#include <cstdint>
#include <string>

#include "granule/telemetry.h"

namespace granule::server {

struct ServerCounters {
  int64_t requests_active = 0;     // completions in flight now
  uint64_t requests_total = 0;     // completions accepted so far
  uint64_t requests_rejected = 0;  // answered 4xx/5xx before reaching the engine
  uint64_t completion_tokens = 0;  // tokens generated for requests so far
};

std::string prometheus_metrics(const TelemetrySnapshot& telemetry, const ServerCounters& server);

}  // namespace granule::server
