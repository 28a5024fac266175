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
  bool waiting = false;     // queued for a slot and KV (new, or preempted)
  int32_t preemptions = 0;  // times its KV was freed to make room, to be recomputed
};

struct TelemetrySnapshot {
  std::string device;  // "CPU" or the GPU's name
  bool gpu = false;
  uint64_t device_total_bytes = 0;
  uint64_t budget_bytes = 0;
  std::map<std::string, uint64_t> ledger;  // category -> bytes ("weights", "kv", ...)
  std::vector<SequenceTelemetry> sequences;
  uint64_t granules_mapped = 0;
  uint64_t granules_unmapped = 0;
  double mapping_us_last_step = 0;
  uint64_t granules_mapped_last_step = 0;
  uint64_t granules_unmapped_last_step = 0;
  uint64_t kv_map_refusals = 0;          // cumulative KV mappings the budget refused
  uint64_t kv_committed_peak_bytes = 0;  // the most KV committed at any time
  uint64_t kv_pool_bytes = 0;            // granules created ahead of need, not mapped yet
  uint64_t kv_pool_target_granules = 0;  // what the pool is topped up to (0: no pool)
  uint64_t granules_created_last_step =
      0;                                // created inside the last step's mapping: the pool ran dry
  double pool_refill_us_last_step = 0;  // creating granules for the pool, off the mapping path
  // Mapped for the next step while the last one ran on the device (not in mapping_us_last_step).
  uint64_t granules_mapped_ahead_last_step = 0;
  double mapping_ahead_us_last_step = 0;
  // scheduler
  int32_t running_sequences = 0;
  int32_t waiting_sequences = 0;
  uint64_t preemptions = 0;        // cumulative: sequences whose KV was freed to be recomputed
  uint64_t recomputed_tokens = 0;  // cumulative: tokens prefilled again after a preemption
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
