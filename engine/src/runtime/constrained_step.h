// ConstrainedSteps: structured output's share of each engine step. It compiles a request's
// constraint, says which rows of a step draw under a token mask, fills those masks while the
// device runs the step (handing them to a backend that samples under them), masks a row drawn
// on the host, and checks every drawn token against its constraint, with the error that ends
// a reply the constraint lets go nowhere.
#pragma once
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "granule/constraint.h"
#include "runtime/scheduler.h"
#include "runtime/sequence.h"
#include "runtime/token_constraint.h"

namespace granule {
namespace cpu {
class ThreadPool;
}

class ConstrainedSteps {
 public:
  ConstrainedSteps(const Tokenizer& tokenizer, int64_t n_vocab);
  ~ConstrainedSteps();

  // submit(): the matcher for an active constraint, null for none. Throws as
  // ConstraintCompiler::compile (UsageError for a bad one).
  std::unique_ptr<TokenConstraint> compile(const Constraint& constraint);

  // --- one step, in the order the engine calls them
  // Before planning: the step's telemetry starts at zero.
  void begin_step();
  // Whether a work item of the plan draws a constrained sequence's next token: a backend that
  // samples under masks is then launched with StepRequest::token_masks.
  bool draws_constrained(const StepPlan& plan, const Scheduler& scheduler) const;
  // While the device runs the step: the masks of the constrained sequences whose next token
  // the step predicts (the tokens they follow are known), then, with `device` (the backend,
  // launched with token_masks), handed over one per work item in plan order.
  void fill(const StepPlan& plan, Scheduler& scheduler, Backend* device);
  // After the step, before a constrained sequence's token is taken: the error that ends it
  // when its constraint allows no token (empty: go on). Fills a mask the step did not.
  std::string check_allowed(Sequence& seq);
  // A host draw's row: `row` with the tokens the sequence's mask refuses at -inf (a copy kept
  // until the next call).
  std::span<const float> masked(const Sequence& seq, std::span<const float> row);
  // After the draw: the error that ends the sequence when its constraint refuses `token`
  // (empty: taken). An end-of-generation token needs no check.
  std::string accept(Sequence& seq, TokenId token, bool end_of_generation);
  // After a step that drew on the device (`tokens`, one per work item; empty for a host draw):
  // check_allowed and accept for every constrained sequence whose token the step drew (found,
  // not cancelled, nothing left to compute), spread over the mask threads from enough of them
  // on. accepted() hands each outcome to the engine's loop, which keeps its order.
  void accept_all(const StepPlan& plan, Scheduler& scheduler, std::span<const TokenId> tokens);
  // accept_all's outcome for work item `i`: false when it did not take that row (check it
  // with check_allowed and accept); else `error` is what they said (empty: taken), and an
  // exception either threw is thrown here.
  bool accepted(size_t i, std::string& error) const;

  // --- the last step's telemetry (ThroughputTelemetry)
  int32_t constrained_sequences() const { return constrained_sequences_; }
  int32_t device_masked_sequences() const { return device_masked_sequences_; }
  double mask_us() const { return mask_us_; }

 private:
  // Fills one sequence's mask (a failure is a mask that allows nothing, said in the log).
  void fill_one(Sequence& seq);
  // check_allowed without adding to mask_us() (safe on the mask threads).
  std::string check_allowed_unmetered(Sequence& seq);
  // Fills the masks of `pending` (independent matchers over one read-only compiled grammar
  // each), on the mask threads once there are enough of them to pay for the hand-off.
  void fill_all(std::span<Sequence* const> pending);
  // Runs fn(i) for i in [0, n), on the mask threads when `parallel` and n >= kParallelMasks.
  void for_each(size_t n, const std::function<void(size_t)>& fn, bool parallel);

  // accept_all's outcome for one work item.
  struct Outcome {
    bool taken = false;
    std::string error;
    std::exception_ptr thrown;
    double mask_us = 0;    // a mask check_allowed filled (the step had not)
    double accept_us = 0;  // the constraint's accept
  };

  const Tokenizer& tokenizer_;
  int64_t n_vocab_;
  std::unique_ptr<ConstraintCompiler> compiler_;  // built at the first constraint
  std::vector<float> masked_row_;
  std::vector<const uint32_t*> device_masks_;  // fill()'s hand-over, one per work item
  std::vector<Sequence*> pending_;             // fill()'s sequences whose mask is not ready
  std::vector<Outcome> outcomes_;              // accept_all's, one per work item
  std::vector<std::pair<size_t, Sequence*>> accepting_;  // accept_all's work items
  std::unique_ptr<cpu::ThreadPool> pool_;  // built at the first step with enough masks
  double accept_us_ = 10;                  // accept_all's recent time per accept (a running mean)
  int32_t constrained_sequences_ = 0;
  int32_t device_masked_sequences_ = 0;
  double mask_us_ = 0;
};

}  // namespace granule
