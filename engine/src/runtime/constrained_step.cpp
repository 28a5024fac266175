// ConstrainedSteps: which rows draw under a mask, filling and handing over the masks, the
// host's masked row, and the checks that end a constrained reply with a clear error.
#include "runtime/constrained_step.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "backends/cpu/thread_pool.h"
#include "granule/log.h"

namespace granule {
namespace {

using Clock = std::chrono::steady_clock;

// A mask of a 128k-token vocabulary takes ~100 us on one core (xgrammar), so 32 chats' masks
// would outlast an 8B step's forward pass (~5 ms) that they are meant to hide under: from
// kParallelMasks masks on, they are spread over up to kMaskThreads threads (the GPU's host
// threads are otherwise idle while it runs the step).
constexpr size_t kParallelMasks = 4;
constexpr int32_t kMaskThreads = 8;
// Accepts are spread over the mask threads only when the step's would take longer than
// waking them does: parallel_for returns once every worker woke, and workers asleep since the
// last step's masks take tens of microseconds to wake. An accept costs ~1-5 us on a real 50k
// vocabulary (xgrammar, one core), ~0.5 us on the synthetic 8B model's: 32 of those run faster
// on the engine's thread alone.
constexpr double kParallelAcceptUs = 60;

// Whether this work item's step predicts the sequence's next token (it computes the last
// known one).
bool predicts_token(const ScheduledWork& w, const Sequence& seq) {
  return w.start_position + w.count == static_cast<int64_t>(seq.tokens.size());
}

}  // namespace

ConstrainedSteps::ConstrainedSteps(const Tokenizer& tokenizer, int64_t n_vocab)
    : tokenizer_(tokenizer), n_vocab_(n_vocab) {}
ConstrainedSteps::~ConstrainedSteps() = default;

std::unique_ptr<TokenConstraint> ConstrainedSteps::compile(const Constraint& constraint) {
  if (!constraint.active()) return nullptr;
  if (!compiler_) compiler_ = std::make_unique<ConstraintCompiler>(tokenizer_, n_vocab_);
  return compiler_->compile(constraint);
}

void ConstrainedSteps::begin_step() {
  constrained_sequences_ = 0;
  device_masked_sequences_ = 0;
  mask_us_ = 0;
}

bool ConstrainedSteps::draws_constrained(const StepPlan& plan, const Scheduler& scheduler) const {
  for (const ScheduledWork& w : plan.work) {
    const Sequence* seq = scheduler.find(w.id);
    if (seq && seq->constraint && predicts_token(w, *seq)) return true;
  }
  return false;
}

void ConstrainedSteps::fill_one(Sequence& seq) {
  try {
    seq.mask_allowed = seq.constraint->fill_mask(seq.mask);
  } catch (const std::exception& e) {
    logger("engine")->error("structured output: computing the token mask: {}", e.what());
    seq.mask_allowed = false;
  } catch (...) {
    logger("engine")->error("structured output: computing the token mask failed");
    seq.mask_allowed = false;
  }
  seq.mask_ready = true;
}

void ConstrainedSteps::for_each(size_t n, const std::function<void(size_t)>& fn, bool parallel) {
  if (!parallel || n < kParallelMasks) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  if (!pool_) {
    const auto cores = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
    pool_ = std::make_unique<cpu::ThreadPool>(std::clamp(cores / 2, 1, kMaskThreads));
  }
  pool_->parallel_for(static_cast<int64_t>(n), [&](int64_t begin, int64_t end, int32_t) {
    for (int64_t i = begin; i < end; ++i) fn(static_cast<size_t>(i));
  });
}

void ConstrainedSteps::fill_all(std::span<Sequence* const> pending) {
  // fill_one does not throw: a failure is a mask that allows nothing.
  for_each(
      pending.size(), [&](size_t i) { fill_one(*pending[i]); }, true);
}

void ConstrainedSteps::fill(const StepPlan& plan, Scheduler& scheduler, Backend* device) {
  const auto start = Clock::now();
  device_masks_.assign(device ? plan.work.size() : 0, nullptr);
  try {
    pending_.clear();
    for (const ScheduledWork& w : plan.work) {
      Sequence* seq = scheduler.find(w.id);
      if (seq && seq->constraint && predicts_token(w, *seq) && !seq->mask_ready)
        pending_.push_back(seq);
    }
    fill_all(pending_);
    for (size_t i = 0; i < plan.work.size(); ++i) {
      const ScheduledWork& w = plan.work[i];
      Sequence* seq = scheduler.find(w.id);
      if (!seq || !seq->constraint) continue;
      ++constrained_sequences_;
      if (!predicts_token(w, *seq)) continue;
      if (!device) continue;
      device_masks_[i] = seq->mask.data();
      ++device_masked_sequences_;
    }
  } catch (...) {
    // The device waits for the masks: let it go unmasked (every drawn token is still checked
    // by accept()) before the error ends the step.
    if (device) device->set_token_masks({});
    throw;
  }
  // Handed over even with no row masked: the device waits for it.
  if (device) device->set_token_masks(device_masks_);
  mask_us_ += std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

std::string ConstrainedSteps::check_allowed(Sequence& seq) {
  const auto start = Clock::now();
  const bool filled = !seq.mask_ready;
  std::string error = check_allowed_unmetered(seq);
  if (filled) mask_us_ += std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  return error;
}

std::string ConstrainedSteps::check_allowed_unmetered(Sequence& seq) {
  if (!seq.mask_ready) fill_one(seq);  // not filled during the step (it predicted no token then)
  seq.mask_ready = false;              // the next step predicts the token after this one
  if (seq.mask_allowed) return {};
  return "structured output: the constraint allows no further token after " +
         std::to_string(seq.generated) + " generated tokens";
}

std::span<const float> ConstrainedSteps::masked(const Sequence& seq, std::span<const float> row) {
  masked_row_.assign(row.begin(), row.end());
  apply_token_mask(masked_row_, seq.mask);
  return masked_row_;
}

std::string ConstrainedSteps::accept(Sequence& seq, TokenId token, bool end_of_generation) {
  if (end_of_generation || seq.constraint->accept(token)) return {};
  return "structured output: the constraint refused token " + std::to_string(token);
}

void ConstrainedSteps::accept_all(const StepPlan& plan, Scheduler& scheduler,
                                  std::span<const TokenId> tokens) {
  outcomes_.clear();
  accepting_.clear();
  for (size_t i = 0; i < plan.work.size() && i < tokens.size(); ++i) {
    Sequence* seq = scheduler.find(plan.work[i].id);
    if (seq && !seq->cancel_requested && seq->uncomputed_tokens() == 0 && seq->constraint)
      accepting_.emplace_back(i, seq);
  }
  if (accepting_.empty()) return;  // no constrained row: a free step pays nothing more
  outcomes_.resize(plan.work.size());
  // Each sequence's matcher is its own (over one read-only compiled grammar), so the accepts
  // may run side by side on the mask threads, when they take long enough to pay for waking
  // them (accept_us_: the last steps' time per accept). Nothing here is seen outside the
  // sequence before the engine's loop reads it.
  const size_t n = accepting_.size();
  const bool parallel = static_cast<double>(n) * accept_us_ >= kParallelAcceptUs;
  for_each(
      n,
      [&](size_t k) {
        const auto [i, seq_ptr] = accepting_[k];
        Sequence& seq = *seq_ptr;
        Outcome& out = outcomes_[i];
        try {
          const auto start = Clock::now();
          const bool filled = !seq.mask_ready;
          out.error = check_allowed_unmetered(seq);
          const auto checked = Clock::now();
          if (filled)
            out.mask_us = std::chrono::duration<double, std::micro>(checked - start).count();
          if (out.error.empty())
            out.error = accept(seq, tokens[i], tokenizer_.is_end_of_generation(tokens[i]));
          out.accept_us = std::chrono::duration<double, std::micro>(Clock::now() - checked).count();
        } catch (...) {
          out.thrown = std::current_exception();
        }
        out.taken = true;
      },
      parallel);
  double accept_us = 0;
  for (const auto& [i, seq] : accepting_) {
    mask_us_ += outcomes_[i].mask_us;
    accept_us += outcomes_[i].accept_us;
  }
  // A running mean, so one slow token does not flip the choice for long.
  accept_us_ = 0.75 * accept_us_ + 0.25 * accept_us / static_cast<double>(n);
}

bool ConstrainedSteps::accepted(size_t i, std::string& error) const {
  if (i >= outcomes_.size() || !outcomes_[i].taken) return false;
  if (outcomes_[i].thrown) std::rethrow_exception(outcomes_[i].thrown);
  error = outcomes_[i].error;
  return true;
}

}  // namespace granule
