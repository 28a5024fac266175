// The KV memory benchmark: a seeded chat workload (chats that grow turn by turn, end,
// regenerate and get edited) replayed step by step under each KV policy — full-context
// reservation, power-of-two bucket growth with copies (freed buckets returned at once, or kept
// by a caching allocator), and KvSpace granules on demand.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace granule {

// The engine's address-space and ledger types (engine/src/memory/kv_space.h, memory_manager.h):
// declared here so the header needs no engine-internal include path; code that makes or
// drives a policy includes kv_space.h itself.
class VirtualMemory;
class MemoryManager;

// ---------------------------------------------------------------------------------------
// The workload

struct KvWorkloadOptions {
  int32_t chats = 32;     // one sequence slot each; they open within the arrival window
  int32_t max_turns = 8;  // answers per chat at most, regenerations included
  uint64_t seed = 1;
  int64_t max_context_tokens = 8192;   // a chat that would pass it ends
  int64_t prefill_chunk_tokens = 512;  // prompt tokens a chat prefills per step
  int64_t arrival_window_steps = 200;  // chats open at a random step in [0, window]
  // Log-normal lengths (median, sigma of the log), clamped to [min, max].
  double prompt_median_tokens = 150, prompt_sigma = 1.1;
  int64_t prompt_min_tokens = 20, prompt_max_tokens = 2000;
  double answer_median_tokens = 250, answer_sigma = 0.7;
  int64_t answer_min_tokens = 50, answer_max_tokens = 800;
  int64_t think_min_steps = 5, think_max_steps = 60;  // the user reading and typing
  // After each answer, in this order: regenerate it, edit an earlier prompt, end the chat.
  double regenerate_probability = 0.15;
  double edit_probability = 0.10;
  double end_probability = 0.20;
};

enum class KvEventKind {
  Grow,      // the chat's KV now holds `tokens` tokens (a prefill chunk or a decoded token)
  Truncate,  // regenerate or edit: the chat keeps its first `tokens` tokens
  End,       // the chat is closed: its KV is freed
};

struct KvEvent {
  KvEventKind kind = KvEventKind::Grow;
  int32_t chat = 0;
  int64_t tokens = 0;
};

struct KvTrace {
  int32_t chats = 0;
  int64_t max_context_tokens = 0;
  std::vector<std::vector<KvEvent>> steps;  // what each step does, in order
  // What the generator produced, for the report.
  int64_t turns = 0, regenerations = 0, edits = 0, context_full_ends = 0;
  int64_t prompt_tokens = 0, answer_tokens = 0;  // fed, including regrowth
  int64_t peak_live_tokens = 0;                  // most tokens held at once, all chats
};

// Deterministic for a given options (seed included). Every chat ends before the trace does.
KvTrace make_kv_workload(const KvWorkloadOptions& options);

// ---------------------------------------------------------------------------------------
// Where the memory comes from: host or GPU, picked by the caller

// A buffer backed in full for as long as it lives (bucket growth's allocations).
class KvBenchBuffer {
 public:
  virtual ~KvBenchBuffer() = default;
  virtual uint8_t* data() const = 0;
  virtual uint64_t bytes() const = 0;
};

class KvBenchMemory {
 public:
  virtual ~KvBenchMemory() = default;
  virtual std::string name() const = 0;
  // Address space by granule, as the engine's KvSpace uses it.
  virtual std::unique_ptr<VirtualMemory> make_virtual_memory() = 0;
  virtual std::unique_ptr<KvBenchBuffer> allocate(uint64_t bytes) = 0;
  // Copies within this memory and returns when the copy is complete.
  virtual void copy(uint8_t* destination, const uint8_t* source, uint64_t bytes) = 0;
};

// Host memory. With touch_pages, every commit and allocation faults its pages in at once,
// so the time and resident memory are real (the kernel would otherwise back them lazily).
std::unique_ptr<KvBenchMemory> make_host_kv_bench_memory(uint64_t granule_bytes,
                                                         bool touch_pages = true);

// ---------------------------------------------------------------------------------------
// The policies

struct KvPolicyShape {
  int64_t bytes_per_token = 0;
  int64_t max_context_tokens = 0;
  int32_t slots = 0;
  int64_t lookahead_tokens = 16;       // granules: mapped beyond what a step writes
  int64_t min_bucket_tokens = 256;     // bucket growth: the first allocation
  int64_t prefill_chunk_tokens = 512;  // granules with a pool: sizes it as the engine does
};

