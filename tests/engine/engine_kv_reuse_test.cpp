// Tests of KV kept across turns (CPU backend, synthetic model): a turn that continues a
// finished one computes only its new tokens and gives exactly the greedy tokens a fresh
// prefill gives; idle kept KV gives way (to host memory) before any running chat is
// preempted, for memory and for slots; KV swapped to host memory and back continues exactly
// as a fresh prefill; a conversation past the context drops its oldest turns and keeps the
// system prompt, and ContextOverflow::Stop and raw prompts refuse with their own messages.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "granule/engine.h"
#include "granule/error.h"
#include "granule/testkit/synthetic_model.h"
#include "support/engine_chats.h"
#include "support/temp_model.h"

namespace granule {
namespace {

using test::Output;
using test::run_to_idle;
using test::TempModel;

// The "kv-wide" preset: 4 layers x K|V x 8 heads x 128 x f32 = 32 KiB a token, 64 tokens a 2 MiB
// granule.

constexpr uint64_t kGranule = 2ull << 20;

EngineOptions cpu_options(int32_t slots, bool reuse) {
  EngineOptions o = test::cpu_engine_options(1024, slots);
  o.prefill_chunk_tokens = 128;
  o.kv_reuse = reuse;
  return o;
}

Request raw_request(const std::vector<TokenId>& prompt, int32_t max_tokens, Output& out,
                    const std::string& session = {}) {
  Request r = test::chat_request({prompt, max_tokens}, out);
  r.session = session;
  return r;
}

std::vector<TokenId> pseudo_random_tokens(size_t n, uint32_t seed) {
  std::vector<TokenId> t(n);
  uint32_t x = seed;
  for (TokenId& v : t) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<TokenId>(3 + (x >> 8) % 380);
  }
  return t;
}

std::vector<TokenId> concat(std::vector<TokenId> a, const std::vector<TokenId>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The tokens a fresh engine without kept KV generates for `prompt`.
std::vector<int32_t> fresh_tokens(const TempModel& model, const std::vector<TokenId>& prompt,
                                  int32_t max_tokens) {
  auto engine = Engine::open(model.path, cpu_options(1, false));
  Output out;
  engine->submit(raw_request(prompt, max_tokens, out));
  run_to_idle(*engine);
  EXPECT_EQ(out.prompt_info.reused_tokens, 0);
  return out.tokens;
}

// The case: turn 2 continues turn 1 (its prompt, its reply, then new tokens). It reuses the KV
// of every computed token of turn 1 (the prompt and all but the last sampled token), computes
// only the rest, and generates exactly the greedy tokens of a fresh prefill of the whole prompt.
TEST(EngineKvReuse, SecondTurnReusesTheFirstAndMatchesAFreshPrefill) {
  TempModel model(SyntheticModelSpec::preset("kv-wide"), "kv_reuse_prefix");
  auto engine = Engine::open(model.path, cpu_options(2, true));
  const std::vector<TokenId> p1 = pseudo_random_tokens(150, 1);
  Output t1;
  engine->submit(raw_request(p1, 30, t1));
  run_to_idle(*engine);
  ASSERT_EQ(t1.reason, FinishReason::MaxTokens);
  EXPECT_EQ(t1.prompts, 1);
  EXPECT_EQ(t1.prompt_info.reused_tokens, 0);
  EXPECT_EQ(t1.prompt_info.computed_tokens, 150);
  // Kept: the prompt and the sampled tokens but the last (whose KV was never computed).
  EXPECT_EQ(engine->kept_kv_tokens(), 150 + 29);
  EXPECT_GT(engine->telemetry().scheduler.kept_kv_bytes, 0u);
  EXPECT_EQ(engine->telemetry().scheduler.kept_chats, 1);

  const std::vector<TokenId> p2 = concat(concat(p1, t1.tokens), pseudo_random_tokens(40, 2));
  Output t2;
  engine->submit(raw_request(p2, 30, t2));
  run_to_idle(*engine);
  ASSERT_EQ(t2.reason, FinishReason::MaxTokens);
  EXPECT_EQ(t2.prompt_info.prompt_tokens, static_cast<int64_t>(p2.size()));
  EXPECT_EQ(t2.prompt_info.reused_tokens, 150 + 29);
  EXPECT_EQ(t2.prompt_info.computed_tokens, static_cast<int64_t>(p2.size()) - (150 + 29));
  EXPECT_EQ(t2.prompt_info.swapped_in_tokens, 0);
  EXPECT_EQ(engine->telemetry().scheduler.prefix_reused_tokens, 150u + 29u);

  EXPECT_EQ(t2.tokens, fresh_tokens(model, p2, 30));

  // A turn that diverges inside the kept tokens (an edit) reuses only the common prefix.
  std::vector<TokenId> p3(p2.begin(), p2.begin() + 100);
  p3.push_back(p2[100] == 5 ? 6 : 5);
  const std::vector<TokenId> p3_full = concat(p3, pseudo_random_tokens(20, 3));
  Output t3;
  engine->submit(raw_request(p3_full, 20, t3));
  run_to_idle(*engine);
  EXPECT_EQ(t3.prompt_info.reused_tokens, 100);
  EXPECT_EQ(t3.tokens, fresh_tokens(model, p3_full, 20));

  // Dropping the kept KV frees it at once.
  engine->drop_kept_kv();
  EXPECT_EQ(engine->kept_kv_tokens(), 0);
  EXPECT_EQ(engine->telemetry().scheduler.kept_kv_bytes, 0u);
}

// The case: the same through the chat template: turn 2's messages repeat turn 1's and its
// reply; the prompt reuses at least the rendered first turn, and the reply equals a fresh one.
TEST(EngineKvReuse, ChatTurnReusesTheConversationSoFar) {
  TempModel model(SyntheticModelSpec::preset("kv-wide"), "kv_reuse_chat");
  auto run_turn = [](Engine& engine, const std::vector<ChatMessage>& messages, Output& out) {
    Request r;
    r.messages = messages;
    r.sampling = SamplingParams::greedy();
    r.sampling.max_tokens = 24;
    r.sink = test::sink_into(out);
    engine.submit(std::move(r));
    run_to_idle(engine);
  };
  std::vector<ChatMessage> history = {{"system", "You are terse."},
                                      {"user", "Tell me about granules of memory."}};
  auto engine = Engine::open(model.path, cpu_options(1, true));
  Output t1;
  run_turn(*engine, history, t1);
  ASSERT_EQ(t1.reason, FinishReason::MaxTokens);
  history.push_back({"assistant", t1.text});
  history.push_back({"user", "And the pool?"});
  Output t2;
  run_turn(*engine, history, t2);
  // At least the first turn's prompt. The reply's own tokens serve too where its text encodes
  // back to the tokens sampled; a random model's replies often do not (a real model's do:
  // tests/cli/chat_reuse_test.sh), so that part is not asserted here.
  EXPECT_GE(t2.prompt_info.reused_tokens, t1.prompt_info.prompt_tokens);
  EXPECT_EQ(t2.prompt_info.computed_tokens,
            t2.prompt_info.prompt_tokens - t2.prompt_info.reused_tokens);

  auto fresh = Engine::open(model.path, cpu_options(1, false));
  Output f2;
  run_turn(*fresh, history, f2);
  EXPECT_EQ(f2.prompt_info.reused_tokens, 0);
  EXPECT_EQ(t2.tokens, f2.tokens);
}

// What the engine holds besides KV.
uint64_t non_kv_bytes(const TempModel& model, int32_t slots) {
  EngineOptions o = cpu_options(slots, true);
  o.kv_pool_granules = 0;
  const TelemetrySnapshot t = Engine::open(model.path, o)->telemetry();
  return t.device.used_bytes - t.device.ledger_bytes(MemoryCategory::KvCommitted) -
         t.device.ledger_bytes(MemoryCategory::KvPool);
}

// The case: an idle chat keeps 4 granules of KV; two chats then run that together with it
// would pass the budget. The idle KV goes to host memory and neither running chat is
// preempted; both give the tokens they give alone.
TEST(EngineKvReuse, IdleKeptKvGivesWayBeforeRunningChatsArePreempted) {
  TempModel model(SyntheticModelSpec::preset("kv-wide"), "kv_reuse_pressure");
  EngineOptions o = cpu_options(3, true);
  o.kv_pool_granules = 0;
  o.vram_budget_bytes = non_kv_bytes(model, 3) + 10 * kGranule;
  auto engine = Engine::open(model.path, o);

  Output idle;
  engine->submit(raw_request(pseudo_random_tokens(200, 7), 50, idle, "idle"));
  run_to_idle(*engine);
  ASSERT_EQ(idle.reason, FinishReason::MaxTokens);
  ASSERT_EQ(engine->kept_kv_tokens(), 249);

  const std::vector<TokenId> pb = pseudo_random_tokens(150, 8), pc = pseudo_random_tokens(150, 9);
  Output b, c;
  engine->submit(raw_request(pb, 100, b, "b"));
  engine->submit(raw_request(pc, 100, c, "c"));
  uint64_t peak = 0;
  while (engine->step()) {
    peak = std::max(peak, engine->telemetry().kv.committed_bytes);
  }
  const TelemetrySnapshot t = engine->telemetry();
  EXPECT_EQ(b.reason, FinishReason::MaxTokens) << b.error;
  EXPECT_EQ(c.reason, FinishReason::MaxTokens) << c.error;
  EXPECT_EQ(t.scheduler.preemptions, 0u) << "a running chat gave way while idle KV was kept";
  EXPECT_EQ(t.scheduler.kv_swap_outs, 1u);
  EXPECT_EQ(t.scheduler.kv_swap_out_bytes, 249u * 32768u);
  EXPECT_LE(peak, 10 * kGranule);
  EXPECT_EQ(b.tokens, fresh_tokens(model, pb, 100));
  EXPECT_EQ(c.tokens, fresh_tokens(model, pc, 100));
}

// The case: two slots, one held by an idle chat; two new chats need both. The idle chat's
// KV goes to host memory for its slot; nothing is preempted.
TEST(EngineKvReuse, IdleKeptKvGivesUpItsSlotFirst) {
  TempModel model(SyntheticModelSpec::preset("kv-wide"), "kv_reuse_slots");
  auto engine = Engine::open(model.path, cpu_options(2, true));
  Output idle;
  engine->submit(raw_request(pseudo_random_tokens(40, 4), 10, idle, "idle"));
  run_to_idle(*engine);
  Output b, c;
  engine->submit(raw_request(pseudo_random_tokens(40, 5), 10, b, "b"));
  engine->submit(raw_request(pseudo_random_tokens(40, 6), 10, c, "c"));
  run_to_idle(*engine);
  const TelemetrySnapshot t = engine->telemetry();
  EXPECT_EQ(b.reason, FinishReason::MaxTokens);
  EXPECT_EQ(c.reason, FinishReason::MaxTokens);
  EXPECT_EQ(t.scheduler.preemptions, 0u);
  EXPECT_EQ(t.scheduler.kv_swap_outs, 1u);
  EXPECT_EQ(t.scheduler.swapped_chats, 1);
  EXPECT_EQ(t.scheduler.kept_chats, 2);
  EXPECT_EQ(engine->swapped_kv_tokens(), 49);
}

// The case: chat A's KV is swapped to host memory when chat B needs the only slot, and copied
// back when A's next turn comes: that turn computes only its new tokens and continues exactly
// as a fresh prefill of the whole conversation.
TEST(EngineKvReuse, SwapOutAndInContinuesAsAFreshPrefill) {
  TempModel model(SyntheticModelSpec::preset("kv-wide"), "kv_reuse_swap");
  auto engine = Engine::open(model.path, cpu_options(1, true));
  const std::vector<TokenId> pa = pseudo_random_tokens(120, 21);
  Output a1;
  engine->submit(raw_request(pa, 25, a1, "a"));
  run_to_idle(*engine);
  ASSERT_EQ(a1.reason, FinishReason::MaxTokens);

  Output b1;
  engine->submit(raw_request(pseudo_random_tokens(60, 22), 10, b1, "b"));
  run_to_idle(*engine);
  ASSERT_EQ(b1.reason, FinishReason::MaxTokens);
  TelemetrySnapshot t = engine->telemetry();
  EXPECT_EQ(t.scheduler.kv_swap_outs, 1u);
  EXPECT_EQ(t.scheduler.swapped_kv_bytes, (120u + 24u) * 32768u);
  EXPECT_EQ(b1.prompt_info.reused_tokens, 0) << "chat b took chat a's KV";

  const std::vector<TokenId> pa2 = concat(concat(pa, a1.tokens), pseudo_random_tokens(30, 23));
  Output a2;
  engine->submit(raw_request(pa2, 25, a2, "a"));
  run_to_idle(*engine);
  ASSERT_EQ(a2.reason, FinishReason::MaxTokens);
  t = engine->telemetry();
  EXPECT_EQ(t.scheduler.kv_swap_ins, 1u);
  EXPECT_EQ(t.scheduler.kv_swap_in_bytes, (120u + 24u) * 32768u);
  EXPECT_EQ(t.scheduler.kv_swap_outs, 2u);  // b's KV made room in turn
  EXPECT_EQ(a2.prompt_info.reused_tokens, 120 + 24);
  EXPECT_EQ(a2.prompt_info.swapped_in_tokens, 120 + 24);
  EXPECT_EQ(a2.tokens, fresh_tokens(model, pa2, 25));

  // Without a host allowance the idle KV is dropped instead, and recomputed.
  EngineOptions o = cpu_options(1, true);
  o.kv_host_cache_bytes = 0;
  auto dropping = Engine::open(model.path, o);
  Output d1, d2, d3;
  dropping->submit(raw_request(pa, 25, d1, "a"));
  run_to_idle(*dropping);
  dropping->submit(raw_request(pseudo_random_tokens(60, 22), 10, d2, "b"));
  run_to_idle(*dropping);
  dropping->submit(raw_request(pa2, 25, d3, "a"));
  run_to_idle(*dropping);
  t = dropping->telemetry();
  EXPECT_EQ(t.scheduler.kv_swap_outs, 0u);
  EXPECT_EQ(t.scheduler.kept_kv_dropped, 2u);
  EXPECT_EQ(d3.prompt_info.reused_tokens, 0);
  EXPECT_EQ(d3.tokens, a2.tokens);
}

// The number of tokens the engine's template and tokenizer make of these messages.
int64_t rendered_tokens(const Engine& engine, const std::vector<ChatMessage>& messages) {
  const Tokenizer& tokenizer = engine.tokenizer();
  const std::string bos = tokenizer.bos() ? tokenizer.token_text(*tokenizer.bos()) : "";
  return static_cast<int64_t>(
      tokenizer.encode(engine.chat_template()->render(messages, true, bos), false, true).size());
}

// The case: a conversation of six turns in a context of 256 tokens. Submitted as it is, the
// oldest turns are left out (whole turns: the model's view begins with a user message), the
// system prompt stays, and the prompt leaves the reply its reserve; Stop refuses it instead,
// and a raw prompt past the context says so without speaking of a conversation.
TEST(EngineKvReuse, OverflowDropsTheOldestTurnsKeepingTheSystemPrompt) {
  TempModel model(SyntheticModelSpec::preset("kv-wide"), "kv_reuse_overflow");
  EngineOptions o = cpu_options(1, true);
  o.context_length = 256;
  auto engine = Engine::open(model.path, o);
  std::vector<ChatMessage> messages = {{"system", "Be brief."}};
  for (int turn = 0; turn < 6; ++turn) {
    messages.push_back({"user", "question number " + std::to_string(turn) + " about memory?"});
    messages.push_back({"assistant", "answer number " + std::to_string(turn) + ", it is fine."});
  }
  messages.push_back({"user", "the last question?"});
  ASSERT_GT(rendered_tokens(*engine, messages), 256);

  Request r;
  r.messages = messages;
  r.sampling = SamplingParams::greedy();
  r.sampling.max_tokens = 32;
  Output out;
  r.sink = test::sink_into(out);
  engine->submit(r);
  run_to_idle(*engine);
  EXPECT_NE(out.reason, FinishReason::Error) << out.error;
  const int32_t dropped = out.prompt_info.dropped_messages;
  ASSERT_GT(dropped, 0);
  EXPECT_EQ(dropped % 2, 0) << "a turn was split";
  std::vector<ChatMessage> seen = {messages[0]};
  seen.insert(seen.end(), messages.begin() + 1 + dropped, messages.end());
  EXPECT_EQ(seen[1].role, "user");
  EXPECT_EQ(out.prompt_info.prompt_tokens, rendered_tokens(*engine, seen));
  EXPECT_LE(out.prompt_info.prompt_tokens + 32, 256);
  // One turn fewer dropped would not leave the reply its reserve.
  std::vector<ChatMessage> one_more = {messages[0]};
  one_more.insert(one_more.end(), messages.begin() + 1 + dropped - 2, messages.end());
  EXPECT_GT(rendered_tokens(*engine, one_more) + 32, 256);

  r.context_overflow = ContextOverflow::Stop;
  try {
    engine->submit(r);
    FAIL() << "Stop accepted a conversation past the context";
  } catch (const CapacityError& e) {
    EXPECT_NE(std::string(e.what()).find("conversation"), std::string::npos) << e.what();
  }

  try {
    Output raw;
    engine->submit(raw_request(pseudo_random_tokens(300, 5), 8, raw));
    FAIL() << "a raw prompt past the context was accepted";
  } catch (const CapacityError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find("conversation"), std::string::npos) << what;
    EXPECT_NE(what.find("300"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace granule
