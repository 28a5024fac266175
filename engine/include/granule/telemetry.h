// The numbers the GUI panels show and the benchmarks print: one snapshot in sections, copied
// out by Engine::telemetry(). Each section lists its fields by name in fields(), right below
// them; for_each_field(section, f) visits them, read-only or writable as the section is, so a
// reader takes every field without naming it (the app hands them to QML that way, in
// camelCase: pool_bytes becomes poolBytes; granule/telemetry_json.h writes them as JSON). A
// new metric is a field and its line in fields() here, the code that measures it, and
// whatever draws or prints it.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace granule {

// Calls f(name, field) for each field of a section (a struct with a static fields(self, f)),
// in the order fields() lists them; the fields are const when the section is.
template <class Section, class F>
void for_each_field(Section& section, F&& f) {
  std::remove_const_t<Section>::fields(section, f);
}

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
  RecurrentState,  // recurrent layers' state slots (Qwen3.5's Gated DeltaNet), one per sequence
  // Pinned, mapped host memory the device reads in place (Gemma 4's per-layer token table):
  // reported, never charged to the device budget.
  HostPinned,
  Count
};
inline constexpr size_t kMemoryCategoryCount = static_cast<size_t>(MemoryCategory::Count);
// "weights", "staging", "kv", "kv_pool", "kv_reserved_va", "workspace", "graphs", "other",
// "recurrent_state", "host_pinned".
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

  template <class Self, class F>
  static void fields(Self& s, F&& f) {
    f("name", s.name);
    f("gpu", s.gpu);
    f("total_bytes", s.total_bytes);
    f("budget_bytes", s.budget_bytes);
    f("used_bytes", s.used_bytes);
    f("ledger", s.ledger);
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

  template <class Self, class F>
  static void fields(Self& s, F&& f) {
    f("granules_mapped", s.granules_mapped);
    f("granules_unmapped", s.granules_unmapped);
    f("last_mapping_us", s.last_mapping_us);
    f("last_granules_mapped", s.last_granules_mapped);
    f("last_granules_unmapped", s.last_granules_unmapped);
    f("committed_bytes", s.committed_bytes);
    f("peak_committed_bytes", s.peak_committed_bytes);
    f("reserved_bytes", s.reserved_bytes);
    f("map_refusals", s.map_refusals);
    f("pool_bytes", s.pool_bytes);
    f("pool_target_granules", s.pool_target_granules);
    f("granules_from_pool", s.granules_from_pool);
    f("granules_created", s.granules_created);
    f("last_granules_created", s.last_granules_created);
    f("last_refill_us", s.last_refill_us);
    f("last_ahead_granules", s.last_ahead_granules);
    f("last_ahead_us", s.last_ahead_us);
    f("retiring_bytes", s.retiring_bytes);
    f("unmaps_deferred", s.unmaps_deferred);
  }
};

struct SchedulerTelemetry {
  int32_t running = 0;             // sequences holding a slot and their KV
  int32_t waiting = 0;             // queued for a slot and KV (new, or preempted)
  uint64_t preemptions = 0;        // cumulative: sequences whose KV was freed to be recomputed
  uint64_t recomputed_tokens = 0;  // cumulative: tokens prefilled again after a preemption
  // KV kept from finished sequences for the next turn of their chat (EngineOptions::kv_reuse).
  int32_t kept_chats = 0;             // idle entries whose KV stays in device memory, now
  uint64_t kept_kv_bytes = 0;         // their committed KV, now
  int32_t swapped_chats = 0;          // idle entries whose KV was copied to host memory, now
  uint64_t swapped_kv_bytes = 0;      // that host memory, now
  uint64_t prefix_reused_tokens = 0;  // cumulative: prompt tokens not computed, their KV kept
  uint64_t kv_swap_outs = 0;          // cumulative: idle KV copied device-to-host
  uint64_t kv_swap_out_bytes = 0;     // cumulative
  uint64_t kv_swap_ins = 0;           // cumulative: idle KV copied back host-to-device
  uint64_t kv_swap_in_bytes = 0;      // cumulative
  uint64_t kept_kv_dropped = 0;       // cumulative: idle entries given up (recomputed if resumed)

