// Continuous batching against the memory budget: which sequences hold a slot, and what each
// step runs — one decode token for every running sequence, plus prompt chunks within a token
// budget — with the KV of that step mapped before it runs. A chat is admitted only when the
// budget holds its prompt's KV; when running chats outgrow the budget, the newest is preempted
// (its KV freed, recomputed later), and only a chat the budget cannot hold alone fails.
// With KV reuse on, a finished sequence's slot keeps its KV as an idle kept entry: a later
// sequence whose tokens begin the same way takes that slot and computes only the rest.
// Memory pressure is one policy (relieve()): for the step's whole demand, kept entries give
// way first (their KV copied to host memory when a copier is set and the host allowance holds
// it, else dropped), then weights move to streaming (the pressure relief), then running chats
// are preempted; the weights move once, planned ahead for the running chats' remaining
// generation, so a long generation re-plans (and re-captures) at most once.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/sequence.h"

namespace granule {

class KvSpace;

// Copies what a slot's first `tokens` tokens continue from (KvSpace::live_ranges, `bytes` in
// all) to host memory (Backend::copy_kv_to_host); false when the backend cannot. The copy back
// is not the scheduler's: a plan lists it (StepPlan::swap_ins) and the engine queues it before
// the step that reads it.
struct KvCopier {
  std::function<bool(int32_t slot, int64_t tokens, uint64_t bytes, void* host)> to_host;
  // A model with recurrent layers: each slot's state (state_bytes of it) goes to host memory
  // after its KV, in the same buffer (KeptKv::host ends with it).
  uint64_t state_bytes = 0;
  std::function<bool(int32_t slot, void* host)> state_to_host;
};

// An idle chat's KV, kept after its sequence finished for the next request that continues it.
struct KeptKv {
  std::vector<TokenId> tokens;  // whose KV is kept: positions [0, tokens.size())
  std::string session;          // of the sequence that left it ("" none)
  int32_t slot = -1;            // the slot holding it in device memory; -1 once swapped out
  std::vector<uint8_t> host;    // swapped out: the KV of `tokens`, copied to host memory
                                // (then the recurrent state, for a model with one)
  uint64_t last_used = 0;       // larger is more recent: the least recent gives way first
  bool swapped() const { return slot < 0; }
};

// One sequence's share of a step: compute tokens [start_position, start_position + count)
// of its record, start_position being its computed_tokens.
struct ScheduledWork {
  SequenceId id = 0;
  int32_t slot = 0;
  int64_t start_position = 0;
  int64_t count = 0;
  bool decode = false;  // the one token sampled last (else a chunk of uncomputed tokens)
};

// A sequence the budget cannot hold even with every other chat's KV freed.
struct OversizedSequence {
  SequenceId id = 0;
  int64_t tokens = 0;           // what it needed KV for
  uint64_t needed_bytes = 0;    // that KV, in whole granules
  uint64_t capacity_bytes = 0;  // all the KV the budget can hold next to the rest of the ledger
  std::unique_ptr<Sequence> sequence;  // its record, taken out of the scheduler: the caller ends it
};

// KV swapped to host memory that comes back for a chat admitted this step: the slot is mapped
// through `tokens` (host holds their KvSpace::live_ranges), and the engine queues the copy
// (Backend::copy_kv_from_host) ahead of the step, which reads it.
struct KvSwapIn {
  SequenceId id = 0;
  int32_t slot = -1;
  std::vector<uint8_t> host;
  uint64_t state_bytes = 0;  // the recurrent state at the end of `host`, for `tokens` tokens
  int64_t tokens = 0;
};

// What one step runs, and what planning it did to the sequences.
struct StepPlan {
  std::vector<ScheduledWork> work;           // KV already mapped through each item's end
  std::vector<KvSwapIn> swap_ins;            // to copy into their slots before `work` runs
  std::vector<SequenceId> preempted;         // KV freed; back at the front of the waiting queue
  std::vector<OversizedSequence> oversized;  // removed from the scheduler: the caller fails them
  std::vector<SequenceId> admitted;          // took a slot this step (a preempted one: re-admitted)
};

class Scheduler {
 public:
  // Sequences' KV lives in `kv`'s slots; the scheduler maps and frees it there, against the
  // budget of the MemoryManager that KvSpace charges.
  Scheduler(KvSpace& kv, int64_t prefill_chunk_tokens);

