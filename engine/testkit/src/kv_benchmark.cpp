// The KV memory benchmark: the seeded chat workload, host memory for it, the KV policies
// (full context, bucket growth freed or cached, granules) and the runner that replays a trace.
#include "granule/testkit/kv_benchmark.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <numbers>
#include <random>
#include <utility>

#include "granule/error.h"
#include "granule/log.h"
#include "memory/kv_space.h"
#include "memory/memory_manager.h"

namespace granule {
namespace {

uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// ---------------------------------------------------------------------------------------
// Workload

// Lengths from our own transforms of mt19937_64's bits: the standard library's
// distributions differ between implementations, and a seed must give one trace everywhere.
class WorkloadRandom {
 public:
  explicit WorkloadRandom(uint64_t seed) : engine_(seed) {}
  double uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }  // [0, 1)
  int64_t uniform_int(int64_t lo, int64_t hi) {                                  // [lo, hi]
    const auto span = static_cast<uint64_t>(hi - lo) + 1;
    return lo + static_cast<int64_t>(engine_() % span);
  }
  // Box-Muller; 1 - uniform() is in (0, 1], so the log is finite.
  double normal() {
    const double u1 = 1.0 - uniform();
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }
  int64_t log_normal(double median, double sigma, int64_t lo, int64_t hi) {
    const double x = median * std::exp(sigma * normal());
    return std::clamp(static_cast<int64_t>(std::llround(x)), lo, hi);
  }

 private:
  std::mt19937_64 engine_;
};

struct ChatState {
  enum class Phase { Waiting, Prefill, Decode, Done };
  Phase phase = Phase::Waiting;
  int64_t start_step = 0;  // Waiting: when the next prompt is sent
  int64_t tokens = 0;      // in KV now
  int64_t prompt_left = 0;
  int64_t answer_left = 0;
  int64_t answer_start = 0;  // tokens before the current answer (regenerate goes back here)
  std::vector<int64_t> prompt_starts;  // tokens before each turn's prompt (edit goes back here)
  int32_t answers = 0;                 // answers generated, regenerations included
};

class WorkloadBuilder {
 public:
  explicit WorkloadBuilder(const KvWorkloadOptions& o) : o_(o), random_(o.seed) {
    if (o.chats <= 0 || o.max_turns <= 0 || o.max_context_tokens < 2 ||
        o.prefill_chunk_tokens <= 0 || o.arrival_window_steps < 0 || o.prompt_min_tokens < 1 ||
        o.prompt_min_tokens > o.prompt_max_tokens || o.answer_min_tokens < 1 ||
        o.answer_min_tokens > o.answer_max_tokens || o.think_min_steps < 0 ||
        o.think_min_steps > o.think_max_steps) {
      throw UsageError("invalid KV workload options");
    }
    trace_.chats = o.chats;
    trace_.max_context_tokens = o.max_context_tokens;
    chats_.resize(static_cast<size_t>(o.chats));
    for (ChatState& chat : chats_) chat.start_step = random_.uniform_int(0, o.arrival_window_steps);
  }

  KvTrace build() && {
    int64_t step = 0;
    while (std::any_of(chats_.begin(), chats_.end(),
                       [](const ChatState& c) { return c.phase != ChatState::Phase::Done; })) {
      events_ = &trace_.steps.emplace_back();
      int64_t live_tokens = 0;
      for (size_t i = 0; i < chats_.size(); ++i) {
        advance(static_cast<int32_t>(i), step);
        live_tokens += chats_[i].tokens;
      }
      trace_.peak_live_tokens = std::max(trace_.peak_live_tokens, live_tokens);
      ++step;
    }
    return std::move(trace_);
  }

 private:
  void emit(KvEventKind kind, int32_t chat, int64_t tokens) {
    events_->push_back({kind, chat, tokens});
  }

