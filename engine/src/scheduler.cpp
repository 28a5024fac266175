// Scheduler: slot admission in arrival order, decode-first step plans, chunked prefill.
#include "scheduler.h"

#include <algorithm>

#include "granule/error.h"

namespace granule {

Scheduler::Scheduler(int32_t slots, int64_t prefill_chunk_tokens)
    : prefill_chunk_tokens_(std::max<int64_t>(prefill_chunk_tokens, 1)),
      slot_used_(static_cast<size_t>(std::max(slots, 1)), false) {}

void Scheduler::add(SequenceId id, int64_t prompt_tokens) {
  if (prompt_tokens <= 0) throw UsageError("a sequence needs at least one prompt token");
  Entry e;
  e.prompt_tokens = prompt_tokens;
  e.known_tokens = prompt_tokens;
  sequences_[id] = e;
  waiting_.push_back(id);
}

std::optional<int32_t> Scheduler::remove(SequenceId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return std::nullopt;
  std::optional<int32_t> slot;
  if (it->second.slot >= 0) {
    slot = it->second.slot;
    slot_used_[static_cast<size_t>(*slot)] = false;
  } else {
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
  }
  sequences_.erase(it);
  return slot;
}

void Scheduler::advance(SequenceId id, int64_t tokens) {
  Entry& e = sequences_.at(id);
  e.kv_tokens = std::min(e.kv_tokens + tokens, e.known_tokens);
}

void Scheduler::append_token(SequenceId id) { ++sequences_.at(id).known_tokens; }

std::optional<int32_t> Scheduler::take_free_slot() {
  for (size_t i = 0; i < slot_used_.size(); ++i) {
    if (!slot_used_[i]) {
      slot_used_[i] = true;
      return static_cast<int32_t>(i);
    }
  }
  return std::nullopt;
}

std::vector<ScheduledWork> Scheduler::next_step() {
  while (!waiting_.empty()) {
    auto slot = take_free_slot();
    if (!slot) break;
    sequences_.at(waiting_.front()).slot = *slot;
    waiting_.pop_front();
  }
  std::vector<ScheduledWork> work;
  // Decodes first: a running chat never waits for someone else's prompt.
  for (const auto& [id, e] : sequences_) {
    if (e.slot >= 0 && e.kv_tokens >= e.prompt_tokens && e.kv_tokens + 1 == e.known_tokens) {
      work.push_back({id, e.slot, e.kv_tokens, 1, true});
    }
  }
  int64_t budget = prefill_chunk_tokens_;
  for (const auto& [id, e] : sequences_) {
    if (budget == 0) break;
    if (e.slot < 0 || e.kv_tokens >= e.prompt_tokens) continue;
    const int64_t count = std::min(e.prompt_tokens - e.kv_tokens, budget);
    work.push_back({id, e.slot, e.kv_tokens, count, false});
    budget -= count;
  }
  return work;
}

std::optional<int32_t> Scheduler::borrow_slot() { return take_free_slot(); }

void Scheduler::return_slot(int32_t slot) { slot_used_.at(static_cast<size_t>(slot)) = false; }

std::optional<int32_t> Scheduler::slot_of(SequenceId id) const {
  auto it = sequences_.find(id);
  if (it == sequences_.end() || it->second.slot < 0) return std::nullopt;
  return it->second.slot;
}

bool Scheduler::contains(SequenceId id) const { return sequences_.contains(id); }

}  // namespace granule
