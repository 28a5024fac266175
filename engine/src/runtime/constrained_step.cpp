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
    seq.mask_allowed = 0;
  } catch (...) {
    logger("engine")->error("structured output: computing the token mask failed");
    seq.mask_allowed = 0;
  }
  seq.mask_ready = true;
}

void ConstrainedSteps::fill_all(std::span<Sequence* const> pending) {
  if (pending.size() < kParallelMasks) {
    for (Sequence* seq : pending) fill_one(*seq);
    return;
  }
  if (!pool_) {
    const auto cores = static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
    pool_ = std::make_unique<cpu::ThreadPool>(std::clamp(cores / 2, 1, kMaskThreads));
  }
  // fill_one does not throw: a failure is a mask that allows nothing.
  pool_->parallel_for(static_cast<int64_t>(pending.size()),
                      [&](int64_t begin, int64_t end, int32_t) {
                        for (int64_t i = begin; i < end; ++i)
                          fill_one(*pending[static_cast<size_t>(i)]);
                      });
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
  if (!seq.mask_ready) {  // not filled during the step (it predicted no token then)
    const auto start = Clock::now();
    fill_one(seq);
    mask_us_ += std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  }
  seq.mask_ready = false;  // the next step predicts the token after this one
  if (seq.mask_allowed > 0) return {};
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

}  // namespace granule