  // One step of one chat.
  void advance(int32_t id, int64_t step) {
    ChatState& chat = chats_[static_cast<size_t>(id)];
    switch (chat.phase) {
      case ChatState::Phase::Done:
        return;
      case ChatState::Phase::Waiting:
        if (step < chat.start_step) return;
        if (!begin_turn(id)) return;
        [[fallthrough]];  // the new prompt's first chunk runs in this step
      case ChatState::Phase::Prefill: {
        const int64_t chunk = std::min(o_.prefill_chunk_tokens, chat.prompt_left);
        chat.prompt_left -= chunk;
        chat.tokens += chunk;
        emit(KvEventKind::Grow, id, chat.tokens);
        if (chat.prompt_left == 0) {  // the answer's first token comes from this chunk's logits
          chat.answer_start = chat.tokens;
          chat.phase = ChatState::Phase::Decode;
        }
        return;
      }
      case ChatState::Phase::Decode:
        ++chat.tokens;
        ++trace_.answer_tokens;
        emit(KvEventKind::Grow, id, chat.tokens);
        if (--chat.answer_left == 0) after_answer(id, step);
        return;
    }
  }

  // The user sends a prompt; false when the context cannot hold it and an answer.
  bool begin_turn(int32_t id) {
    ChatState& chat = chats_[static_cast<size_t>(id)];
    const int64_t prompt = random_.log_normal(o_.prompt_median_tokens, o_.prompt_sigma,
                                              o_.prompt_min_tokens, o_.prompt_max_tokens);
    const int64_t answer = draw_answer();
    if (chat.tokens + prompt + 1 > o_.max_context_tokens) {
      ++trace_.context_full_ends;
      end_chat(id);
      return false;
    }
    ++trace_.turns;
    trace_.prompt_tokens += prompt;
    chat.prompt_starts.push_back(chat.tokens);
    chat.prompt_left = prompt;
    chat.answer_left = std::min(answer, o_.max_context_tokens - chat.tokens - prompt);
    chat.phase = ChatState::Phase::Prefill;
    return true;
  }

  int64_t draw_answer() {
    return random_.log_normal(o_.answer_median_tokens, o_.answer_sigma, o_.answer_min_tokens,
                              o_.answer_max_tokens);
  }

  void after_answer(int32_t id, int64_t step) {
    ChatState& chat = chats_[static_cast<size_t>(id)];
    ++chat.answers;
    const double r = random_.uniform();
    const bool last = chat.answers >= o_.max_turns;
    if (!last && r < o_.regenerate_probability) {
      // Drop the answer and sample a new one from the same prompt, from the next step on.
      ++trace_.regenerations;
      chat.tokens = chat.answer_start;
      emit(KvEventKind::Truncate, id, chat.tokens);
      chat.answer_left = std::min(draw_answer(), o_.max_context_tokens - chat.tokens);
      return;
    }
    if (!last && r < o_.regenerate_probability + o_.edit_probability) {
      // Edit one of the chat's prompts: everything from it on is dropped, and the edited
      // prompt is sent once the user has typed it.
      ++trace_.edits;
      const auto turn = static_cast<size_t>(
          random_.uniform_int(0, static_cast<int64_t>(chat.prompt_starts.size()) - 1));
      chat.tokens = chat.prompt_starts[turn];
      chat.prompt_starts.resize(turn);
      emit(KvEventKind::Truncate, id, chat.tokens);
      wait_for_user(chat, step);
      return;
    }
    if (last || r < o_.regenerate_probability + o_.edit_probability + o_.end_probability) {
      end_chat(id);
      return;
    }
    wait_for_user(chat, step);
  }

  void wait_for_user(ChatState& chat, int64_t step) {
    chat.phase = ChatState::Phase::Waiting;
    chat.start_step = step + 1 + random_.uniform_int(o_.think_min_steps, o_.think_max_steps);
  }

  void end_chat(int32_t id) {
    ChatState& chat = chats_[static_cast<size_t>(id)];
    chat.phase = ChatState::Phase::Done;
    chat.tokens = 0;
    emit(KvEventKind::End, id, 0);
  }