  // Takes a sequence (with at least one token, none computed); it waits behind every earlier
  // one. Ids must grow with arrival: the order is the priority.
  Sequence& add(std::unique_ptr<Sequence> sequence);
  // Takes a sequence out (finished or cancelled), frees its KV and slot, and hands the record
  // back; null when the id is unknown.
  std::unique_ptr<Sequence> remove(SequenceId id);
  // The same for a sequence that ended well: with KV reuse on, its slot keeps the KV of its
  // computed tokens as a kept entry (labelled with its session) instead of freeing it.
  std::unique_ptr<Sequence> retire(SequenceId id);

  // KV reuse (off until set): keep finished sequences' KV, swapping it to at most
  // `host_bytes` of host memory with `copier` (unset functions: drop instead).
  void set_kv_reuse(bool on, uint64_t host_bytes, KvCopier copier = {});
  // A model with recurrent layers (Qwen3.5): each slot's recurrent state covers exactly its
  // computed tokens, a snapshot that stays in the slot when a sequence retires. A kept entry is
  // then reused only whole (the head continues from the snapshot's length; a shorter match
  // recomputes from the start); idle KV goes to host memory with its state (KvCopier's
  // state_to_host), or is dropped when the copier has none.
  void set_recurrent_state(bool on) { recurrent_ = on; }
  // Drops the kept entries of `session`, or all of them for "", freeing their KV.
  void drop_kept(const std::string& session);
  const std::vector<KeptKv>& kept() const { return kept_; }
  // After the backend ran `plan`: the planned tokens are computed (their KV is in the slots).
  void complete(const StepPlan& plan);

  Sequence* find(SequenceId id);
  const Sequence* find(SequenceId id) const;
  // Every sequence, by arrival.
  const std::map<SequenceId, std::unique_ptr<Sequence>>& sequences() const { return sequences_; }

  // Plans the next step, oldest sequence first. First the pressure policy plans ahead: when the
  // budget would not hold what the running chats may still generate, weights move once for all
  // of it. Every running sequence with one uncomputed token (the one sampled last) computes it,
  // and those with more (a prompt, or everything known after a preemption) get chunks until
  // prefill_chunk_tokens are spent; each item's KV is mapped as it is planned. When the budget
  // refuses a mapping, the policy frees memory for the step's whole demand, and then the running
  // sequence that arrived last is preempted (its KV freed and nothing computed: it waits at the
  // front to compute every token again) until the mapping fits; a sequence alone in the budget
  // that still does not fit is oversized. Then, unless this step preempted, waiting sequences
  // are admitted in arrival order while a slot is free and the budget holds the head's KV plus a
  // margin; a head that does not fit blocks those behind it, so a long chat is never starved by
  // short ones.
  StepPlan next_step();

  // The weights step of the pressure policy: free `bytes` of device memory elsewhere (the CUDA
  // backend moves resident layers to streaming, all in one re-plan) and say how much it freed;
  // 0 when it cannot free that much (then it frees nothing). Unset: kept KV, then preemption.
  void set_pressure_relief(std::function<uint64_t(uint64_t bytes)> relieve) {
    relieve_ = std::move(relieve);
  }

  // What the running chats' KV is planned to grow by, to the end of their generation with the
  // look-ahead: the room a weight re-plan (Backend::rebalance) leaves free beside the KV.
  uint64_t planned_kv_growth_bytes() const { return demand().planned; }

  // A slot outside the scheduler's use (teacher-forced logits); nullopt when all are taken
  // (kept entries give theirs up first).
  std::optional<int32_t> borrow_slot();
  void return_slot(int32_t slot);

  std::optional<int32_t> slot_of(SequenceId id) const;
  bool contains(SequenceId id) const;
  bool is_waiting(SequenceId id) const;
  int32_t preemptions_of(SequenceId id) const;  // times this sequence was preempted
  bool empty() const { return sequences_.empty(); }
  size_t waiting() const { return waiting_.size(); }
  size_t running() const { return sequences_.size() - waiting_.size(); }
  uint64_t preemptions() const { return preemptions_; }  // all sequences, cumulative
  // Tokens whose KV preemptions freed, to be prefilled again; cumulative.
  uint64_t recomputed_tokens() const { return recomputed_tokens_; }
  // Kept KV, cumulative: prompt tokens reused, copies to and from host memory, entries dropped.
  uint64_t prefix_reused_tokens() const { return prefix_reused_tokens_; }
  uint64_t swap_outs() const { return swap_outs_; }
  uint64_t swap_out_bytes() const { return swap_out_bytes_; }
  uint64_t swap_ins() const { return swap_ins_; }
  uint64_t swap_in_bytes() const { return swap_in_bytes_; }
  uint64_t kept_dropped() const { return kept_dropped_; }
  uint64_t swapped_bytes() const;  // host memory the swapped-out entries hold now

