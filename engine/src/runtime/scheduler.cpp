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

std::unique_ptr<Sequence> Scheduler::retire(SequenceId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return nullptr;
  if (!reuse_ || !it->second->running() || it->second->computed_tokens <= 0) return remove(id);
  std::unique_ptr<Sequence> sequence = std::move(it->second);
  sequences_.erase(it);
  // An older entry of the same chat is stale: this one continues where it left off.
  if (!sequence->session.empty()) drop_kept(sequence->session);
  KeptKv kept;
  // Only computed tokens have KV: the token sampled last (or the end of generation) has none.
  kept.tokens.assign(
      sequence->tokens.begin(),
      sequence->tokens.begin() + static_cast<std::ptrdiff_t>(sequence->computed_tokens));
  kept.session = sequence->session;
  kept.slot = sequence->slot;
  kept.last_used = ++use_clock_;
  kv_.truncate(kept.slot, sequence->computed_tokens);  // the look-ahead goes back at once
  kept_.push_back(std::move(kept));
  return sequence;
}

void Scheduler::set_kv_reuse(bool on, uint64_t host_bytes, KvCopier copier) {
  if (!on) drop_kept({});
  reuse_ = on;
  host_bytes_limit_ = host_bytes;
  copier_ = std::move(copier);
}

void Scheduler::drop_kept(const std::string& session) {
  for (size_t i = kept_.size(); i-- > 0;) {
    if (session.empty() || kept_[i].session == session) erase_kept(i, false);
  }
}

void Scheduler::erase_kept(size_t index, bool count_drop) {
  KeptKv& kept = kept_.at(index);
  if (!kept.swapped()) {
    kv_.release(kept.slot);
    slot_used_[static_cast<size_t>(kept.slot)] = false;
  }
  if (count_drop) ++kept_dropped_;
  kept_.erase(kept_.begin() + static_cast<std::ptrdiff_t>(index));
}

uint64_t Scheduler::swapped_bytes() const {
  uint64_t bytes = 0;
  for (const KeptKv& k : kept_) bytes += k.host.size();
  return bytes;
}

bool Scheduler::make_host_room(uint64_t bytes) {
  if (bytes > host_bytes_limit_) return false;
  while (swapped_bytes() + bytes > host_bytes_limit_) {
    std::optional<size_t> oldest;
    for (size_t i = 0; i < kept_.size(); ++i) {
      if (kept_[i].swapped() && (!oldest || kept_[i].last_used < kept_[*oldest].last_used))
        oldest = i;
    }
    if (!oldest) return false;
    erase_kept(*oldest, true);
  }
  return true;
}

bool Scheduler::evict_kept(int32_t spare) {
  std::optional<size_t> oldest;
  for (size_t i = 0; i < kept_.size(); ++i) {
    const KeptKv& k = kept_[i];
    if (k.swapped() || k.slot == spare) continue;
    if (!oldest || k.last_used < kept_[*oldest].last_used) oldest = i;
  }
  if (!oldest) return false;
  const int32_t slot = kept_[*oldest].slot;
  const auto kept_tokens = static_cast<int64_t>(kept_[*oldest].tokens.size());
  const uint64_t bytes = kv_.live_bytes(kept_tokens);
  std::vector<uint8_t> host;
  // A recurrent model's state goes with its KV, or nothing goes.
  const uint64_t state = recurrent_ ? copier_.state_bytes : 0;
  const bool copies = copier_.to_host && (!recurrent_ || (state > 0 && copier_.state_to_host));
  // Making host room drops swapped entries only: this one stays, at a new index.
  if (copies && make_host_room(bytes + state)) {
    try {
      host.resize(bytes + state);
      if (!copier_.to_host(slot, kept_tokens, bytes, host.data()) ||
          (state > 0 && !copier_.state_to_host(slot, host.data() + bytes)))
        host = {};
    } catch (const DeviceLostError&) {
      throw;
    } catch (const std::exception& e) {
      logger("engine.scheduler")->warn("copying idle KV to host memory: {}", e.what());
      host = {};
    }
  }
  const auto it =
      std::find_if(kept_.begin(), kept_.end(), [slot](const KeptKv& k) { return k.slot == slot; });
  const auto index = static_cast<size_t>(it - kept_.begin());
  if (host.empty() && bytes > 0) {
    logger("engine.scheduler")
        ->debug("dropped the idle KV of {} tokens in slot {}", it->tokens.size(), slot);
    erase_kept(index, true);
    return true;
  }
  kv_.release(slot);
  slot_used_[static_cast<size_t>(slot)] = false;
  it->slot = -1;
  it->host = std::move(host);
  ++swap_outs_;
  swap_out_bytes_ += bytes;
  logger("engine.scheduler")
      ->debug("swapped the idle KV of {} tokens in slot {} to host memory ({} bytes)",
              it->tokens.size(), slot, bytes);
  return true;
}