  const KvWorkloadOptions& o_;
  WorkloadRandom random_;
  std::vector<ChatState> chats_;
  KvTrace trace_;
  std::vector<KvEvent>* events_ = nullptr;
};

// ---------------------------------------------------------------------------------------
// Host memory

// HostVirtualMemory allocates a granule's pages when it creates it, but the page tables of a
// mapping fill on first touch. To pay that when the benchmark maps (as a GPU pays it in
// cuMemMap and cuMemSetAccess), and to back bucket buffers at once, this faults pages in.
void fault_in(uint8_t* addr, uint64_t bytes) {
#ifdef MADV_POPULATE_WRITE
  if (madvise(addr, bytes, MADV_POPULATE_WRITE) == 0) return;
#endif
  // Older kernels: one write per page does the same.
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  for (uint64_t at = 0; at < bytes; at += page) static_cast<volatile uint8_t*>(addr)[at] = 0;
}

class FaultingVirtualMemory final : public VirtualMemory {
 public:
  FaultingVirtualMemory(std::unique_ptr<VirtualMemory> inner, bool touch_pages)
      : inner_(std::move(inner)), touch_pages_(touch_pages) {}
  uint64_t granule_bytes() const override { return inner_->granule_bytes(); }
  uint8_t* reserve(uint64_t bytes) override { return inner_->reserve(bytes); }
  void unreserve(uint8_t* base, uint64_t bytes) override { inner_->unreserve(base, bytes); }
  Physical create() override { return inner_->create(); }
  void destroy(Physical granule) noexcept override { inner_->destroy(granule); }
  void map(uint8_t* addr, std::span<const Physical> granules) override {
    inner_->map(addr, granules);
    if (touch_pages_) fault_in(addr, granules.size() * granule_bytes());
  }
  void unmap(uint8_t* addr, uint64_t count, std::vector<Physical>& out) override {
    inner_->unmap(addr, count, out);
  }