  template <class Self, class F>
  static void fields(Self& s, F&& f) {
    f("running", s.running);
    f("waiting", s.waiting);
    f("preemptions", s.preemptions);
    f("recomputed_tokens", s.recomputed_tokens);
    f("kept_chats", s.kept_chats);
    f("kept_kv_bytes", s.kept_kv_bytes);
    f("swapped_chats", s.swapped_chats);
    f("swapped_kv_bytes", s.swapped_kv_bytes);
    f("prefix_reused_tokens", s.prefix_reused_tokens);
    f("kv_swap_outs", s.kv_swap_outs);
    f("kv_swap_out_bytes", s.kv_swap_out_bytes);
    f("kv_swap_ins", s.kv_swap_ins);
    f("kv_swap_in_bytes", s.kv_swap_in_bytes);
    f("kept_kv_dropped", s.kept_kv_dropped);
  }
};

// CUDA graphs (the CUDA backend fills them; all zero on the CPU). A decode step is captured
// once per batch-size bucket (1, 2, 4, 8, ...; a batch pads to its bucket) and head kind.
struct GraphTelemetry {
  std::vector<int32_t> buckets;  // batch-size buckets with a captured decode graph
  int32_t nodes = 0;             // nodes of the graph the last decode step replayed
  // Host-issued units of the last decode step: graph launches, eager kernels, copies
  // (the input upload and the token download count one each).
  int32_t segments_per_step = 0;
  uint64_t replays = 0;     // cumulative decode-graph replays
  uint64_t captures = 0;    // cumulative captures, first ones and re-captures
  uint64_t recaptures = 0;  // cumulative captures of a bucket that had been captured before
  std::string last_recapture_reason;  // why the last re-capture happened ("" when none yet)
  uint64_t eager_steps = 0;           // cumulative decode steps run without a graph
  std::string last_fallback_reason;   // why the last eager decode step did not replay a graph

  template <class Self, class F>
  static void fields(Self& s, F&& f) {
    f("buckets", s.buckets);
    f("nodes", s.nodes);
    f("segments_per_step", s.segments_per_step);
    f("replays", s.replays);
    f("captures", s.captures);
    f("recaptures", s.recaptures);
    f("last_recapture_reason", s.last_recapture_reason);
    f("eager_steps", s.eager_steps);
    f("last_fallback_reason", s.last_fallback_reason);
  }
};

// Weight placement and streaming: which layers stay in device memory and which are copied
// from pinned host memory into a ring of staging slots for every forward pass.
struct StreamingTelemetry {
  int32_t layers_resident = 0;
  int32_t layers_streamed = 0;
  std::vector<int32_t> layer_streamed;   // per layer, in order: 1 streamed, 0 resident
  uint64_t resident_weight_bytes = 0;    // weights held in device memory
  uint64_t streamed_bytes_per_pass = 0;  // host-to-device bytes one forward pass copies
  // Dense models, the host's part of the streamed layers at small decode batches
  // (EngineOptions::host_row_share): the 256ths of each streamed matrix's rows the CPU computes
  // (0: none), what such a split pass copies instead of streamed_bytes_per_pass, the host's int8
  // copies, and the rounds it has answered (four per split layer per pass).
  int32_t host_row_share = 0;
  uint64_t split_bytes_per_pass = 0;
  uint64_t host_row_copy_bytes = 0;
  uint64_t host_row_rounds = 0;
  int32_t staging_slots = 0;   // the ring's slots (0 when nothing streams)
  uint64_t staging_bytes = 0;  // the ring's device bytes
  // Share of the last step's wall time the copy engine was busy (copied bytes over the
  // measured bandwidth, divided by the step's time), 0..1.
  double staging_occupancy = 0;
  uint64_t h2d_bytes = 0;                     // cumulative weight bytes copied host-to-device
  double h2d_bytes_per_second = 0;            // over the last step
  double h2d_bytes_per_token = 0;             // over the last step
  double h2d_bandwidth_bytes_per_second = 0;  // pinned host-to-device, measured at load
  uint64_t replans = 0;                       // cumulative changes of the placement
  std::string last_replan_reason;

