// The numbers the GUI panels show and the benchmarks print, copied out as one snapshot.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace granule {

struct SequenceTelemetry {
  int64_t id = 0;
  int64_t tokens = 0;
  uint64_t kv_committed_bytes = 0;
  uint64_t kv_reserved_bytes = 0;
  double tokens_per_second = 0;
  double time_to_first_token_ms = 0;
};

struct TelemetrySnapshot {
  std::string device;            // "CPU" or the GPU's name
  bool gpu = false;
  uint64_t device_total_bytes = 0;
  uint64_t budget_bytes = 0;
  std::map<std::string, uint64_t> ledger;   // category -> bytes ("weights", "kv", ...)
  std::vector<SequenceTelemetry> sequences;
  uint64_t granules_mapped = 0;
  uint64_t granules_unmapped = 0;
  double mapping_us_last_step = 0;
  // streaming
  uint64_t streamed_bytes_total = 0;
  double streamed_bytes_per_second = 0;
  int32_t layers_resident = 0;
  int32_t layers_streamed = 0;
  // graphs
  std::vector<int32_t> graph_buckets;
  int32_t segments_per_step = 0;
  uint64_t graph_replays = 0;
  uint64_t graph_recaptures = 0;
  std::string last_fallback_reason;
  // throughput
  double prompt_tokens_per_second = 0;
  double decode_tokens_per_second = 0;
  uint64_t steps = 0;
};

}  // namespace granule