 private:
  std::unique_ptr<VirtualMemory> inner_;
  bool touch_pages_;
};

class HostBuffer final : public KvBenchBuffer {
 public:
  HostBuffer(uint64_t bytes, bool touch_pages) : bytes_(bytes) {
    const int populate = touch_pages ? MAP_POPULATE : 0;
    void* p =
        mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | populate, -1, 0);
    if (p == MAP_FAILED) {
      throw CapacityError("cannot allocate " + std::to_string(bytes) + " bytes of host memory (" +
                          std::strerror(errno) + ")");
    }
    data_ = static_cast<uint8_t*>(p);
  }
  ~HostBuffer() override { munmap(data_, bytes_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  uint8_t* data() const override { return data_; }
  uint64_t bytes() const override { return bytes_; }

 private:
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
};

class HostKvBenchMemory final : public KvBenchMemory {
 public:
  HostKvBenchMemory(uint64_t granule_bytes, bool touch_pages)
      : granule_bytes_(granule_bytes), touch_pages_(touch_pages) {}
  std::string name() const override {
    return touch_pages_ ? "host (pages faulted in on commit)" : "host (pages backed lazily)";
  }
  std::unique_ptr<VirtualMemory> make_virtual_memory() override {
    return std::make_unique<FaultingVirtualMemory>(make_host_virtual_memory(granule_bytes_),
                                                   touch_pages_);
  }
  std::unique_ptr<KvBenchBuffer> allocate(uint64_t bytes) override {
    return std::make_unique<HostBuffer>(bytes, touch_pages_);
  }
  void copy(uint8_t* destination, const uint8_t* source, uint64_t bytes) override {
    std::memcpy(destination, source, bytes);
  }

 private:
  uint64_t granule_bytes_;
  bool touch_pages_;
};

// ---------------------------------------------------------------------------------------
// Policies

void check_shape(const KvPolicyShape& s) {
  if (s.bytes_per_token <= 0 || s.max_context_tokens <= 0 || s.slots <= 0 ||
      s.lookahead_tokens < 0 || s.min_bucket_tokens <= 0) {
    throw UsageError("invalid KV policy shape");
  }
}

void check_tokens(const KvPolicyShape& s, int64_t tokens) {
  if (tokens < 0 || tokens > s.max_context_tokens) {
    throw UsageError("KV of " + std::to_string(tokens) + " tokens is outside a context of " +
                     std::to_string(s.max_context_tokens));
  }
}

// The smallest power-of-two multiple of the first bucket that holds `tokens`, at most the
// context: the buffer size both bucket policies grow (and shrink) by.
int64_t bucket_tokens_for(const KvPolicyShape& s, int64_t tokens) {
  int64_t bucket = s.min_bucket_tokens;
  while (bucket < tokens) bucket *= 2;
  return std::min(bucket, s.max_context_tokens);
}

// A new buffer of `bytes`, charged to the ledger (the charge undone when allocation fails).
std::unique_ptr<KvBenchBuffer> allocate_charged(KvBenchMemory& memory, MemoryManager& ledger,
                                                uint64_t bytes) {
  ledger.charge(MemoryCategory::KvCommitted, bytes);
  try {
    return memory.allocate(bytes);
  } catch (...) {
    ledger.release(MemoryCategory::KvCommitted, bytes);
    throw;
  }
}

class FullContextPolicy final : public KvPolicy {
 public:
  FullContextPolicy(const KvPolicyShape& shape, KvBenchMemory& memory, MemoryManager& ledger)
      : shape_(shape), vm_(memory.make_virtual_memory()), ledger_(ledger) {
    check_shape(shape);
    const uint64_t g = vm_->granule_bytes();
    slot_bytes_ =
        ceil_div(static_cast<uint64_t>(shape.max_context_tokens * shape.bytes_per_token), g) * g;
    const uint64_t total = slot_bytes_ * static_cast<uint64_t>(shape.slots);
    base_ = vm_->reserve(total);
    try {
      ledger_.charge(MemoryCategory::KvCommitted, total);
      try {
        vm_->commit_range(base_, total / g);
      } catch (...) {
        ledger_.release(MemoryCategory::KvCommitted, total);
        throw;
      }
    } catch (...) {
      vm_->unreserve(base_, total);
      throw;
    }
  }
  ~FullContextPolicy() override {
    const uint64_t total = slot_bytes_ * static_cast<uint64_t>(shape_.slots);
    try {
      vm_->decommit_range(base_, total / vm_->granule_bytes());
      vm_->unreserve(base_, total);
    } catch (const std::exception& e) {
      // The VirtualMemory's own destructor drops what is left; the ledger still balances.
      logger("engine.kvbench")->error("releasing the full-context KV: {}", e.what());
    }
    ledger_.release(MemoryCategory::KvCommitted, total);
  }

  std::string name() const override { return kv_policy_name(KvPolicyKind::FullContext); }
  void grow(int32_t slot, int64_t tokens) override {
    check_slot(slot);
    check_tokens(shape_, tokens);
  }
  void truncate(int32_t slot, int64_t tokens) override { grow(slot, tokens); }
  void end(int32_t slot) override { check_slot(slot); }
  uint8_t* address(int32_t slot) const override {
    check_slot(slot);
    return base_ + static_cast<uint64_t>(slot) * slot_bytes_;
  }
  uint64_t committed_bytes(int32_t slot) const override {
    check_slot(slot);
    return slot_bytes_;
  }

 private:
  void check_slot(int32_t slot) const {
    if (slot < 0 || slot >= shape_.slots) throw UsageError("KV slot out of range");
  }

  KvPolicyShape shape_;
  std::unique_ptr<VirtualMemory> vm_;
  MemoryManager& ledger_;
  uint64_t slot_bytes_ = 0;
  uint8_t* base_ = nullptr;
};

class BucketGrowthPolicy final : public KvPolicy {
 public:
  BucketGrowthPolicy(const KvPolicyShape& shape, KvBenchMemory& memory, MemoryManager& ledger,
                     bool keep_freed_buckets)
      : shape_(shape), memory_(memory), ledger_(ledger), keep_freed_buckets_(keep_freed_buckets) {
    check_shape(shape);
    slots_.resize(static_cast<size_t>(shape.slots));
  }
  ~BucketGrowthPolicy() override {
    for (int32_t s = 0; s < shape_.slots; ++s) end(s);
    for (auto& [bytes, buffers] : pool_) {
      ledger_.release(MemoryCategory::KvCommitted, bytes * buffers.size());
    }
  }

  std::string name() const override {
    return kv_policy_name(keep_freed_buckets_ ? KvPolicyKind::BucketGrowthCached
                                              : KvPolicyKind::BucketGrowth);
  }

  void grow(int32_t slot, int64_t tokens) override {
    check_tokens(shape_, tokens);
    Slot& s = at(slot);
    if (tokens > s.capacity_tokens) reallocate(s, tokens);
    s.used_tokens = tokens;
  }
  void truncate(int32_t slot, int64_t tokens) override {
    check_tokens(shape_, tokens);
    Slot& s = at(slot);
    s.used_tokens = std::min(s.used_tokens, tokens);  // the buffer stays, as a vector's would
  }
  void end(int32_t slot) override {
    Slot& s = at(slot);
    if (s.buffer) give_back(std::move(s.buffer));
    s = Slot{};
  }
  uint8_t* address(int32_t slot) const override {
    const Slot& s = slots_.at(static_cast<size_t>(slot));
    return s.buffer ? s.buffer->data() : nullptr;
  }
  uint64_t committed_bytes(int32_t slot) const override {
    const Slot& s = slots_.at(static_cast<size_t>(slot));
    return s.buffer ? s.buffer->bytes() : 0;
  }
  uint64_t copied_bytes() const override { return copied_bytes_; }

 private:
  struct Slot {
    std::unique_ptr<KvBenchBuffer> buffer;
    int64_t capacity_tokens = 0;
    int64_t used_tokens = 0;
  };

  Slot& at(int32_t slot) {
    if (slot < 0 || slot >= shape_.slots) throw UsageError("KV slot out of range");
    return slots_[static_cast<size_t>(slot)];
  }

  // A buffer of `bytes`: a kept one of that size when there is one (already charged: the
  // device never saw it freed), else a new allocation charged to the ledger.
  std::unique_ptr<KvBenchBuffer> take(uint64_t bytes) {
    auto kept = pool_.find(bytes);
    if (kept != pool_.end() && !kept->second.empty()) {
      std::unique_ptr<KvBenchBuffer> buffer = std::move(kept->second.back());
      kept->second.pop_back();
      return buffer;
    }
    return allocate_charged(memory_, ledger_, bytes);
  }

  // Frees a buffer, or keeps it for reuse as a caching allocator does (still held, still
  // charged).
  void give_back(std::unique_ptr<KvBenchBuffer> buffer) {
    const uint64_t bytes = buffer->bytes();
    if (keep_freed_buckets_) {
      pool_[bytes].push_back(std::move(buffer));
    } else {
      ledger_.release(MemoryCategory::KvCommitted, bytes);
    }
  }

  // The next power-of-two bucket that holds `tokens`: both buffers exist during the copy.
  void reallocate(Slot& s, int64_t tokens) {
    const int64_t capacity = bucket_tokens_for(shape_, tokens);
    std::unique_ptr<KvBenchBuffer> fresh =
        take(static_cast<uint64_t>(capacity * shape_.bytes_per_token));
    if (s.buffer && s.used_tokens > 0) {
      const auto used = static_cast<uint64_t>(s.used_tokens * shape_.bytes_per_token);
      memory_.copy(fresh->data(), s.buffer->data(), used);
      copied_bytes_ += used;
    }
    if (s.buffer) give_back(std::move(s.buffer));
    s.buffer = std::move(fresh);
    s.capacity_tokens = capacity;
  }

  KvPolicyShape shape_;
  KvBenchMemory& memory_;
  MemoryManager& ledger_;
  bool keep_freed_buckets_;
  std::vector<Slot> slots_;
  std::map<uint64_t, std::vector<std::unique_ptr<KvBenchBuffer>>> pool_;  // by size
  uint64_t copied_bytes_ = 0;
};

class PaddedBatchPolicy final : public KvPolicy {
 public:
  PaddedBatchPolicy(const KvPolicyShape& shape, KvBenchMemory& memory, MemoryManager& ledger)
      : shape_(shape), memory_(memory), ledger_(ledger) {
    check_shape(shape);
    used_.assign(static_cast<size_t>(shape.slots), 0);
    live_.assign(static_cast<size_t>(shape.slots), false);
  }
  ~PaddedBatchPolicy() override { resize(0); }

  std::string name() const override { return kv_policy_name(KvPolicyKind::PaddedBatch); }
  void grow(int32_t slot, int64_t tokens) override {
    check_tokens(shape_, tokens);
    check_slot(slot);
    if (tokens > bucket_tokens_) resize(bucket_tokens_for(shape_, tokens));
    used_[static_cast<size_t>(slot)] = tokens;
    live_[static_cast<size_t>(slot)] = true;
  }
  void truncate(int32_t slot, int64_t tokens) override {
    check_tokens(shape_, tokens);
    check_slot(slot);
    int64_t& used = used_[static_cast<size_t>(slot)];
    used = std::min(used, tokens);
    shrink_if_loose();
  }
  void end(int32_t slot) override {
    check_slot(slot);
    used_[static_cast<size_t>(slot)] = 0;
    live_[static_cast<size_t>(slot)] = false;
    shrink_if_loose();
  }
  uint8_t* address(int32_t slot) const override {
    check_slot(slot);
    if (!buffer_ || !live_[static_cast<size_t>(slot)]) return nullptr;
    return buffer_->data() + static_cast<uint64_t>(slot) * slot_bytes();
  }
  uint64_t committed_bytes(int32_t slot) const override {
    check_slot(slot);
    return buffer_ ? slot_bytes() : 0;  // every slot holds a whole bucket, live or not
  }
  uint64_t copied_bytes() const override { return copied_bytes_; }

 private:
  void check_slot(int32_t slot) const {
    if (slot < 0 || slot >= shape_.slots) throw UsageError("KV slot out of range");
  }
  uint64_t slot_bytes() const {
    return static_cast<uint64_t>(bucket_tokens_ * shape_.bytes_per_token);
  }
  int64_t longest_live() const {
    int64_t longest = 0;
    for (size_t s = 0; s < used_.size(); ++s)
      if (live_[s]) longest = std::max(longest, used_[s]);
    return longest;
  }
  void shrink_if_loose() {
    const bool any_live = std::find(live_.begin(), live_.end(), true) != live_.end();
    if (!any_live) {
      resize(0);
      return;
    }
    const int64_t longest = longest_live();
    const int64_t fits = bucket_tokens_for(shape_, longest);
    if (longest * 4 <= bucket_tokens_ && fits < bucket_tokens_) resize(fits);
  }
  // A new batch buffer of `bucket` tokens per slot (0: none); the old one's live tokens are
  // copied across, both buffers held during the copy.
  void resize(int64_t bucket) {
    std::unique_ptr<KvBenchBuffer> fresh;
    const uint64_t fresh_bytes = static_cast<uint64_t>(bucket * shape_.bytes_per_token) *
                                 static_cast<uint64_t>(shape_.slots);
    if (bucket > 0) {
      fresh = allocate_charged(memory_, ledger_, fresh_bytes);
      const uint64_t stride = static_cast<uint64_t>(bucket * shape_.bytes_per_token);
      for (size_t s = 0; buffer_ && s < used_.size(); ++s) {
        if (!live_[s] || used_[s] == 0) continue;
        const auto used = static_cast<uint64_t>(used_[s] * shape_.bytes_per_token);
        memory_.copy(fresh->data() + s * stride, buffer_->data() + s * slot_bytes(), used);
        copied_bytes_ += used;
      }
    }
    if (buffer_) ledger_.release(MemoryCategory::KvCommitted, buffer_->bytes());
    buffer_ = std::move(fresh);
    bucket_tokens_ = bucket;
  }

  KvPolicyShape shape_;
  KvBenchMemory& memory_;
  MemoryManager& ledger_;
  std::vector<int64_t> used_;
  std::vector<bool> live_;
  std::unique_ptr<KvBenchBuffer> buffer_;
  int64_t bucket_tokens_ = 0;
  uint64_t copied_bytes_ = 0;
};

class GranulePolicy final : public KvPolicy {
 public:
  GranulePolicy(const KvPolicyShape& shape, KvBenchMemory& memory, MemoryManager& ledger,
                bool pooled)
      : kv_(memory.make_virtual_memory(), geometry(shape), ledger), pooled_(pooled) {
    if (pooled_) {
      kv_.set_pool_target(default_kv_pool_granules(kv_.geometry(), shape.prefill_chunk_tokens,
                                                   kv_.granule_bytes()));
      kv_.refill_pool();
    }
  }

  std::string name() const override {
    return kv_policy_name(pooled_ ? KvPolicyKind::GranulePooled : KvPolicyKind::Granule);
  }
  void while_step_runs() override {
    if (pooled_) kv_.refill_pool();
  }
  void grow(int32_t slot, int64_t tokens) override {
    if (!kv_.map_through(slot, tokens)) {
      throw CapacityError("the budget refused KV for " + std::to_string(tokens) + " tokens");
    }
  }
  void truncate(int32_t slot, int64_t tokens) override { kv_.truncate(slot, tokens); }
  void end(int32_t slot) override { kv_.release(slot); }
  uint8_t* address(int32_t slot) const override { return kv_.slot_base(slot); }
  uint64_t committed_bytes(int32_t slot) const override { return kv_.committed_bytes(slot); }

 private:
  static KvGeometry geometry(const KvPolicyShape& shape) {
    check_shape(shape);
    KvGeometry g;
    g.bytes_per_token = shape.bytes_per_token;
    g.max_tokens = shape.max_context_tokens;
    g.slots = shape.slots;
    g.lookahead_tokens = shape.lookahead_tokens;
    return g;
  }

  KvSpace kv_;
  bool pooled_;
};

double percentile(std::vector<double> values, double fraction) {
  if (values.empty()) return 0;
  const auto rank = static_cast<size_t>(std::ceil(fraction * static_cast<double>(values.size())));
  const size_t index = std::min(values.size() - 1, rank == 0 ? 0 : rank - 1);
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(index),
                   values.end());
  return values[index];
}

}  // namespace