  template <class Self, class F>
  static void fields(Self& s, F&& f) {
    f("layers_resident", s.layers_resident);
    f("layers_streamed", s.layers_streamed);
    f("layer_streamed", s.layer_streamed);
    f("resident_weight_bytes", s.resident_weight_bytes);
    f("streamed_bytes_per_pass", s.streamed_bytes_per_pass);
    f("host_row_share", s.host_row_share);
    f("split_bytes_per_pass", s.split_bytes_per_pass);
    f("host_row_copy_bytes", s.host_row_copy_bytes);
    f("host_row_rounds", s.host_row_rounds);
    f("staging_slots", s.staging_slots);
    f("staging_bytes", s.staging_bytes);
    f("staging_occupancy", s.staging_occupancy);
    f("h2d_bytes", s.h2d_bytes);
    f("h2d_bytes_per_second", s.h2d_bytes_per_second);
    f("h2d_bytes_per_token", s.h2d_bytes_per_token);
    f("h2d_bandwidth_bytes_per_second", s.h2d_bandwidth_bytes_per_second);
    f("replans", s.replans);
    f("last_replan_reason", s.last_replan_reason);
  }
};

// Mixture-of-experts placement and routing (all empty and zero for a dense model): which
// experts sit in device memory, and where the routed ones were served from. The counts are
// cumulative since the model opened, as the engine sums what the backend reports between
// snapshots (Backend::collect_expert_telemetry), so every reader of snapshots sees the same
// totals; a panel takes the difference of two frames for "this second".
struct ExpertTelemetry {
  int32_t n_layer = 0, n_expert = 0;  // 0: a dense model
  std::vector<uint8_t> resident;      // [layer * n_expert + e]: 1 in device memory, now
  std::vector<uint32_t> routed;       // [layer * n_expert + e]: (token, expert) choices
  std::vector<uint32_t> streamed;     // of those, served from host memory (over PCIe)
  uint64_t hits = 0, misses = 0;      // choices served from device / from host memory
  uint64_t bytes_streamed = 0;        // expert bytes read host-to-device
  // Of the misses, the choices the host's CPU computed instead of the device (the CUDA
  // backend's host experts), and the expert bytes it read for them.
  uint64_t host_computed = 0, bytes_host = 0;
  uint64_t tokens = 0;        // tokens whose experts were routed (prefill and decode)
  uint64_t expert_bytes = 0;  // one expert of one layer: gate + up + down (0: unknown)
  uint64_t promotions = 0;    // experts moved host → device by re-plans
  uint64_t demotions = 0;     // experts moved device → host by re-plans

  int64_t resident_count() const {
    int64_t n = 0;
    for (uint8_t r : resident) n += r != 0;
    return n;
  }
  // Takes `interval`'s placement (shape, resident, expert_bytes) and adds its counts to these
  // totals; a new shape (another model, or the first report) starts the totals from zero.
  void add_interval(const ExpertTelemetry& interval) {
    const auto cells =
        static_cast<size_t>(interval.n_layer) * static_cast<size_t>(interval.n_expert);
    if (interval.n_layer != n_layer || interval.n_expert != n_expert || routed.size() != cells) {
      *this = ExpertTelemetry{};
      n_layer = interval.n_layer;
      n_expert = interval.n_expert;
      routed.assign(cells, 0);
      streamed.assign(cells, 0);
    }
    resident = interval.resident;
    expert_bytes = interval.expert_bytes;
    for (size_t i = 0; i < cells && i < interval.routed.size(); ++i)
      routed[i] += interval.routed[i];
    for (size_t i = 0; i < cells && i < interval.streamed.size(); ++i)
      streamed[i] += interval.streamed[i];
    hits += interval.hits;
    misses += interval.misses;
    bytes_streamed += interval.bytes_streamed;
    host_computed += interval.host_computed;
    bytes_host += interval.bytes_host;
    tokens += interval.tokens;
    promotions += interval.promotions;
    demotions += interval.demotions;
  }

  template <class Self, class F>
  static void fields(Self& s, F&& f) {
    f("n_layer", s.n_layer);
    f("n_expert", s.n_expert);
    f("resident", s.resident);
    f("routed", s.routed);
    f("streamed", s.streamed);
    f("hits", s.hits);
    f("misses", s.misses);
    f("bytes_streamed", s.bytes_streamed);
    f("host_computed", s.host_computed);
    f("bytes_host", s.bytes_host);
    f("tokens", s.tokens);
    f("expert_bytes", s.expert_bytes);
    f("promotions", s.promotions);
    f("demotions", s.demotions);
  }
};