std::optional<Scheduler::KeptMatch> Scheduler::find_kept(const Sequence& head) const {
  std::optional<KeptMatch> best;
  bool best_same = false;
  // At least one token stays to compute: its logits predict the first new token.
  const auto limit = static_cast<int64_t>(head.tokens.size()) - 1;
  for (size_t i = 0; i < kept_.size(); ++i) {
    const KeptKv& k = kept_[i];
    const auto n = static_cast<int64_t>(std::min<size_t>(k.tokens.size(), head.tokens.size()));
    int64_t common = 0;
    while (common < n &&
           k.tokens[static_cast<size_t>(common)] == head.tokens[static_cast<size_t>(common)])
      ++common;
    common = std::min(common, limit);
    if (common <= 0) continue;
    // The recurrent state covers the kept tokens, all of them: it is reused whole or not at all.
    if (recurrent_ && common < static_cast<int64_t>(k.tokens.size())) continue;
    // A sliding-window part keeps the last window of the kept tokens only: a shorter prefix is
    // reused while the slot still holds what its continuation reads, a swapped one never (its
    // copy holds the window of all the kept tokens).
    if (common < static_cast<int64_t>(k.tokens.size()) && kv_.parts() > 1 &&
        (k.swapped() || !kv_.can_continue_at(k.slot, common)))
      continue;
    const bool same = !head.session.empty() && k.session == head.session;
    // Another chat's KV is taken only when none of it would be lost (it is a prefix of the
    // head's prompt); KV kept without a session is anyone's.
    if (!same && !k.session.empty() && common < static_cast<int64_t>(k.tokens.size())) continue;
    const bool better = !best || common > best->tokens ||
                        (common == best->tokens && same && !best_same) ||
                        (common == best->tokens && same == best_same && !k.swapped() &&
                         kept_[best->index].swapped());
    if (better) {
      best = KeptMatch{i, common};
      best_same = same;
    }
  }
  return best;
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

int64_t Scheduler::horizon_tokens(const Sequence& s) const {
  const int64_t remaining = std::max<int64_t>(s.params.max_tokens - s.generated, 1);
  return std::min(static_cast<int64_t>(s.tokens.size()) + remaining - 1, kv_.geometry().max_tokens);
}

Scheduler::Demand Scheduler::demand(const Sequence* head, uint64_t held) const {
  const auto beyond = [](uint64_t want, uint64_t have) { return want > have ? want - have : 0; };
  const int64_t lookahead = kv_.geometry().lookahead_tokens;
  Demand d;
  // One chat's share: `now` bytes for this step, KV through its `last` token at the end of its
  // generation, and the look-ahead past that, in a slot holding `have`.
  const auto add = [&](uint64_t now, int64_t last, uint64_t have) {
    d.now += beyond(now, have);
    d.end += beyond(std::max(now, kv_.bytes_for_tokens(last)), have);
    d.planned += beyond(std::max(now, kv_.bytes_for_tokens(last + lookahead)), have);
  };
  for (const auto& [id, s] : sequences_) {
    if (!s->running()) continue;
    const auto known = static_cast<int64_t>(s->tokens.size());
    add(kv_.bytes_for_tokens(known), horizon_tokens(*s), kv_.committed_bytes(s->slot));
  }
  if (head) {
    const auto tokens = static_cast<int64_t>(head->tokens.size());
    // Alone, the head runs if its tokens fit at all (nobody else will free memory). With others
    // running, it gets its look-ahead and they one granule to grow into, so admitting a chat
    // does not preempt another on the very next step.
    const uint64_t need = running() == 0
                              ? kv_.bytes_for_tokens(tokens)
                              : kv_.bytes_for_tokens(tokens + lookahead) + kv_.granule_bytes();
    add(need, horizon_tokens(*head), held);
  }
  return d;
}

uint64_t Scheduler::kept_device_bytes(int32_t spare) const {
  uint64_t bytes = 0;
  for (const KeptKv& k : kept_)
    if (!k.swapped() && k.slot != spare) bytes += kv_.committed_bytes(k.slot);
  return bytes;
}

bool Scheduler::relieve(const Demand& d, int32_t spare) {
  // Idle chats' kept KV first (to host memory, or dropped), for what the step needs now.
  while (d.now > kv_.budget_available_bytes() && evict_kept(spare)) {
  }
  if (relieve_) {
    // Then weights, once for the whole demand to the end of the chats' generation: what
    // neither free memory nor the kept KV left can cover, with the look-ahead. A backend that
    // cannot free that much frees nothing; then only what the step needs now.
    const uint64_t available = kv_.budget_available_bytes();
    const uint64_t reclaimable = available + kept_device_bytes(spare);
    const bool moved = d.end > reclaimable && relieve_(d.planned - reclaimable) > 0;
    if (!moved && d.now > available) relieve_(d.now - available);
  }
  return d.now <= kv_.budget_available_bytes();
}

bool Scheduler::admissible(const Sequence& head, uint64_t held) const {
  return demand(&head, held).now <= kv_.budget_available_bytes();
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
  const Sequence& sequence = *sequences_.at(id);
  const int32_t slot = sequence.slot;
  // The step writes from the computed tokens on: a window part lets go of what is behind them.
  const int64_t from = std::min(sequence.computed_tokens, tokens);
  bool relieved = false;
  while (!kv_.map_through(slot, tokens, from)) {
    // The pressure policy frees what it can for the step's whole demand: kept KV, then
    // weights. What is still short is taken from running chats, one at a time, each smaller
    // demand offered to the policy again (weights may cover what is left).
    if (!relieved) {
      relieved = true;
      relieve(demand());
      continue;
    }
    relieved = false;
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
  // Planned ahead: when the budget would not hold what the running chats may still generate,
  // the weights move now, once, rather than a few layers at a time as each chat grows (each
  // move re-captures the decode graphs).
  if (relieve_ && running() > 0) {
    const Demand d = demand();
    if (d.end > kv_.budget_available_bytes()) relieve(d);
  }
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
    // KV kept in a slot for the head's first tokens: cut to what they share, it is the head's.
    int32_t kept_slot = -1;
    if (const auto match = reuse_ ? find_kept(head) : std::nullopt) {
      KeptKv& k = kept_[match->index];
      if (!k.swapped()) {
        if (static_cast<int64_t>(k.tokens.size()) > match->tokens) {
          kv_.truncate(k.slot, match->tokens);
          k.tokens.resize(static_cast<size_t>(match->tokens));
        }
        kept_slot = k.slot;
      }
    }
    const uint64_t held = kept_slot >= 0 ? kv_.committed_bytes(kept_slot) : 0;
    // Admission's share of the pressure policy: kept KV, then weights, for the head's KV (the
    // whole of it, for one too large for the budget however much the others free).
    if (const Demand d = demand(&head, held); d.now > kv_.budget_available_bytes())
      relieve(d, kept_slot);
    const uint64_t need = kv_.bytes_for_tokens(head_tokens);
    if (const uint64_t capacity = kv_capacity_bytes(); need > capacity) {
      plan.oversized.push_back({head_id, head_tokens, need, capacity, remove(head_id)});
      continue;
    }
    if (!admissible(head, held)) break;

    // The slot: the one keeping the head's KV, a free one, or one a kept entry gives up.
    int32_t slot = kept_slot;
    int64_t reused = 0, swapped_in = 0;
    if (kept_slot >= 0) {
      const auto it = std::find_if(kept_.begin(), kept_.end(),
                                   [kept_slot](const KeptKv& k) { return k.slot == kept_slot; });
      reused = static_cast<int64_t>(it->tokens.size());
      kept_.erase(it);  // the slot and its KV now belong to the head
    } else {
      auto free_slot = take_free_slot();
      if (!free_slot && evict_kept()) free_slot = take_free_slot();
      if (!free_slot) break;
      slot = *free_slot;
      // KV swapped to host memory comes back instead of being computed again: the plan
      // carries the copy, queued ahead of the step (planning never waits for it).
      const auto match = reuse_ ? find_kept(head) : std::nullopt;
      if (match && kept_[match->index].swapped()) {
        KeptKv& k = kept_[match->index];
        const uint64_t bytes = kv_.live_bytes(match->tokens);
        const bool mapped = kv_.map_through(slot, match->tokens, match->tokens);
        if (mapped) {
          // The head's share of the chat's KV (all of it, and the state, when recurrent).
          const uint64_t state = recurrent_ ? copier_.state_bytes : 0;
          k.host.resize(bytes + state);
          plan.swap_ins.push_back({head_id, slot, std::move(k.host), state, match->tokens});
          reused = swapped_in = match->tokens;
          ++swap_ins_;
          swap_in_bytes_ += bytes;
        }
        erase_kept(match->index, !mapped);
      }
    }
    head.slot = slot;
    head.computed_tokens = reused;
    if (!head.admitted_once) {
      head.reused_tokens = reused;
      head.swapped_in_tokens = swapped_in;
    }
    prefix_reused_tokens_ += static_cast<uint64_t>(reused);
    waiting_.pop_front();
    plan.admitted.push_back(head_id);
    plan_chunk(head_id);
  }
  return plan;
}

std::optional<int32_t> Scheduler::borrow_slot() {
  auto slot = take_free_slot();
  if (!slot && evict_kept()) slot = take_free_slot();
  return slot;
}

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