KvTrace make_kv_workload(const KvWorkloadOptions& options) {
  return WorkloadBuilder(options).build();
}

std::unique_ptr<KvBenchMemory> make_host_kv_bench_memory(uint64_t granule_bytes, bool touch_pages) {
  return std::make_unique<HostKvBenchMemory>(granule_bytes, touch_pages);
}

std::unique_ptr<KvPolicy> make_full_context_policy(const KvPolicyShape& shape,
                                                   KvBenchMemory& memory, MemoryManager& ledger) {
  return std::make_unique<FullContextPolicy>(shape, memory, ledger);
}

std::unique_ptr<KvPolicy> make_bucket_growth_policy(const KvPolicyShape& shape,
                                                    KvBenchMemory& memory, MemoryManager& ledger) {
  return std::make_unique<BucketGrowthPolicy>(shape, memory, ledger, /*keep_freed_buckets=*/false);
}

std::unique_ptr<KvPolicy> make_cached_bucket_growth_policy(const KvPolicyShape& shape,
                                                           KvBenchMemory& memory,
                                                           MemoryManager& ledger) {
  return std::make_unique<BucketGrowthPolicy>(shape, memory, ledger, /*keep_freed_buckets=*/true);
}

std::unique_ptr<KvPolicy> make_padded_batch_policy(const KvPolicyShape& shape,
                                                   KvBenchMemory& memory, MemoryManager& ledger) {
  return std::make_unique<PaddedBatchPolicy>(shape, memory, ledger);
}

