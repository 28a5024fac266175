// Scheduler: arrival-order admission against the KV budget, decode-first step plans with
// chunked prefill, and recompute preemption of the newest running sequence when KV runs out.
#include "scheduler.h"

#include <algorithm>

#include "granule/error.h"
#include "granule/log.h"
#include "kv_space.h"

namespace granule {

Scheduler::Scheduler(KvSpace& kv, int64_t prefill_chunk_tokens)
    : kv_(kv),
      prefill_chunk_tokens_(std::max<int64_t>(prefill_chunk_tokens, 1)),
      slot_used_(static_cast<size_t>(std::max(kv.geometry().slots, 1)), false) {}

void Scheduler::add(SequenceId id, int64_t prompt_tokens) {
  if (prompt_tokens <= 0) throw UsageError("a sequence needs at least one prompt token");
  if (sequences_.contains(id))
    throw UsageError("sequence " + std::to_string(id) + " is already queued");
  if (!sequences_.empty() && id < sequences_.rbegin()->first) {
    throw UsageError("sequence ids must grow with arrival");  // the order is the priority
  }
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
    kv_.release(*slot);
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

bool Scheduler::decoding(const Entry& e) const {
  return e.slot >= 0 && e.kv_tokens >= e.prompt_tokens && e.kv_tokens + 1 == e.known_tokens;
}

bool Scheduler::prefilling(const Entry& e) const {
  return e.slot >= 0 && e.kv_tokens < e.prompt_tokens;
}

std::optional<int32_t> Scheduler::take_free_slot() {
  for (size_t i = 0; i < slot_used_.size(); ++i) {
    if (!slot_used_[i]) {
      slot_used_[i] = true;
      return static_cast<int32_t>(i);
    }
  }
  return std::nullopt;
}

uint64_t Scheduler::kv_capacity_bytes() const {
  return kv_.budget_available_bytes() + kv_.stats().committed_bytes;
}

uint64_t Scheduler::outstanding_prefill_bytes() const {
  uint64_t bytes = 0;
  for (const auto& [id, e] : sequences_) {
    if (!prefilling(e)) continue;
    const uint64_t whole = kv_.bytes_for_tokens(e.prompt_tokens);
    const uint64_t have = kv_.committed_bytes(e.slot);
    if (whole > have) bytes += whole - have;
  }
  return bytes;
}

bool Scheduler::admissible(const Entry& head) const {
  const uint64_t available = kv_.budget_available_bytes();
  const uint64_t reserved = outstanding_prefill_bytes();
  if (running() == 0) {
    // Nobody else will free memory: the head runs if its prompt fits at all (an oversized
    // one was caught before this).
    return kv_.bytes_for_tokens(head.prompt_tokens) <= available;
  }
  // With others running, leave the head its look-ahead and the running chats one granule to
  // grow into, so admitting a chat does not preempt another on the very next step.
  const uint64_t need = kv_.bytes_for_tokens(head.prompt_tokens + kv_.geometry().lookahead_tokens) +
                        kv_.granule_bytes();
  return reserved <= available && need <= available - reserved;
}

void Scheduler::preempt(SequenceId id, StepPlan& plan) {
  Entry& e = sequences_.at(id);
  kv_.release(e.slot);
  slot_used_[static_cast<size_t>(e.slot)] = false;
  e.slot = -1;
  recomputed_tokens_ += static_cast<uint64_t>(e.kv_tokens);
  e.kv_tokens = 0;
  // Everything known so far is the new prompt: prefilling it again predicts the next token,
  // exactly where the sequence stopped.
  e.prompt_tokens = e.known_tokens;
  ++e.preemptions;
  ++preemptions_;
  // Sorted by arrival, so an older sequence is admitted again before any newer one.
  waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), id), id);
  std::erase_if(plan.work, [id](const ScheduledWork& w) { return w.id == id; });
  plan.preempted.push_back(id);
  logger("engine.scheduler")
      ->debug("preempted sequence {} at {} tokens: the KV budget is full", id, e.known_tokens);
}