struct ThroughputTelemetry {
  double prompt_tokens_per_second = 0;  // over every prefill so far
  double decode_tokens_per_second = 0;  // over every decode so far
  uint64_t steps = 0;
  // Batching, cumulative: steps that decoded a token for at least one sequence, the sequences
  // they decoded (summed over those steps; their ratio is the mean batch), and the steps that
  // decoded two or more sequences together (chats and API requests in one forward pass).
  uint64_t decode_steps = 0;
  uint64_t decode_step_sequences = 0;
  uint64_t batched_decode_steps = 0;
  int32_t last_decode_sequences = 0;  // sequences the last step decoded
  // Where the last step's time went on the host, in microseconds: planning it (scheduling, KV
  // mapping, the prompt reports), queueing it on the device (inputs, graph launch), the work
  // done while it runs (mapping ahead), blocked waiting for its end, then taking its tokens
  // (sampling on the host where it does, stop checks, the sinks).
  double last_plan_us = 0;
  double last_launch_us = 0;
  double last_overlap_us = 0;
  double last_wait_us = 0;
  double last_results_us = 0;
  // Structured output: the constrained sequences of the last step, of them those whose token
  // the backend's sampler drew under its mask (the others' masks were applied on the host to
  // downloaded logits), and the host time their token masks took (computed while the device
  // ran the step's forward pass, or after it for a mask not ready then).
  int32_t constrained_sequences = 0;
  int32_t device_masked_sequences = 0;
  double last_mask_us = 0;

  template <class Self, class F>
  static void fields(Self& s, F&& f) {
    f("prompt_tokens_per_second", s.prompt_tokens_per_second);
    f("decode_tokens_per_second", s.decode_tokens_per_second);
    f("steps", s.steps);
    f("decode_steps", s.decode_steps);
    f("decode_step_sequences", s.decode_step_sequences);
    f("batched_decode_steps", s.batched_decode_steps);
    f("last_decode_sequences", s.last_decode_sequences);
    f("last_plan_us", s.last_plan_us);
    f("last_launch_us", s.last_launch_us);
    f("last_overlap_us", s.last_overlap_us);
    f("last_wait_us", s.last_wait_us);
    f("last_results_us", s.last_results_us);
    f("constrained_sequences", s.constrained_sequences);
    f("device_masked_sequences", s.device_masked_sequences);
    f("last_mask_us", s.last_mask_us);
  }
};

struct SequenceTelemetry {
  int64_t id = 0;
  int64_t tokens = 0;
  uint64_t kv_committed_bytes = 0;
  // Of it, the sliding-window layers' part (KV by layer kind): flat at the window once the
  // chat outgrows it, while the rest (the global layers') grows with the chat.
  uint64_t kv_window_committed_bytes = 0;
  uint64_t kv_reserved_bytes = 0;
  double tokens_per_second = 0;
  double time_to_first_token_ms = 0;
  bool waiting = false;     // queued for a slot and KV (new, or preempted)
  int32_t preemptions = 0;  // times its KV was freed to make room, to be recomputed

  template <class Self, class F>
  static void fields(Self& s, F&& f) {
    f("id", s.id);
    f("tokens", s.tokens);
    f("kv_committed_bytes", s.kv_committed_bytes);
    f("kv_window_committed_bytes", s.kv_window_committed_bytes);
    f("kv_reserved_bytes", s.kv_reserved_bytes);
    f("tokens_per_second", s.tokens_per_second);
    f("time_to_first_token_ms", s.time_to_first_token_ms);
    f("waiting", s.waiting);
    f("preemptions", s.preemptions);
  }
};

struct TelemetrySnapshot {
  DeviceTelemetry device;
  KvStats kv;
  SchedulerTelemetry scheduler;
  GraphTelemetry graphs;
  StreamingTelemetry streaming;
  ExpertTelemetry experts;
  ThroughputTelemetry throughput;
  std::vector<SequenceTelemetry> sequences;  // every submitted sequence not yet finished
};

}  // namespace granule