std::unique_ptr<KvPolicy> make_granule_policy(const KvPolicyShape& shape, KvBenchMemory& memory,
                                              MemoryManager& ledger) {
  return std::make_unique<GranulePolicy>(shape, memory, ledger, false);
}

std::unique_ptr<KvPolicy> make_pooled_granule_policy(const KvPolicyShape& shape,
                                                     KvBenchMemory& memory, MemoryManager& ledger) {
  return std::make_unique<GranulePolicy>(shape, memory, ledger, true);
}

const char* kv_policy_name(KvPolicyKind kind) {
  switch (kind) {
    case KvPolicyKind::FullContext:
      return "full context";
    case KvPolicyKind::BucketGrowth:
      return "bucket growth";
    case KvPolicyKind::BucketGrowthCached:
      return "bucket, cached";
    case KvPolicyKind::PaddedBatch:
      return "padded batch";
    case KvPolicyKind::Granule:
      return "granules";
    case KvPolicyKind::GranulePooled:
      return "granules, pooled";
  }
  return "?";
}

KvPolicyResult run_kv_policy(KvPolicy& policy, MemoryManager& ledger, const KvTrace& trace,
                             const KvStepObserver& observer) {
  using Clock = std::chrono::steady_clock;
  KvPolicyResult result;
  result.policy = policy.name();
  const auto chats = static_cast<size_t>(trace.chats);
  std::vector<int64_t> tokens(chats, 0);
  std::vector<uint8_t*> last_address(chats, nullptr);
  for (size_t c = 0; c < chats; ++c) last_address[c] = policy.address(static_cast<int32_t>(c));
  std::vector<double> step_us;
  step_us.reserve(trace.steps.size());
  double committed_sum = 0;

  for (size_t step = 0; step < trace.steps.size(); ++step) {
    double us = 0;
    for (const KvEvent& e : trace.steps[step]) {
      const auto start = Clock::now();
      switch (e.kind) {
        case KvEventKind::Grow:
          policy.grow(e.chat, e.tokens);
          break;
        case KvEventKind::Truncate:
          policy.truncate(e.chat, e.tokens);
          break;
        case KvEventKind::End:
          policy.end(e.chat);
          break;
      }
      us += std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      tokens[static_cast<size_t>(e.chat)] = e.tokens;
      // A live slot's KV that moves (this chat's, or every chat's when one batch buffer is
      // reallocated) would invalidate a captured graph.
      for (size_t c = 0; c < chats; ++c) {
        uint8_t* now = policy.address(static_cast<int32_t>(c));
        if (now == nullptr) continue;
        if (last_address[c] != nullptr && now != last_address[c]) ++result.address_changes;
        last_address[c] = now;
      }
    }
    step_us.push_back(us);
    policy.while_step_runs();
    committed_sum += static_cast<double>(ledger.used_bytes());
    if (observer) observer(step, policy, tokens);
  }

  result.steps = trace.steps.size();
  result.peak_committed_bytes = ledger.peak_bytes();
  result.final_committed_bytes = ledger.used_bytes();
  result.copied_bytes = policy.copied_bytes();
  if (!step_us.empty()) {
    result.mean_committed_bytes = committed_sum / static_cast<double>(step_us.size());
    double total = 0;
    for (double us : step_us) total += us;
    result.memory_us_mean = total / static_cast<double>(step_us.size());
    result.memory_us_p99 = percentile(step_us, 0.99);
    result.memory_us_max = *std::max_element(step_us.begin(), step_us.end());
  }
  return result;
}