bool Scheduler::map_or_preempt(SequenceId id, int64_t tokens, StepPlan& plan) {
  const int32_t slot = sequences_.at(id).slot;
  while (!kv_.map_through(slot, tokens)) {
    // The newest running sequence gives way; the oldest keeps its place, so every chat
    // eventually becomes the oldest and finishes.
    SequenceId newest = id;
    for (auto it = sequences_.rbegin(); it != sequences_.rend(); ++it) {
      if (it->second.slot >= 0) {
        newest = it->first;
        break;
      }
    }
    if (newest != id) {
      preempt(newest, plan);
      continue;
    }
    const bool alone = running() == 1;
    if (!alone) {
      preempt(id, plan);
      return false;
    }
    plan.oversized.push_back({id, tokens, kv_.bytes_for_tokens(tokens), kv_capacity_bytes()});
    std::erase_if(plan.work, [id](const ScheduledWork& w) { return w.id == id; });
    remove(id);
    return false;
  }
  return true;
}

StepPlan Scheduler::next_step() {
  StepPlan plan;
  // Running sequences first, oldest first: decodes, then the prompt chunks of those admitted
  // earlier. A preemption while planning takes a sequence out of this snapshot's later turns.
  std::vector<SequenceId> running_ids;
  for (const auto& [id, e] : sequences_) {
    if (e.slot >= 0) running_ids.push_back(id);
  }
  for (SequenceId id : running_ids) {
    auto it = sequences_.find(id);
    if (it == sequences_.end() || !decoding(it->second)) continue;
    const Entry& e = it->second;
    const ScheduledWork w{id, e.slot, e.kv_tokens, 1, true};
    if (map_or_preempt(id, w.start_position + w.count, plan)) plan.work.push_back(w);
  }
  int64_t budget = prefill_chunk_tokens_;
  auto plan_chunk = [&](SequenceId id) {
    const Entry& e = sequences_.at(id);
    const int64_t count = std::min(e.prompt_tokens - e.kv_tokens, budget);
    const ScheduledWork w{id, e.slot, e.kv_tokens, count, false};
    if (map_or_preempt(id, w.start_position + w.count, plan)) {
      plan.work.push_back(w);
      budget -= count;
    }
  };
  for (SequenceId id : running_ids) {
    if (budget == 0) break;
    auto it = sequences_.find(id);
    if (it != sequences_.end() && prefilling(it->second)) plan_chunk(id);
  }

  // Admission, in arrival order. A step that had to preempt admits nobody: memory is short.
  while (plan.preempted.empty() && budget > 0 && !waiting_.empty()) {
    const SequenceId head_id = waiting_.front();
    Entry& head = sequences_.at(head_id);
    const uint64_t need = kv_.bytes_for_tokens(head.prompt_tokens);
    if (need > kv_capacity_bytes()) {
      plan.oversized.push_back({head_id, head.prompt_tokens, need, kv_capacity_bytes()});
      remove(head_id);
      continue;
    }
    if (!admissible(head)) break;
    auto slot = take_free_slot();
    if (!slot) break;
    head.slot = *slot;
    waiting_.pop_front();
    plan.admitted.push_back(head_id);
    plan_chunk(head_id);
  }
  return plan;
}

std::optional<int32_t> Scheduler::borrow_slot() { return take_free_slot(); }

void Scheduler::return_slot(int32_t slot) { slot_used_.at(static_cast<size_t>(slot)) = false; }

std::optional<int32_t> Scheduler::slot_of(SequenceId id) const {
  auto it = sequences_.find(id);
  if (it == sequences_.end() || it->second.slot < 0) return std::nullopt;
  return it->second.slot;
}

bool Scheduler::contains(SequenceId id) const { return sequences_.contains(id); }

bool Scheduler::is_waiting(SequenceId id) const {
  auto it = sequences_.find(id);
  return it != sequences_.end() && it->second.slot < 0;
}

int32_t Scheduler::preemptions_of(SequenceId id) const {
  auto it = sequences_.find(id);
  return it == sequences_.end() ? 0 : it->second.preemptions;
}

}  // namespace granule
