// The numbers the GUI panels show and the benchmarks print: one snapshot in sections, copied
// out by Engine::telemetry(). Each section lists its fields by name in for_each_field(), right
// below them, so a reader can take every field without naming it (the app hands them to QML
// that way, in camelCase: pool_bytes becomes poolBytes). A new metric is a field and its line
// in for_each_field here, the code that measures it, and whatever draws or prints it.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace granule {

// The memory ledger's categories. The physical ones stack in this order in the panels
// (bottom first); KvReservedVa is address space, reported but never charged to the budget.
enum class MemoryCategory : int {
  WeightsResident = 0,
  WeightsStaging,
  KvCommitted,
  KvPool,        // physical KV granules created ahead of need, mapped nowhere yet
  KvReservedVa,  // virtual address space only: reported, never charged to the budget
  Workspace,
  Graphs,
  Other,
  Count
};
inline constexpr size_t kMemoryCategoryCount = static_cast<size_t>(MemoryCategory::Count);
// "weights", "staging", "kv", "kv_pool", "kv_reserved_va", "workspace", "graphs", "other".
std::string_view memory_category_name(MemoryCategory c);

// Bytes by MemoryCategory, indexed by the enum.
using Ledger = std::array<uint64_t, kMemoryCategoryCount>;

// The compute device and its memory ledger.
struct DeviceTelemetry {
  std::string name;  // "CPU (2 threads)", or the GPU's name
  bool gpu = false;
  uint64_t total_bytes = 0;   // physical memory of the device; 0 when unknown
  uint64_t budget_bytes = 0;  // what the ledger may hold
  uint64_t used_bytes = 0;    // charged against the budget: the ledger's physical categories
  Ledger ledger{};

  uint64_t ledger_bytes(MemoryCategory c) const { return ledger[static_cast<size_t>(c)]; }

  template <class F>
  void for_each_field(F&& f) const {
    f("name", name);
    f("gpu", gpu);
    f("total_bytes", total_bytes);
    f("budget_bytes", budget_bytes);
    f("used_bytes", used_bytes);
    f("ledger", ledger);
  }
};

// The KV space's counters: KvSpace keeps them as they are here, and the snapshot carries them
// as kept. "Last step" counters cover the time since the engine's last reset_step_stats().
struct KvStats {
  uint64_t granules_mapped = 0;         // cumulative
  uint64_t granules_unmapped = 0;       // cumulative
  double last_mapping_us = 0;           // time spent in map/unmap since the last reset_step_stats()
  uint64_t last_granules_mapped = 0;    // since the last reset_step_stats()
  uint64_t last_granules_unmapped = 0;  // since the last reset_step_stats()
  uint64_t committed_bytes = 0;         // all slots, now
  uint64_t peak_committed_bytes = 0;    // all slots, the most at any time
  uint64_t reserved_bytes = 0;          // all slots, now
  uint64_t map_refusals = 0;            // cumulative map_through() calls the budget refused
  // The pool of created, unmapped granules (charged to KvPool).
  uint64_t pool_bytes = 0;             // now
  uint64_t pool_target_granules = 0;   // what refill_pool() tops it up to
  uint64_t granules_from_pool = 0;     // cumulative granules mapped out of the pool
  uint64_t granules_created = 0;       // cumulative VirtualMemory::create() calls
  uint64_t last_granules_created = 0;  // since the last reset_step_stats(), inside map_through():
                                       // created on the step's critical path (pool ran dry)
  double last_refill_us = 0;           // time spent in refill_pool() since the last reset
  uint64_t last_ahead_granules = 0;    // mapped by map_ahead() since the last reset
  double last_ahead_us = 0;            // time spent in map_ahead() since the last reset
  uint64_t retiring_bytes =
      0;  // unmapped from slots, waiting for the device work that may touch them
  uint64_t unmaps_deferred = 0;  // cumulative granules whose unmap waited for device work

