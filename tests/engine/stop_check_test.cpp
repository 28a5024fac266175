// check_stop, the one rule for when a sequence ends after a sampled token and how much of
// its decoded text goes out now: end of generation, stop strings (whole, across tokens, and
// held back while they may still begin), and the max-tokens and context limits.
#include "runtime/stop_check.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace granule {
namespace {

StopInputs inputs(std::string_view text, const std::vector<std::string>* stops,
                  int64_t generated = 1, int64_t max_tokens = 100, int64_t tokens = 10,
                  int64_t context = 256) {
  // StopInputs' fields in order: end_of_generation, the text, the stops, the counts.
  return {false, text, stops, generated, max_tokens, tokens, context};
}

TEST(StopCheck, EndOfGenerationEndsAndSendsNothingOfItsOwn) {
  StopInputs in = inputs("held", nullptr);
  in.end_of_generation = true;
  const StopDecision d = check_stop(in);
  EXPECT_EQ(d.reason, FinishReason::Eos);
  EXPECT_EQ(d.send_bytes, 0u) << "the caller flushes what was held back";
}

TEST(StopCheck, PlainTextGoesOutWhole) {
  const std::vector<std::string> stops{"</s>"};
  const StopDecision d = check_stop(inputs("Hello world", &stops));
  EXPECT_EQ(d.reason, FinishReason::None);
  EXPECT_EQ(d.send_bytes, 11u);
}

TEST(StopCheck, TextThatMayBeginAStopStringIsHeldBack) {
  const std::vector<std::string> stops{"<|im_end|>"};
  const StopDecision d = check_stop(inputs("Paris.<|im", &stops));
  EXPECT_EQ(d.reason, FinishReason::None);
  EXPECT_EQ(d.send_bytes, 6u) << "'<|im' waits for the next token";
}

TEST(StopCheck, AStopStringEndsAndOnlyTheTextBeforeItGoesOut) {
  const std::vector<std::string> stops{"\nUser:", "<|im_end|>"};
  const StopDecision d = check_stop(inputs("Paris.<|im_end|> and more", &stops));
  EXPECT_EQ(d.reason, FinishReason::StopString);
  EXPECT_EQ(d.send_bytes, 6u);
}

TEST(StopCheck, AStopStringWinsOverTheLengthLimit) {
  const std::vector<std::string> stops{"STOP"};
  const StopDecision d = check_stop(inputs("abSTOP", &stops, /*generated=*/5, /*max=*/5));
  EXPECT_EQ(d.reason, FinishReason::StopString);
  EXPECT_EQ(d.send_bytes, 2u);
}

TEST(StopCheck, TheMaxTokensLimitEndsAfterSendingTheText) {
  const std::vector<std::string> stops{"<|im_end|>"};
  const StopDecision d = check_stop(inputs("end.<|", &stops, /*generated=*/8, /*max=*/8));
  EXPECT_EQ(d.reason, FinishReason::MaxTokens);
  EXPECT_EQ(d.send_bytes, 4u) << "the held-back '<|' is flushed by the caller on finish";
  EXPECT_EQ(check_stop(inputs("x", nullptr, 7, 8)).reason, FinishReason::None);
}

TEST(StopCheck, AFullContextEndsWithTheLengthReason) {
  EXPECT_EQ(check_stop(inputs("x", nullptr, 3, 100, /*tokens=*/256, /*context=*/256)).reason,
            FinishReason::MaxTokens);
  EXPECT_EQ(check_stop(inputs("x", nullptr, 3, 100, 255, 256)).reason, FinishReason::None);
}

}  // namespace
}  // namespace granule
