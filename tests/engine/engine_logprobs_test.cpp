// Per-token log-probabilities through the engine API (Request::top_logprobs, on_logprobs):
// each generated token's value is the log-softmax of the logits the engine computed for it,
// checked against Engine::logits_for over the same tokens (teacher forcing), the top list
// is the most likely tokens in order, and asking for them changes no token.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "granule/engine.h"
#include "granule/error.h"
#include "granule/testkit/synthetic_model.h"
#include "support/engine_chats.h"
#include "support/temp_model.h"

namespace granule {
namespace {

using test::TempModel;

struct Generated {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;
  FinishReason reason = FinishReason::None;
};

EngineOptions cpu_options() { return test::cpu_engine_options(128, 2); }

const std::vector<TokenId> kPrompt{1, 5, 9, 13, 17, 21};

Generated generate(Engine& engine, const SamplingParams& sampling, int32_t top_logprobs) {
  Generated run;
  Request r;
  r.prompt_tokens = kPrompt;
  r.sampling = sampling;
  r.top_logprobs = top_logprobs;
  r.sink.on_token = [&run](SequenceId, const std::string&, int32_t token) {
    if (token != kNoToken) run.tokens.push_back(token);
  };
  r.sink.on_logprobs = [&run](SequenceId, const TokenLogprobs& lp) { run.logprobs.push_back(lp); };
  r.sink.on_finish = [&run](SequenceId, FinishReason reason, const std::string&) {
    run.reason = reason;
  };
  engine.submit(std::move(r));
  for (int i = 0; i < 1000 && engine.step(); ++i) {
  }
  EXPECT_TRUE(engine.idle());
  return run;
}

double log_softmax(const std::vector<float>& row, int32_t id) {
  double max = row[0];
  for (float x : row) max = std::max<double>(max, x);
  double sum = 0;
  for (float x : row) sum += std::exp(static_cast<double>(x) - max);
  return row[static_cast<size_t>(id)] - max - std::log(sum);
}

TEST(EngineLogprobs, MatchLogSoftmaxOfTeacherForcedLogits) {
  TempModel model(SyntheticModelSpec::preset("tiny-gqa"), "granule_logprobs");
  auto engine = Engine::open(model.path, cpu_options());
  SamplingParams greedy = SamplingParams::greedy();
  greedy.max_tokens = 12;
  greedy.ignore_eos = true;
  const Generated run = generate(*engine, greedy, 5);
  ASSERT_EQ(run.reason, FinishReason::MaxTokens);
  ASSERT_EQ(run.tokens.size(), 12u);
  ASSERT_EQ(run.logprobs.size(), run.tokens.size());

  std::vector<TokenId> all = kPrompt;
  all.insert(all.end(), run.tokens.begin(), run.tokens.end());
  all.pop_back();  // row i predicts token i + 1
  const auto rows = engine->logits_for(all);
  for (size_t i = 0; i < run.tokens.size(); ++i) {
    const std::vector<float>& row = rows[kPrompt.size() - 1 + i];
    const TokenLogprobs& lp = run.logprobs[i];
    EXPECT_EQ(lp.chosen.token, run.tokens[i]);
    EXPECT_NEAR(lp.chosen.logprob, log_softmax(row, run.tokens[i]), 1e-4) << "token " << i;
    EXPECT_LE(lp.chosen.logprob, 0.0f);
    ASSERT_EQ(lp.top.size(), 5u);
    // Greedy: the chosen token is the most likely one.
    EXPECT_EQ(lp.top[0].token, lp.chosen.token);
    for (size_t k = 0; k < lp.top.size(); ++k) {
      EXPECT_NEAR(lp.top[k].logprob, log_softmax(row, lp.top[k].token), 1e-4);
      if (k > 0) EXPECT_GE(lp.top[k - 1].logprob, lp.top[k].logprob);
    }
    // Nothing outside the list is more likely than its last entry.
    int more_likely = 0;
    for (size_t id = 0; id < row.size(); ++id)
      if (log_softmax(row, static_cast<int32_t>(id)) > lp.top.back().logprob + 1e-6) ++more_likely;
    EXPECT_LE(more_likely, 4);
    EXPECT_EQ(lp.chosen.piece, engine->tokenizer().token_to_piece(lp.chosen.token, true));
  }
}

TEST(EngineLogprobs, AskingForThemChangesNoSampledToken) {
  TempModel model(SyntheticModelSpec::preset("tiny-gqa"), "granule_logprobs");
  auto engine = Engine::open(model.path, cpu_options());
  SamplingParams sampled;  // temperature 0.7, top-k/top-p/min-p, a fixed seed
  sampled.seed = 1234;
  sampled.max_tokens = 24;
  sampled.ignore_eos = true;
  const Generated plain = generate(*engine, sampled, -1);
  const Generated with = generate(*engine, sampled, 0);
  EXPECT_EQ(plain.tokens, with.tokens);
  EXPECT_TRUE(plain.logprobs.empty());
  ASSERT_EQ(with.logprobs.size(), with.tokens.size());
  for (const TokenLogprobs& lp : with.logprobs) EXPECT_TRUE(lp.top.empty());
}

TEST(EngineLogprobs, OutOfRangeCountIsAUsageError) {
  TempModel model(SyntheticModelSpec::preset("tiny-gqa"), "granule_logprobs");
  auto engine = Engine::open(model.path, cpu_options());
  for (int32_t bad : {-2, kMaxTopLogprobs + 1}) {
    Request r;
    r.prompt_tokens = kPrompt;
    r.top_logprobs = bad;
    try {
      engine->submit(std::move(r));
      ADD_FAILURE() << "top_logprobs " << bad << " was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("top_logprobs"), std::string::npos) << e.what();
    }
  }
  EXPECT_TRUE(engine->idle());
}

}  // namespace
}  // namespace granule
