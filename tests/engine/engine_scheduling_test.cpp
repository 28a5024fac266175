// Tests of the Engine's scheduling seen from the chats (CPU backend, synthetic model): more
// chats than slots wait for one and all finish with exactly the greedy tokens each gives
// alone; a chat cancelled in the middle of its chunked prefill, while two others decode,
// ends once with Cancelled and leaves the others' tokens equal to their tokens alone (and
// they get one token every step of its prefill).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "granule/engine.h"
#include "granule/testkit/synthetic_model.h"
#include "support/engine_chats.h"
#include "support/temp_model.h"

namespace granule {
namespace {

namespace fs = std::filesystem;
using test::Chat;
using test::chat_request;
using test::TempModel;
using test::tokens_alone;

EngineOptions cpu_options(int32_t max_sequences) {
  EngineOptions o = test::cpu_engine_options(512, max_sequences);
  o.prefill_chunk_tokens = 32;
  return o;
}

Chat random_chat(std::mt19937_64& random, int64_t prompt_tokens, int32_t max_tokens) {
  Chat c;
  c.prompt.resize(static_cast<size_t>(prompt_tokens));
  for (TokenId& t : c.prompt) t = static_cast<TokenId>(3 + random() % 381);
  c.max_tokens = max_tokens;
  return c;
}

int running(const Engine& engine) {
  const TelemetrySnapshot t = engine.telemetry();
  return static_cast<int>(std::count_if(t.sequences.begin(), t.sequences.end(),
                                        [](const SequenceTelemetry& s) { return !s.waiting; }));
}

int waiting(const Engine& engine) {
  const TelemetrySnapshot t = engine.telemetry();
  return static_cast<int>(std::count_if(t.sequences.begin(), t.sequences.end(),
                                        [](const SequenceTelemetry& s) { return s.waiting; }));
}

// The case: five chats on two slots (KV budget unlimited). Three wait at first, never more than
// two run, and every chat finishes once, by max tokens, with its tokens alone.
TEST(EngineScheduling, MoreChatsThanSlotsWaitAndAllFinishWithTheirTokensAlone) {
  TempModel model(SyntheticModelSpec::preset("tiny"), "granule_sched");
  std::mt19937_64 random(11);
  std::vector<Chat> chats;
  for (int i = 0; i < 5; ++i) {
    chats.push_back(random_chat(random, 10 + 17 * i, 6 + 3 * i));
  }
  const auto alone = tokens_alone(model.path, chats, cpu_options(1));

  auto engine = Engine::open(model.path, cpu_options(2));
  test::Outputs out;
  std::vector<SequenceId> ids;
  for (const Chat& c : chats) ids.push_back(engine->submit(chat_request(c, out)));
  ASSERT_TRUE(engine->step());
  EXPECT_EQ(running(*engine), 2);
  EXPECT_EQ(waiting(*engine), 3);
  int steps = 1, max_running = 2;
  bool saw_waiting_admitted = false;
  while (engine->step()) {
    ASSERT_LT(++steps, 1000) << "the chats never finished";
    max_running = std::max(max_running, running(*engine));
    // A chat that waited is running (or done) while others still wait or run.
    if (out.count(ids[2]) && !out[ids[2]].tokens.empty()) saw_waiting_admitted = true;
  }
  EXPECT_EQ(max_running, 2);
  EXPECT_TRUE(saw_waiting_admitted);
  for (size_t i = 0; i < chats.size(); ++i) {
    SCOPED_TRACE("chat " + std::to_string(i));
    EXPECT_EQ(out[ids[i]].finishes, 1);
    EXPECT_EQ(out[ids[i]].reason, FinishReason::MaxTokens) << out[ids[i]].error;
    EXPECT_EQ(out[ids[i]].tokens.size(), static_cast<size_t>(chats[i].max_tokens));
    EXPECT_EQ(out[ids[i]].tokens, alone[i]);
  }
  EXPECT_TRUE(engine->idle());
}

// The case: A and B decode; C (300 prompt tokens, chunks of 32) is admitted and prefills for a
// few steps, each of which still gives A and B one token; then C is cancelled mid-prefill. C
// ends once with Cancelled and no token; A and B finish with their tokens alone.
TEST(EngineScheduling, CancelDuringPrefillWhileOthersDecodeLeavesTheirTokensAsAlone) {
  TempModel model(SyntheticModelSpec::preset("tiny"), "granule_sched");
  std::mt19937_64 random(23);
  const std::vector<Chat> chats = {random_chat(random, 20, 40), random_chat(random, 27, 40),
                                   random_chat(random, 300, 10)};
  const auto alone = tokens_alone(model.path, {chats[0], chats[1]}, cpu_options(1));

  auto engine = Engine::open(model.path, cpu_options(4));
  test::Outputs out;
  const SequenceId a = engine->submit(chat_request(chats[0], out));
  const SequenceId b = engine->submit(chat_request(chats[1], out));
  for (int i = 0; i < 20 && (out[a].tokens.empty() || out[b].tokens.empty()); ++i) engine->step();
  ASSERT_FALSE(out[a].tokens.empty());
  ASSERT_FALSE(out[b].tokens.empty());

  const SequenceId c = engine->submit(chat_request(chats[2], out));
  for (int i = 0; i < 4; ++i) {  // 4 chunks of 32: C is a third into its 300-token prompt
    const size_t a_before = out[a].tokens.size(), b_before = out[b].tokens.size();
    ASSERT_TRUE(engine->step());
    EXPECT_EQ(out[a].tokens.size(), a_before + 1) << "step " << i << " of C's prefill";
    EXPECT_EQ(out[b].tokens.size(), b_before + 1) << "step " << i << " of C's prefill";
  }
  EXPECT_EQ(running(*engine), 3);  // C holds a slot: it is prefilling, not waiting
  EXPECT_TRUE(out[c].tokens.empty());
  EXPECT_EQ(out[c].finishes, 0);

  engine->cancel(c);
  while (engine->step()) {
  }
  EXPECT_EQ(out[c].reason, FinishReason::Cancelled);
  EXPECT_EQ(out[c].finishes, 1);
  EXPECT_TRUE(out[c].tokens.empty());
  EXPECT_EQ(out[a].reason, FinishReason::MaxTokens);
  EXPECT_EQ(out[b].reason, FinishReason::MaxTokens);
  EXPECT_EQ(out[a].tokens, alone[0]);
  EXPECT_EQ(out[b].tokens, alone[1]);
  EXPECT_TRUE(engine->idle());
}

}  // namespace
}  // namespace granule
