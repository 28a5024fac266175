// Scheduler: arrival-order admission against the KV budget, decode-first step plans with
// chunked prefill, and recompute preemption of the newest running sequence when KV runs out.
#include "runtime/scheduler.h"

#include <algorithm>

#include "granule/error.h"
#include "granule/log.h"
#include "memory/kv_space.h"

namespace granule {

Scheduler::Scheduler(KvSpace& kv, int64_t prefill_chunk_tokens)
    : kv_(kv),
      prefill_chunk_tokens_(std::max<int64_t>(prefill_chunk_tokens, 1)),
      slot_used_(static_cast<size_t>(std::max(kv.geometry().slots, 1)), false) {}

Sequence& Scheduler::add(std::unique_ptr<Sequence> sequence) {
  if (!sequence || sequence->tokens.empty())
    throw UsageError("a sequence needs at least one prompt token");
  const SequenceId id = sequence->id;
  if (sequences_.contains(id))
    throw UsageError("sequence " + std::to_string(id) + " is already queued");
  if (!sequences_.empty() && id < sequences_.rbegin()->first) {
    throw UsageError("sequence ids must grow with arrival");  // the order is the priority
  }
  sequence->slot = -1;
  sequence->computed_tokens = 0;
  Sequence& added = *sequences_.emplace(id, std::move(sequence)).first->second;
  waiting_.push_back(id);
  return added;
}

std::unique_ptr<Sequence> Scheduler::remove(SequenceId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return nullptr;
  std::unique_ptr<Sequence> sequence = std::move(it->second);
  sequences_.erase(it);
  if (sequence->running()) {
    slot_used_[static_cast<size_t>(sequence->slot)] = false;
    kv_.release(sequence->slot);
  } else {
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
  }
  return sequence;
}

void Scheduler::complete(const StepPlan& plan) {
  for (const ScheduledWork& w : plan.work) {
    Sequence* s = find(w.id);
    if (!s || !s->running()) continue;  // removed, or preempted since
    s->computed_tokens =
        std::min(w.start_position + w.count, static_cast<int64_t>(s->tokens.size()));
  }
}

Sequence* Scheduler::find(SequenceId id) {
  auto it = sequences_.find(id);
  return it == sequences_.end() ? nullptr : it->second.get();
}

const Sequence* Scheduler::find(SequenceId id) const {
  auto it = sequences_.find(id);
  return it == sequences_.end() ? nullptr : it->second.get();
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
  for (const auto& [id, s] : sequences_) {
    if (!prefilling(*s)) continue;
    const uint64_t whole = kv_.bytes_for_tokens(static_cast<int64_t>(s->tokens.size()));
    const uint64_t have = kv_.committed_bytes(s->slot);
    if (whole > have) bytes += whole - have;
  }
  return bytes;
}

bool Scheduler::admissible(const Sequence& head) const {
  const auto head_tokens = static_cast<int64_t>(head.tokens.size());
  const uint64_t available = kv_.budget_available_bytes();
  const uint64_t reserved = outstanding_prefill_bytes();
  if (running() == 0) {
    // Nobody else will free memory: the head runs if its tokens fit at all (an oversized
    // one was caught before this).
    return kv_.bytes_for_tokens(head_tokens) <= available;
  }
  // With others running, leave the head its look-ahead and the running chats one granule to
  // grow into, so admitting a chat does not preempt another on the very next step.
  const uint64_t need =
      kv_.bytes_for_tokens(head_tokens + kv_.geometry().lookahead_tokens) + kv_.granule_bytes();
  return reserved <= available && need <= available - reserved;
}

void Scheduler::preempt(SequenceId id, StepPlan& plan) {
  Sequence& s = *sequences_.at(id);
  kv_.release(s.slot);
  slot_used_[static_cast<size_t>(s.slot)] = false;
  s.slot = -1;
  recomputed_tokens_ += static_cast<uint64_t>(s.computed_tokens);
  // Nothing is computed any more: computing every known token again predicts the next one,
  // exactly where the sequence stopped.
  s.computed_tokens = 0;
  ++s.preemptions;
  ++preemptions_;
  // Sorted by arrival, so an older sequence is admitted again before any newer one.
  waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), id), id);
  std::erase_if(plan.work, [id](const ScheduledWork& w) { return w.id == id; });
  plan.preempted.push_back(id);
  logger("engine.scheduler")
      ->debug("preempted sequence {} at {} tokens: the KV budget is full", id, s.tokens.size());
}