std::vector<KvPolicyResult> compare_kv_policies(const KvTrace& trace, const KvPolicyShape& shape,
                                                KvBenchMemory& memory,
                                                const std::vector<KvPolicyKind>& policies) {
  if (shape.slots < trace.chats || shape.max_context_tokens < trace.max_context_tokens) {
    throw UsageError("the KV policy shape is smaller than the workload (slots or context)");
  }
  std::vector<KvPolicyResult> results;
  for (KvPolicyKind kind : policies) {
    // A fresh, unbudgeted ledger per policy: its peak is that policy's alone.
    MemoryManager ledger(std::numeric_limits<uint64_t>::max() / 2);
    std::unique_ptr<KvPolicy> policy;
    switch (kind) {
      case KvPolicyKind::FullContext:
        policy = make_full_context_policy(shape, memory, ledger);
        break;
      case KvPolicyKind::BucketGrowth:
        policy = make_bucket_growth_policy(shape, memory, ledger);
        break;
      case KvPolicyKind::BucketGrowthCached:
        policy = make_cached_bucket_growth_policy(shape, memory, ledger);
        break;
      case KvPolicyKind::PaddedBatch:
        policy = make_padded_batch_policy(shape, memory, ledger);
        break;
      case KvPolicyKind::Granule:
        policy = make_granule_policy(shape, memory, ledger);
        break;
      case KvPolicyKind::GranulePooled:
        policy = make_pooled_granule_policy(shape, memory, ledger);
        break;
    }
    results.push_back(run_kv_policy(*policy, ledger, trace));
  }
  return results;
}

}  // namespace granule