// One way of holding every chat's KV. Each charges what it holds to the MemoryManager's
// KvCommitted, so the ledger is the one measure of committed bytes for all of them.
class KvPolicy {
 public:
  virtual ~KvPolicy() = default;
  virtual std::string name() const = 0;
  virtual void grow(int32_t slot, int64_t tokens) = 0;
  virtual void truncate(int32_t slot, int64_t tokens) = 0;
  virtual void end(int32_t slot) = 0;
  // Where the slot's KV starts now (null when it holds none): what a captured graph bakes in.
  virtual uint8_t* address(int32_t slot) const = 0;
  virtual uint64_t committed_bytes(int32_t slot) const = 0;
  virtual uint64_t copied_bytes() const { return 0; }
  // Work for the time the step runs on the device, not counted in the step's memory time
  // (a pool tops itself up). Default: none.
  virtual void while_step_runs() {}
};

// Every slot's full context committed when the policy is made (llama.cpp-style).
std::unique_ptr<KvPolicy> make_full_context_policy(const KvPolicyShape& shape,
                                                   KvBenchMemory& memory, MemoryManager& ledger);
// A buffer per chat of a power-of-two number of tokens; outgrowing it allocates twice the
// size, copies the used bytes and frees the old one. Truncation keeps the buffer. Freed
// buffers go back to the device at once: the most generous bucket baseline.
std::unique_ptr<KvPolicy> make_bucket_growth_policy(const KvPolicyShape& shape,
                                                    KvBenchMemory& memory, MemoryManager& ledger);
// The same buckets through a caching allocator (as PyTorch's CUDA allocator keeps freed
// blocks until empty_cache()): a freed buffer stays held and serves the next request of its
// size; the ledger counts what is held, in use or kept.
std::unique_ptr<KvPolicy> make_cached_bucket_growth_policy(const KvPolicyShape& shape,
                                                           KvBenchMemory& memory,
                                                           MemoryManager& ledger);
// One buffer for the whole batch, [slots][bucket tokens]: the static padded shape a captured
// graph needs when KV cannot grow in place. The bucket is the power of two (at least the
// first bucket) that holds the longest live chat; outgrowing it allocates the batch at twice
// the size and copies every live chat (every slot moves); when the longest live chat fits a
// quarter of the bucket it shrinks to the smallest bucket that holds it (copying too).
std::unique_ptr<KvPolicy> make_padded_batch_policy(const KvPolicyShape& shape,
                                                   KvBenchMemory& memory, MemoryManager& ledger);
// Granule's KvSpace: granules mapped on demand under a fixed address, tail unmapped.
std::unique_ptr<KvPolicy> make_granule_policy(const KvPolicyShape& shape, KvBenchMemory& memory,
                                              MemoryManager& ledger);
// The same with the engine's pool of pre-created granules (default_kv_pool_granules()),
// refilled while each step runs; the pool's granules count as held memory.
std::unique_ptr<KvPolicy> make_pooled_granule_policy(const KvPolicyShape& shape,
                                                     KvBenchMemory& memory, MemoryManager& ledger);

// ---------------------------------------------------------------------------------------
// Running a trace

struct KvPolicyResult {
  std::string policy;
  uint64_t peak_committed_bytes = 0;   // at any instant, a copy's two buffers included
  double mean_committed_bytes = 0;     // over the ends of steps (a pool's granules included)
  uint64_t final_committed_bytes = 0;  // after the last step (every chat ended; a cache keeps)
  uint64_t copied_bytes = 0;
  uint64_t address_changes = 0;  // a slot's KV moved: each forces a graph re-capture
  double memory_us_mean = 0;     // time in alloc/map/unmap/copy per step
  double memory_us_p99 = 0;
  double memory_us_max = 0;
  uint64_t steps = 0;
};

// Called after every step with the chats' current token counts (0 once ended).
using KvStepObserver =
    std::function<void(size_t step, const KvPolicy& policy, const std::vector<int64_t>& tokens)>;

// Replays the trace through the policy; `ledger` must be the one the policy charges.
KvPolicyResult run_kv_policy(KvPolicy& policy, MemoryManager& ledger, const KvTrace& trace,
                             const KvStepObserver& observer = {});

enum class KvPolicyKind {
  FullContext,
  BucketGrowth,
  BucketGrowthCached,
  PaddedBatch,
  Granule,
  GranulePooled
};
const char* kv_policy_name(KvPolicyKind kind);

// The same trace under each policy in turn (fresh ledger each), in the order given.
std::vector<KvPolicyResult> compare_kv_policies(
    const KvTrace& trace, const KvPolicyShape& shape, KvBenchMemory& memory,
    const std::vector<KvPolicyKind>& policies = {
        KvPolicyKind::FullContext, KvPolicyKind::BucketGrowth, KvPolicyKind::BucketGrowthCached,
        KvPolicyKind::PaddedBatch, KvPolicyKind::Granule, KvPolicyKind::GranulePooled});

}  // namespace granule