bool Scheduler::map_or_preempt(SequenceId id, int64_t tokens, StepPlan& plan) {
  const int32_t slot = sequences_.at(id)->slot;
  while (!kv_.map_through(slot, tokens)) {
    // Device memory held elsewhere first (weights that can stream), then KV of others.
    if (relieve_) {
      const uint64_t want = kv_.bytes_for_tokens(tokens + kv_.geometry().lookahead_tokens);
      const uint64_t have = kv_.committed_bytes(slot) + kv_.budget_available_bytes();
      if (relieve_(want > have ? want - have : kv_.granule_bytes()) > 0) continue;
    }
    // The newest running sequence gives way; the oldest keeps its place, so every chat
    // eventually becomes the oldest and finishes.
    SequenceId newest = id;
    for (auto it = sequences_.rbegin(); it != sequences_.rend(); ++it) {
      if (it->second->running()) {
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
    const uint64_t needed = kv_.bytes_for_tokens(tokens), capacity = kv_capacity_bytes();
    std::erase_if(plan.work, [id](const ScheduledWork& w) { return w.id == id; });
    plan.oversized.push_back({id, tokens, needed, capacity, remove(id)});
    return false;
  }
  return true;
}

StepPlan Scheduler::next_step() {
  StepPlan plan;
  // Running sequences first, oldest first: those with the one sampled token to compute, then
  // the chunks of those with more. A preemption while planning takes a sequence out of this
  // snapshot's later turns.
  std::vector<SequenceId> running_ids;
  for (const auto& [id, s] : sequences_) {
    if (s->running()) running_ids.push_back(id);
  }
  for (SequenceId id : running_ids) {
    const Sequence* s = find(id);
    if (!s || !decoding(*s)) continue;
    const ScheduledWork w{id, s->slot, s->computed_tokens, 1, true};
    if (map_or_preempt(id, w.start_position + w.count, plan)) plan.work.push_back(w);
  }
  int64_t budget = prefill_chunk_tokens_;
  auto plan_chunk = [&](SequenceId id) {
    const Sequence& s = *sequences_.at(id);
    const int64_t count = std::min(s.uncomputed_tokens(), budget);
    const ScheduledWork w{id, s.slot, s.computed_tokens, count, false};
    if (map_or_preempt(id, w.start_position + w.count, plan)) {
      plan.work.push_back(w);
      budget -= count;
    }
  };
  for (SequenceId id : running_ids) {
    if (budget == 0) break;
    const Sequence* s = find(id);
    if (s && prefilling(*s)) plan_chunk(id);
  }

  // Admission, in arrival order. A step that had to preempt admits nobody: memory is short.
  while (plan.preempted.empty() && budget > 0 && !waiting_.empty()) {
    const SequenceId head_id = waiting_.front();
    Sequence& head = *sequences_.at(head_id);
    const auto head_tokens = static_cast<int64_t>(head.tokens.size());
    const uint64_t need = kv_.bytes_for_tokens(head_tokens);
    if (relieve_ && need > kv_capacity_bytes()) relieve_(need - kv_capacity_bytes());
    if (const uint64_t capacity = kv_capacity_bytes(); need > capacity) {
      plan.oversized.push_back({head_id, head_tokens, need, capacity, remove(head_id)});
      continue;
    }
    if (!admissible(head) && relieve_) {
      // What admission asks beyond what is free: the head's KV with its look-ahead, a granule
      // for the running chats, and the prompts still being computed.
      const uint64_t want = kv_.bytes_for_tokens(head_tokens + kv_.geometry().lookahead_tokens) +
                            kv_.granule_bytes() + outstanding_prefill_bytes();
      const uint64_t available = kv_.budget_available_bytes();
      if (want > available) relieve_(want - available);
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
  const Sequence* s = find(id);
  if (!s || !s->running()) return std::nullopt;
  return s->slot;
}

bool Scheduler::contains(SequenceId id) const { return sequences_.contains(id); }

bool Scheduler::is_waiting(SequenceId id) const {
  const Sequence* s = find(id);
  return s && !s->running();
}

int32_t Scheduler::preemptions_of(SequenceId id) const {
  const Sequence* s = find(id);
  return s ? s->preemptions : 0;
}

}  // namespace granule