  template <class F>
  void for_each_field(F&& f) const {
    f("granules_mapped", granules_mapped);
    f("granules_unmapped", granules_unmapped);
    f("last_mapping_us", last_mapping_us);
    f("last_granules_mapped", last_granules_mapped);
    f("last_granules_unmapped", last_granules_unmapped);
    f("committed_bytes", committed_bytes);
    f("peak_committed_bytes", peak_committed_bytes);
    f("reserved_bytes", reserved_bytes);
    f("map_refusals", map_refusals);
    f("pool_bytes", pool_bytes);
    f("pool_target_granules", pool_target_granules);
    f("granules_from_pool", granules_from_pool);
    f("granules_created", granules_created);
    f("last_granules_created", last_granules_created);
    f("last_refill_us", last_refill_us);
    f("last_ahead_granules", last_ahead_granules);
    f("last_ahead_us", last_ahead_us);
    f("retiring_bytes", retiring_bytes);
    f("unmaps_deferred", unmaps_deferred);
  }
};

struct SchedulerTelemetry {
  int32_t running = 0;             // sequences holding a slot and their KV
  int32_t waiting = 0;             // queued for a slot and KV (new, or preempted)
  uint64_t preemptions = 0;        // cumulative: sequences whose KV was freed to be recomputed
  uint64_t recomputed_tokens = 0;  // cumulative: tokens prefilled again after a preemption

  template <class F>
  void for_each_field(F&& f) const {
    f("running", running);
    f("waiting", waiting);
    f("preemptions", preemptions);
    f("recomputed_tokens", recomputed_tokens);
  }
};

// CUDA graphs (the CUDA backend fills them; all zero on the CPU).
struct GraphTelemetry {
  std::vector<int32_t> buckets;  // batch sizes with a captured decode graph
  int32_t segments_per_step = 0;
  uint64_t replays = 0;
  std::string last_fallback_reason;  // why the last eager step did not replay a graph

  template <class F>
  void for_each_field(F&& f) const {
    f("buckets", buckets);
    f("segments_per_step", segments_per_step);
    f("replays", replays);
    f("last_fallback_reason", last_fallback_reason);
  }
};

// Weight placement. Every layer is resident until weight streaming lands.
struct StreamingTelemetry {
  int32_t layers_resident = 0;

  template <class F>
  void for_each_field(F&& f) const {
    f("layers_resident", layers_resident);
  }
};

struct ThroughputTelemetry {
  double prompt_tokens_per_second = 0;  // over every prefill so far
  double decode_tokens_per_second = 0;  // over every decode so far
  uint64_t steps = 0;

  template <class F>
  void for_each_field(F&& f) const {
    f("prompt_tokens_per_second", prompt_tokens_per_second);
    f("decode_tokens_per_second", decode_tokens_per_second);
    f("steps", steps);
  }
};

struct SequenceTelemetry {
  int64_t id = 0;
  int64_t tokens = 0;
  uint64_t kv_committed_bytes = 0;
  uint64_t kv_reserved_bytes = 0;
  double tokens_per_second = 0;
  double time_to_first_token_ms = 0;
  bool waiting = false;     // queued for a slot and KV (new, or preempted)
  int32_t preemptions = 0;  // times its KV was freed to make room, to be recomputed

  template <class F>
  void for_each_field(F&& f) const {
    f("id", id);
    f("tokens", tokens);
    f("kv_committed_bytes", kv_committed_bytes);
    f("kv_reserved_bytes", kv_reserved_bytes);
    f("tokens_per_second", tokens_per_second);
    f("time_to_first_token_ms", time_to_first_token_ms);
    f("waiting", waiting);
    f("preemptions", preemptions);
  }
};

struct TelemetrySnapshot {
  DeviceTelemetry device;
  KvStats kv;
  SchedulerTelemetry scheduler;
  GraphTelemetry graphs;
  StreamingTelemetry streaming;
  ThroughputTelemetry throughput;
  std::vector<SequenceTelemetry> sequences;  // every submitted sequence not yet finished
};

}  // namespace granule