 private:
  // One token left to compute: the sampled one (no prefill budget needed).
  static bool decoding(const Sequence& s) { return s.running() && s.uncomputed_tokens() == 1; }
  static bool prefilling(const Sequence& s) { return s.running() && s.uncomputed_tokens() > 1; }
  std::optional<int32_t> take_free_slot();
  // Maps the sequence's KV through `tokens`, relieving pressure and then preempting newer
  // sequences (or, last, this one) as the budget needs. Returns false when `id` itself was
  // preempted or found oversized.
  bool map_or_preempt(SequenceId id, int64_t tokens, StepPlan& plan);
  void preempt(SequenceId id, StepPlan& plan);
  // KV the budget could hold if every sequence's KV were freed.
  uint64_t kv_capacity_bytes() const;

  // The KV a step asks for beyond what the slots hold. `now`: what it cannot run without —
  // every running chat's known tokens (this step's decode token and the prompt still to
  // compute) and, with a head, the head's prompt with its look-ahead and a granule for the
  // running chats' growth. `end`: that, with every chat's KV grown to the end of its
  // generation (horizon_tokens). `planned`: `end` with each chat's look-ahead past its last
  // token, the room a re-plan makes (so the look-ahead mapped near the end never asks again).
  struct Demand {
    uint64_t now = 0;
    uint64_t end = 0;
    uint64_t planned = 0;
  };
  // The one formula. `held`: bytes already committed in the slot the head will take (a kept
  // prefix of its prompt).
  Demand demand(const Sequence* head = nullptr, uint64_t held = 0) const;
  // The most tokens whose KV a sequence will hold: its known tokens and all it may still
  // sample but the last (whose KV is never computed), within the slot. The same at every step
  // of its generation, so room planned for it once stays enough.
  int64_t horizon_tokens(const Sequence& s) const;
  // The pressure policy, the one place memory is freed for KV: kept KV gives way (all but the
  // entry in slot `spare`) while `d.now` does not fit; then, when `d.end` is more than what is
  // free and what kept KV can still give, weights move in one re-plan for `d.planned` beyond
  // that, or, when the backend cannot free that much, for `d.now`. Returns whether `d.now`
  // fits; preemption is the caller's.
  bool relieve(const Demand& d, int32_t spare = -1);
  // Bytes the kept entries in device memory hold, the one in slot `spare` left out.
  uint64_t kept_device_bytes(int32_t spare) const;
  // Whether the budget holds the head's admission demand (`held` as for demand()).
  bool admissible(const Sequence& head, uint64_t held) const;

  // The kept entry whose KV the head should continue from, and how many of its tokens.
  struct KeptMatch {
    size_t index = 0;
    int64_t tokens = 0;
  };
  std::optional<KeptMatch> find_kept(const Sequence& head) const;
  // Gives up the least recently used kept entry in device memory other than the one in slot
  // `spare` (swapped to host memory, or dropped); false when there is none.
  bool evict_kept(int32_t spare = -1);
  // Takes the entry out of the kept list, freeing its slot and KV (a swapped one: its copy).
  void erase_kept(size_t index, bool count_drop);
  // Fits `bytes` more into the host allowance by dropping the least recently used swapped
  // entries; false when the allowance cannot hold them at all.
  bool make_host_room(uint64_t bytes);

  KvSpace& kv_;
  int64_t prefill_chunk_tokens_;
  std::vector<bool> slot_used_;
  std::map<SequenceId, std::unique_ptr<Sequence>> sequences_;  // ordered by id = by arrival
  std::deque<SequenceId> waiting_;  // in arrival order: preempted ones return to the front
  uint64_t preemptions_ = 0;
  uint64_t recomputed_tokens_ = 0;
  std::function<uint64_t(uint64_t)> relieve_;
  // KV reuse.
  bool reuse_ = false;
  bool recurrent_ = false;
  uint64_t host_bytes_limit_ = 0;
  KvCopier copier_;
  std::vector<KeptKv> kept_;
  uint64_t use_clock_ = 0;
  uint64_t prefix_reused_tokens_ = 0, swap_outs_ = 0, swap_out_bytes_ = 0, swap_ins_ = 0,
           swap_in_bytes_ = 0, kept_dropped_ = 0;
};

}  // namespace granule
