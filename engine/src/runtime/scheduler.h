// Continuous batching against the memory budget: which sequences hold a slot, and what each
// step runs — one decode token for every running sequence, plus prompt chunks within a token
// budget — with the KV of that step mapped before it runs. A chat is admitted only when the
// budget holds its prompt's KV; when running chats outgrow the budget, the newest is preempted
// (its KV freed, recomputed later), and only a chat the budget cannot hold alone fails.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "runtime/sequence.h"

namespace granule {

class KvSpace;

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

// What one step runs, and what planning it did to the sequences.
struct StepPlan {
  std::vector<ScheduledWork> work;           // KV already mapped through each item's end
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
  // After the backend ran `plan`: the planned tokens are computed (their KV is in the slots).
  void complete(const StepPlan& plan);

  Sequence* find(SequenceId id);
  const Sequence* find(SequenceId id) const;
  // Every sequence, by arrival.
  const std::map<SequenceId, std::unique_ptr<Sequence>>& sequences() const { return sequences_; }

  // Plans the next step, oldest sequence first. Every running sequence with one uncomputed
  // token (the one sampled last) computes it, and those with more (a prompt, or everything
  // known after a preemption) get chunks until prefill_chunk_tokens are spent; each item's KV is
  // mapped as it is planned. When the budget refuses a mapping, the running sequence that arrived
  // last is preempted (its KV freed and nothing computed: it waits at the front to compute every
  // token again) until the mapping fits; a sequence alone in the budget that still does not fit is
  // oversized. Then, unless this step preempted, waiting sequences are admitted in arrival order
  // while a slot is free and the budget holds the head's KV plus a margin; a head that does not fit
  // blocks those behind it, so a long chat is never starved by short ones.
  StepPlan next_step();

  // What to try before preempting or refusing for want of KV: free `bytes` of device memory
  // elsewhere (the CUDA backend moves resident layers to streaming) and say how much it freed.
  // Unset, or returning 0: preemption as above.
  void set_pressure_relief(std::function<uint64_t(uint64_t bytes)> relieve) {
    relieve_ = std::move(relieve);
  }

  // A slot outside the scheduler's use (teacher-forced logits); nullopt when all are taken.
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

 private:
  // One token left to compute: the sampled one (no prefill budget needed).
  static bool decoding(const Sequence& s) { return s.running() && s.uncomputed_tokens() == 1; }
  static bool prefilling(const Sequence& s) { return s.running() && s.uncomputed_tokens() > 1; }
  std::optional<int32_t> take_free_slot();
  // Maps the sequence's KV through `tokens`, preempting newer sequences (or, last, this one)
  // as the budget needs. Returns false when `id` itself was preempted or found oversized.
  bool map_or_preempt(SequenceId id, int64_t tokens, StepPlan& plan);
  void preempt(SequenceId id, StepPlan& plan);
  // KV the budget could hold if every sequence's KV were freed.
  uint64_t kv_capacity_bytes() const;
  // KV the running sequences still in their prompt will map before they decode.
  uint64_t outstanding_prefill_bytes() const;
  bool admissible(const Sequence& head) const;

  KvSpace& kv_;
  int64_t prefill_chunk_tokens_;
  std::vector<bool> slot_used_;
  std::map<SequenceId, std::unique_ptr<Sequence>> sequences_;  // ordered by id = by arrival
  std::deque<SequenceId> waiting_;  // in arrival order: preempted ones return to the front
  uint64_t preemptions_ = 0;
  uint64_t recomputed_tokens_ = 0;
  std::function<uint64_t(uint64_t)> relieve_;
};

}  // namespace granule
