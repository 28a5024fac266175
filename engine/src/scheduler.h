// Continuous batching: which sequences hold a slot, and what each step runs — one decode
// token for every sequence past its prompt, plus prompt chunks within a token budget, so a
// long prompt never stalls the chats that are already answering.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

namespace granule {

using SequenceId = int64_t;

// One sequence's share of a step: feed tokens [start_position, start_position + count).
struct ScheduledWork {
  SequenceId id = 0;
  int32_t slot = 0;
  int64_t start_position = 0;
  int64_t count = 0;
  bool decode = false;   // one generated token (else a prompt chunk)
};

class Scheduler {
 public:
  Scheduler(int32_t slots, int64_t prefill_chunk_tokens);

  // Queues a sequence whose prompt has prompt_tokens tokens; it waits for a free slot.
  void add(SequenceId id, int64_t prompt_tokens);
  // Forgets a sequence (finished or cancelled) and frees its slot. Returns the slot it held.
  std::optional<int32_t> remove(SequenceId id);
  // After a step: the sequence now has `tokens` more tokens in its KV.
  void advance(SequenceId id, int64_t tokens);
  // A sampled token was appended: the sequence has one more token to feed.
  void append_token(SequenceId id);

  // Admits waiting sequences into free slots (first come, first served), then plans: every
  // running sequence with all its tokens but the last in KV decodes one token; sequences
  // still in their prompt get chunks until prefill_chunk_tokens are spent.
  std::vector<ScheduledWork> next_step();

  // A slot outside the scheduler's use (teacher-forced logits); nullopt when all are taken.
  std::optional<int32_t> borrow_slot();
  void return_slot(int32_t slot);

  std::optional<int32_t> slot_of(SequenceId id) const;
  bool contains(SequenceId id) const;
  bool empty() const { return sequences_.empty(); }
  size_t waiting() const { return waiting_.size(); }
  size_t running() const { return sequences_.size() - waiting_.size(); }

 private:
  struct Entry {
    int32_t slot = -1;           // -1 while waiting
    int64_t prompt_tokens = 0;
    int64_t known_tokens = 0;    // prompt + sampled tokens
    int64_t kv_tokens = 0;       // tokens already in KV
  };
  std::optional<int32_t> take_free_slot();

  int64_t prefill_chunk_tokens_;
  std::vector<bool> slot_used_;
  std::map<SequenceId, Entry> sequences_;   // ordered by id = by arrival
  std::deque<SequenceId> waiting_;
};

}  // namespace granule
