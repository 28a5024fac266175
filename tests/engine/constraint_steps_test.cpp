// ConstrainedSteps' checks around a draw, with a scripted TokenConstraint: a constraint that
// allows nothing (or fails to compute its mask) ends the sequence with a clear error, a refused
// token is named, an end-of-generation token needs no check, and the host's masked row holds
// -inf exactly where the mask refuses (ids past the mask's words too).
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "granule/gguf.h"
#include "granule/tokenizer.h"
#include "runtime/constrained_step.h"
#include "support/test_files.h"

namespace granule {
namespace {

// Allows the ids in `allowed` (a mask of `words` words), accepts only those; or throws.
class ScriptedConstraint final : public TokenConstraint {
 public:
  ScriptedConstraint(std::vector<int32_t> allowed, size_t words, bool throws = false)
      : allowed_(std::move(allowed)), words_(words), throws_(throws) {}
  int64_t fill_mask(std::vector<uint32_t>& mask) override {
    ++fills;
    if (throws_) throw std::runtime_error("scripted failure");
    mask.assign(words_, 0);
    for (int32_t id : allowed_) mask[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
    return static_cast<int64_t>(allowed_.size());
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
  seq.mask_allowed = 1;
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

}  // namespace
}  // namespace granule
