// ConstrainedSteps' checks around a draw, with a scripted TokenConstraint: a constraint that
// allows nothing (or fails to compute its mask) ends the sequence with a clear error, a refused
// token is named, an end-of-generation token needs no check, and the host's masked row holds
// -inf exactly where the mask refuses (ids past the mask's words too); and accept_all, which
// checks a step's device-drawn tokens side by side, says for each row what the serial checks
// say.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "granule/gguf.h"
#include "granule/tokenizer.h"
#include "memory/kv_space.h"
#include "memory/memory_manager.h"
#include "runtime/constrained_step.h"
#include "runtime/scheduler.h"
#include "support/test_files.h"

namespace granule {
namespace {

// Allows the ids in `allowed` (a mask of `words` words), accepts only those; or throws.
class ScriptedConstraint final : public TokenConstraint {
 public:
  ScriptedConstraint(std::vector<int32_t> allowed, size_t words, bool throws = false)
      : allowed_(std::move(allowed)), words_(words), throws_(throws) {}
  bool fill_mask(std::vector<uint32_t>& mask) override {
    ++fills;
    if (throws_) throw std::runtime_error("scripted failure");
    mask.assign(words_, 0);
    for (int32_t id : allowed_) mask[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
    return !allowed_.empty();
  }
  bool accept(TokenId token) override {
    ++accepts;
    for (int32_t id : allowed_)
      if (id == token) return true;
    return false;
  }
  bool finished() const override { return false; }
  int fills = 0, accepts = 0;

 private:
  std::vector<int32_t> allowed_;
  size_t words_;
  bool throws_;
};

class ConstraintSteps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (test::default_model_path().empty()) GTEST_SKIP() << test::kNoDefaultModel;
    file_ = ModelFile::open(test::default_model_path());
    tokenizer_ = Tokenizer::from_gguf(*file_);
  }
  Sequence sequence(std::unique_ptr<ScriptedConstraint> constraint, int64_t generated) {
    Sequence seq(1, {1, 2, 3}, SamplingParams::greedy());
    seq.generated = generated;
    scripted_ = constraint.get();
    seq.constraint = std::move(constraint);
    return seq;
  }
  std::unique_ptr<ModelFile> file_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ScriptedConstraint* scripted_ = nullptr;
};

TEST_F(ConstraintSteps, AConstraintThatAllowsNothingEndsWithAClearError) {
  ConstrainedSteps steps(*tokenizer_, 100);
  Sequence seq = sequence(std::make_unique<ScriptedConstraint>(std::vector<int32_t>{}, 4), 3);
  EXPECT_EQ(steps.check_allowed(seq),
            "structured output: the constraint allows no further token after 3 generated tokens");
  EXPECT_EQ(scripted_->fills, 1);  // filled there: the step had not
  EXPECT_FALSE(seq.mask_ready);    // the next step fills the next token's mask
}

TEST_F(ConstraintSteps, AMaskThatCannotBeComputedAllowsNothing) {
  ConstrainedSteps steps(*tokenizer_, 100);
  Sequence seq =
      sequence(std::make_unique<ScriptedConstraint>(std::vector<int32_t>{5}, 4, true), 0);
  EXPECT_NE(steps.check_allowed(seq).find("allows no further token"), std::string::npos);
}

TEST_F(ConstraintSteps, AMaskFilledDuringTheStepIsNotFilledAgain) {
  ConstrainedSteps steps(*tokenizer_, 100);
  Sequence seq = sequence(std::make_unique<ScriptedConstraint>(std::vector<int32_t>{5}, 4), 0);
  seq.mask_ready = true;
  seq.mask_allowed = true;
  EXPECT_EQ(steps.check_allowed(seq), "");
  EXPECT_EQ(scripted_->fills, 0);
}

TEST_F(ConstraintSteps, ARefusedTokenIsNamedAndEndOfGenerationIsNotChecked) {
  ConstrainedSteps steps(*tokenizer_, 100);
  Sequence seq = sequence(std::make_unique<ScriptedConstraint>(std::vector<int32_t>{5, 70}, 4), 0);
  EXPECT_EQ(steps.accept(seq, 70, false), "");
  EXPECT_EQ(steps.accept(seq, 42, false), "structured output: the constraint refused token 42");
  EXPECT_EQ(steps.accept(seq, 0, true), "");
  EXPECT_EQ(scripted_->accepts, 2);
}

TEST_F(ConstraintSteps, TheHostRowIsMinusInfinityWhereTheMaskRefuses) {
  ConstrainedSteps steps(*tokenizer_, 100);
  // Three words cover ids 0-95: ids 96-99 are past the mask and refused too.
  Sequence seq =
      sequence(std::make_unique<ScriptedConstraint>(std::vector<int32_t>{0, 33, 95}, 3), 0);
  ASSERT_EQ(steps.check_allowed(seq), "");
  std::vector<float> row(100);
  for (size_t i = 0; i < row.size(); ++i) row[i] = static_cast<float>(i);
  const std::span<const float> masked = steps.masked(seq, row);
  ASSERT_EQ(masked.size(), row.size());
  for (size_t i = 0; i < row.size(); ++i) {
    if (i == 0 || i == 33 || i == 95)
      EXPECT_EQ(masked[i], row[i]) << i;
    else
      EXPECT_TRUE(std::isinf(masked[i]) && masked[i] < 0) << i;
  }
}

// One row of a step: its constraint's allowed ids, the token drawn, and how it stands.
struct Row {
  std::vector<int32_t> allowed;
  TokenId token = 0;
  bool throws = false;      // the mask cannot be computed
  bool mask_ready = false;  // filled during the step
  bool cancelled = false;   // a sink cancelled it during the step: not taken
  bool constrained = true;
};

std::unique_ptr<Sequence> row_sequence(SequenceId id, const Row& row) {
  auto seq =
      std::make_unique<Sequence>(id, std::vector<TokenId>{1, 2, 3}, SamplingParams::greedy());
  seq->generated = id;  // named by the "allows no further token" error
  if (row.constrained)
    seq->constraint = std::make_unique<ScriptedConstraint>(row.allowed, 4, row.throws);
  if (row.mask_ready && row.constrained) {
    seq->mask_allowed = seq->constraint->fill_mask(seq->mask);
    seq->mask_ready = true;
  }
  return seq;
}

TEST_F(ConstraintSteps, AcceptAllSaysForEachRowWhatTheSerialChecksSay) {
  // An end-of-generation id of the model's tokenizer: taken without a check.
  TokenId eog = -1;
  for (TokenId id = 0; id < 100 && eog < 0; ++id)
    if (tokenizer_->is_end_of_generation(id)) eog = id;
  ASSERT_GE(eog, 0);
  const std::vector<Row> rows = {
      {{5, 70}, 70},                             // taken
      {{5, 70}, 42},                             // refused
      {{}, 5},                                   // allows nothing
      {{5}, 5, true},                            // the mask throws: allows nothing
      {{5, 70}, eog},                            // end of generation
      {{5, 70}, 5, false, true},                 // filled during the step
      {{5, 70}, 5, false, false, true},          // cancelled
      {{5, 70}, 5, false, false, false, false},  // unconstrained
      {{1, 2, 3, 5, 70, 99}, 99, false, true},   // taken
      {{1, 2, 3}, 3},                            // taken
      {{1, 2, 3}, 4, false, true},               // refused
      {{}, 4, false, true},                      // allows nothing (filled)
  };
  MemoryManager memory(64ull << 20);
  KvGeometry geometry;
  geometry.bytes_per_token = 1024;
  geometry.max_tokens = 64;
  geometry.slots = static_cast<int32_t>(rows.size());
  geometry.lookahead_tokens = 0;
  KvSpace kv(make_host_virtual_memory(64ull << 10), geometry, memory);
  Scheduler scheduler(kv, 512);
  for (size_t i = 0; i < rows.size(); ++i)
    scheduler.add(row_sequence(static_cast<SequenceId>(i + 1), rows[i]));
  const StepPlan plan = scheduler.next_step();
  ASSERT_EQ(plan.work.size(), rows.size());
  scheduler.complete(plan);
  std::vector<TokenId> tokens;
  for (const ScheduledWork& w : plan.work) {
    const Row& row = rows[static_cast<size_t>(w.id - 1)];
    tokens.push_back(row.token);
    if (row.cancelled) scheduler.find(w.id)->cancel_requested = true;
  }

  ConstrainedSteps steps(*tokenizer_, 100);
  steps.begin_step();
  steps.accept_all(plan, scheduler, tokens);
  ConstrainedSteps serial_steps(*tokenizer_, 100);
  int taken = 0;
  for (size_t i = 0; i < plan.work.size(); ++i) {
    const SequenceId id = plan.work[i].id;
    const Row& row = rows[static_cast<size_t>(id - 1)];
    Sequence& seq = *scheduler.find(id);
    std::string error;
    const bool accepted = steps.accepted(i, error);
    EXPECT_EQ(accepted, row.constrained && !row.cancelled) << "row " << id;
    if (!accepted) continue;
    ++taken;
    // The serial checks on a twin of the row as it stood before the step's checks.
    std::unique_ptr<Sequence> twin = row_sequence(id, row);
    std::string serial = serial_steps.check_allowed(*twin);
    if (serial.empty())
      serial = serial_steps.accept(*twin, row.token, tokenizer_->is_end_of_generation(row.token));
    EXPECT_EQ(error, serial) << "row " << id;
    EXPECT_FALSE(seq.mask_ready) << "row " << id;
    const auto& done = static_cast<const ScriptedConstraint&>(*seq.constraint);
    const auto& twin_done = static_cast<const ScriptedConstraint&>(*twin->constraint);
    EXPECT_EQ(done.fills, twin_done.fills) << "row " << id;
    EXPECT_EQ(done.accepts, twin_done.accepts) << "row " << id;
  }
  EXPECT_EQ(taken, 10);
  // A cancelled row's constraint is left alone.
  for (const ScheduledWork& w : plan.work) {
    const Sequence& seq = *scheduler.find(w.id);
    if (!seq.cancel_requested) continue;
    EXPECT_EQ(static_cast<const ScriptedConstraint&>(*seq.constraint).accepts, 0);
  }
  // An accept that throws: its row's outcome throws when the engine's loop reads it.
  {
    class ThrowingAccept final : public TokenConstraint {
     public:
      bool fill_mask(std::vector<uint32_t>& mask) override {
        mask.assign(4, ~0u);
        return true;
      }
      bool accept(TokenId) override { throw std::runtime_error("accept failed"); }
      bool finished() const override { return false; }
    };
    for (const ScheduledWork& w : plan.work)
      scheduler.find(w.id)->constraint = std::make_unique<ThrowingAccept>();
    steps.accept_all(plan, scheduler, std::vector<TokenId>(plan.work.size(), 7));
    std::string error;
    EXPECT_THROW(steps.accepted(0, error), std::runtime_error);
  }
  // A step drawn on the host leaves every row to the serial checks.
  steps.accept_all(plan, scheduler, {});
  std::string error;
  for (size_t i = 0; i < plan.work.size(); ++i) EXPECT_FALSE(steps.accepted(i, error));
}

}  // namespace
}  // namespace granule
