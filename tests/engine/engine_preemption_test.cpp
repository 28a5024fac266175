// Tests of the Engine under a memory budget that holds only a few chats' KV (CPU backend,
// synthetic model): many chats finish with exactly the greedy tokens each gives alone with
// an unlimited budget although they were preempted and recomputed, committed KV never passes
// the budget and ends at zero; a chat the budget cannot hold alone gets one clear error while
// the others continue; cancelling a waiting or preempted chat finishes it once; seeded
// sampling is as unaffected by preemption as greedy.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "granule/engine.h"
#include "granule/testkit/synthetic_model.h"
#include "support/temp_model.h"

namespace granule {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kGranule = 2ull << 20;  // the CPU backend's host granule

using test::TempModel;

// Narrow to compute but wide in KV: 4 layers x K|V x 8 heads x 128 x f32 = 32 KiB a token,
// so a 2 MiB granule holds 64 tokens and a chat of a few hundred tokens spans several.
SyntheticModelSpec kv_wide_spec() {
  SyntheticModelSpec s;
  s.n_layer = 4;
  s.n_embd = 64;
  s.n_head = 8;
  s.n_head_kv = 8;
  s.head_dim = 128;
  s.n_ff = 128;
  s.n_vocab = 384;
  s.context_length = 512;
  s.seed = 5;
  return s;
}

EngineOptions cpu_options(int32_t max_sequences) {
  EngineOptions o;
  o.device = DeviceKind::Cpu;
  o.cpu_threads = 2;
  o.context_length = 512;
  o.max_sequences = max_sequences;
  o.prefill_chunk_tokens = 96;
  return o;
}

struct Output {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::None;
  int finishes = 0;
  std::string error;
};

struct Chat {
  std::vector<TokenId> prompt;
  int32_t max_tokens = 0;
  SamplingParams sampling = SamplingParams::greedy();
};

Request chat_request(const Chat& chat, std::map<SequenceId, Output>& outputs) {
  Request r;
  r.prompt_tokens = chat.prompt;
  r.sampling = chat.sampling;
  r.sampling.max_tokens = chat.max_tokens;
  r.sampling.ignore_eos = true;
  r.sink.on_token = [&outputs](SequenceId id, const std::string&, int32_t token) {
    if (token != kNoToken) outputs[id].tokens.push_back(token);
  };
  r.sink.on_finish = [&outputs](SequenceId id, FinishReason reason, const std::string& error) {
    outputs[id].reason = reason;
    outputs[id].error = error;
    ++outputs[id].finishes;
  };
  return r;
}

// Chats of 5..200 prompt tokens answering 20..150 tokens: 1 to 6 granules each.
std::vector<Chat> varied_chats(int count, uint64_t seed) {
  std::mt19937_64 random(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(random() % static_cast<uint64_t>(hi - lo + 1));
  };
  std::vector<Chat> chats(static_cast<size_t>(count));
  for (Chat& c : chats) {
    c.prompt.resize(static_cast<size_t>(uniform(5, 200)));
    for (TokenId& t : c.prompt) t = static_cast<TokenId>(uniform(3, 383));
    c.max_tokens = static_cast<int32_t>(uniform(20, 150));
  }
  return chats;
}

// Each chat alone on an engine with an unlimited budget: the reference tokens.
std::vector<std::vector<int32_t>> tokens_alone(const fs::path& model,
                                               const std::vector<Chat>& chats) {
  auto engine = Engine::open(model, cpu_options(1));
  std::vector<std::vector<int32_t>> tokens;
  for (const Chat& c : chats) {
    std::map<SequenceId, Output> out;
    const SequenceId id = engine->submit(chat_request(c, out));
    while (engine->step()) {
    }
    tokens.push_back(out[id].tokens);
  }
  return tokens;
}

// What the engine holds besides KV: committed KV and the pool of pre-created granules are
// both KV's room under the budget.
uint64_t non_kv_bytes(const fs::path& model) {
  const TelemetrySnapshot t = Engine::open(model, cpu_options(8))->telemetry();
  return t.device.used_bytes - t.device.ledger_bytes(MemoryCategory::KvCommitted) -
         t.device.ledger_bytes(MemoryCategory::KvPool);
}

// Eight slots and a budget with room for `granules` granules of KV beside what the engine
// holds anyway.
EngineOptions kv_room_options(const fs::path& model, uint64_t granules) {
  EngineOptions o = cpu_options(8);
  o.vram_budget_bytes = non_kv_bytes(model) + granules * kGranule;
  return o;
}

// Submits every chat at once; what each gives lands in `out`. Returns their ids in order.
std::vector<SequenceId> submit_all(Engine& engine, const std::vector<Chat>& chats,
                                   std::map<SequenceId, Output>& out) {
  std::vector<SequenceId> ids;
  for (const Chat& c : chats) ids.push_back(engine.submit(chat_request(c, out)));
  return ids;
}

// The case: twelve chats on eight slots with room for six granules of KV (a few chats at a
// time). Chats wait for admission and running ones are preempted as others grow; every chat
// still ends with exactly its alone tokens, the budget is never passed, and KV ends at zero.
TEST(EnginePreemption, ManyChatsOnASmallBudgetGiveTheirAloneTokens) {
  const TempModel model(kv_wide_spec(), "granule_preemption");
  const std::vector<Chat> chats = varied_chats(12, 20261202);
  const auto alone = tokens_alone(model.path, chats);

  const EngineOptions o = kv_room_options(model.path, 6);
  auto engine = Engine::open(model.path, o);
  std::map<SequenceId, Output> out;
  const std::vector<SequenceId> ids = submit_all(*engine, chats, out);

  int steps = 0;
  int32_t most_waiting = 0;
  bool preempted_seen_waiting = false;
  uint64_t most_kv = 0;
  uint64_t mapped_by_steps = 0, unmapped_by_steps = 0;  // the per-step counters, summed
  while (engine->step()) {
    ++steps;
    ASSERT_LT(steps, 20000);
    const TelemetrySnapshot t = engine->telemetry();
    ASSERT_LE(t.device.used_bytes, o.vram_budget_bytes) << "step " << steps;
    most_kv = std::max(most_kv, t.device.ledger_bytes(MemoryCategory::KvCommitted));
    most_waiting = std::max(most_waiting, t.scheduler.waiting);
    ASSERT_EQ(static_cast<size_t>(t.scheduler.running + t.scheduler.waiting), t.sequences.size());
    ASSERT_LE(t.scheduler.running, o.max_sequences);
    mapped_by_steps += t.kv.last_granules_mapped + t.kv.last_ahead_granules;
    unmapped_by_steps += t.kv.last_granules_unmapped;
    for (const SequenceTelemetry& s : t.sequences) {
      if (s.waiting) ASSERT_EQ(s.kv_committed_bytes, 0u) << "step " << steps;
      if (s.waiting && s.preemptions > 0) preempted_seen_waiting = true;
    }
  }
  ASSERT_TRUE(engine->idle());
  // Chats that ended keep their KV for a next turn (EngineOptions::kv_reuse): that is all the
  // KV left, and dropping it frees the rest.
  EXPECT_EQ(engine->telemetry().device.ledger_bytes(MemoryCategory::KvCommitted),
            engine->telemetry().scheduler.kept_kv_bytes);
  const uint64_t unmapped_in_steps = engine->telemetry().kv.granules_unmapped;
  engine->drop_kept_kv();
  const TelemetrySnapshot end = engine->telemetry();
  EXPECT_GT(end.scheduler.preemptions, 0u);
  EXPECT_GT(end.scheduler.recomputed_tokens, 0u);
  EXPECT_GT(end.kv.map_refusals, 0u);
  EXPECT_TRUE(preempted_seen_waiting);
  EXPECT_GE(most_waiting, 6);        // twelve chats, at most six granules
  EXPECT_EQ(most_kv, 6 * kGranule);  // the budget was used to the last granule
  EXPECT_EQ(end.kv.peak_committed_bytes, most_kv);
  EXPECT_EQ(end.device.ledger_bytes(MemoryCategory::KvCommitted), 0u);
  EXPECT_EQ(end.kv.granules_mapped, end.kv.granules_unmapped);
  // Every map and unmap happened inside a step (or, mapping ahead, while it ran), so the
  // per-step counts add up to the totals.
  EXPECT_EQ(mapped_by_steps, end.kv.granules_mapped);
  EXPECT_EQ(unmapped_by_steps, unmapped_in_steps);  // the kept KV was dropped after the steps
  for (size_t i = 0; i < chats.size(); ++i) {
    const Output& o_i = out[ids[i]];
    EXPECT_EQ(o_i.finishes, 1) << "chat " << i;
    EXPECT_EQ(o_i.reason, FinishReason::MaxTokens) << "chat " << i << ": " << o_i.error;
    EXPECT_EQ(o_i.tokens, alone[i]) << "chat " << i;
  }
  RecordProperty("steps", steps);
  RecordProperty("preemptions", static_cast<int>(end.scheduler.preemptions));
}

// The case: seeded sampling with penalties survives preemption too: the recomputed prefill
// samples the next token with the same draw index and history, so each chat gives the
// tokens it gives alone.
TEST(EnginePreemption, SeededSamplingChatsGiveTheirAloneTokens) {
  const TempModel model(kv_wide_spec(), "granule_preemption");
  std::vector<Chat> chats = varied_chats(8, 4242);
  for (size_t i = 0; i < chats.size(); ++i) {
    SamplingParams p;  // temperature 0.7, top-k 40, top-p 0.95, min-p 0.05
    p.seed = 100 + i;
    p.repetition_penalty = 1.1f;
    chats[i].sampling = p;
  }
  const auto alone = tokens_alone(model.path, chats);

  const EngineOptions o = kv_room_options(model.path, 5);
  auto engine = Engine::open(model.path, o);
  std::map<SequenceId, Output> out;
  const std::vector<SequenceId> ids = submit_all(*engine, chats, out);
  for (int i = 0; i < 20000 && engine->step(); ++i) {
  }
  ASSERT_TRUE(engine->idle());
  EXPECT_GT(engine->telemetry().scheduler.preemptions, 0u);
  for (size_t i = 0; i < chats.size(); ++i) {
    EXPECT_EQ(out[ids[i]].reason, FinishReason::MaxTokens) << "chat " << i;
    EXPECT_EQ(out[ids[i]].tokens, alone[i]) << "chat " << i;
  }
}

// The case: the oldest chat answers more tokens than the whole budget holds. Newer chats are
// preempted to make room for it; once it is alone and still does not fit it ends with one
// error naming the budget, after the tokens it gave; the others then finish as they do alone.
TEST(EnginePreemption, ChatTooLargeForTheBudgetAloneFailsOnceAndOthersContinue) {
  const TempModel model(kv_wide_spec(), "granule_preemption");
  std::vector<Chat> chats = varied_chats(5, 7);
  chats[0].prompt.resize(100, 17);
  chats[0].max_tokens = 400;  // 500 tokens: 8 granules, the budget holds 5
  chats[1].prompt.resize(20, 23);
  chats[1].max_tokens = 300;                         // 320 tokens: 5 granules, grows next to chat 0
  chats[2] = Chat{std::vector<TokenId>(330, 9), 4};  // a 330-token prompt: 6 granules
  const auto alone = tokens_alone(model.path, chats);

  const EngineOptions o = kv_room_options(model.path, 5);
  auto engine = Engine::open(model.path, o);
  std::map<SequenceId, Output> out;
  const std::vector<SequenceId> ids = submit_all(*engine, chats, out);
  for (int i = 0; i < 20000 && engine->step(); ++i) {
    ASSERT_LE(engine->telemetry().device.used_bytes, o.vram_budget_bytes);
  }
  ASSERT_TRUE(engine->idle());

  for (size_t i : {size_t{0}, size_t{2}}) {
    const Output& failed = out[ids[i]];
    EXPECT_EQ(failed.finishes, 1) << "chat " << i;
    EXPECT_EQ(failed.reason, FinishReason::Error) << "chat " << i;
    EXPECT_NE(failed.error.find("memory budget"), std::string::npos) << failed.error;
    EXPECT_EQ(failed.error.find('\n'), std::string::npos) << failed.error;
  }
  // The long chat gave every token that fit before it failed, each equal to its alone run.
  const Output& long_chat = out[ids[0]];
  EXPECT_GE(long_chat.tokens.size(), 200u);
  ASSERT_LE(long_chat.tokens.size(), alone[0].size());
  EXPECT_TRUE(std::equal(long_chat.tokens.begin(), long_chat.tokens.end(), alone[0].begin()));
  EXPECT_NE(long_chat.error.find("for 321 tokens"), std::string::npos) << long_chat.error;
  EXPECT_TRUE(out[ids[2]].tokens.empty());  // refused before it was ever admitted
  for (size_t i = 0; i < chats.size(); ++i) {
    if (i == 0 || i == 2) continue;
    EXPECT_EQ(out[ids[i]].finishes, 1) << "chat " << i;
    EXPECT_EQ(out[ids[i]].reason, FinishReason::MaxTokens)
        << "chat " << i << ": " << out[ids[i]].error;
    EXPECT_EQ(out[ids[i]].tokens, alone[i]) << "chat " << i;
  }
  // Chats that ended keep their KV for a next turn (EngineOptions::kv_reuse): that is all the
  // KV left, and dropping it frees the rest.
  EXPECT_EQ(engine->telemetry().device.ledger_bytes(MemoryCategory::KvCommitted),
            engine->telemetry().scheduler.kept_kv_bytes);
  engine->drop_kept_kv();
  const TelemetrySnapshot end = engine->telemetry();
  EXPECT_GT(end.scheduler.preemptions, 0u);
  EXPECT_EQ(end.device.ledger_bytes(MemoryCategory::KvCommitted), 0u);
}

// The case: cancelling a chat that waits for admission and one that was preempted (waiting
// with its KV freed) finishes each once with Cancelled; the rest are unaffected.
TEST(EnginePreemption, CancellingWaitingAndPreemptedChatsFinishesThemOnce) {
  const TempModel model(kv_wide_spec(), "granule_preemption");
  const std::vector<Chat> chats = varied_chats(8, 99);
  const auto alone = tokens_alone(model.path, chats);

  const EngineOptions o = kv_room_options(model.path, 5);
  auto engine = Engine::open(model.path, o);
  std::map<SequenceId, Output> out;
  const std::vector<SequenceId> ids = submit_all(*engine, chats, out);

  std::optional<SequenceId> preempted, never_admitted;
  for (int i = 0; i < 20000 && engine->step() && !preempted; ++i) {
    for (const SequenceTelemetry& s : engine->telemetry().sequences) {
      if (s.waiting && s.preemptions > 0) preempted = s.id;
    }
  }
  ASSERT_TRUE(preempted.has_value()) << "no chat was preempted";
  for (const SequenceTelemetry& s : engine->telemetry().sequences) {
    if (s.waiting && s.preemptions == 0 && s.id != *preempted) never_admitted = s.id;
  }
  ASSERT_TRUE(never_admitted.has_value()) << "every chat was admitted already";
  ASSERT_TRUE(out[*never_admitted].tokens.empty());
  const size_t preempted_tokens = out[*preempted].tokens.size();
  EXPECT_GT(preempted_tokens, 0u);  // it had answered before it was preempted

  engine->cancel(*preempted);
  engine->cancel(*never_admitted);
  EXPECT_EQ(out[*preempted].reason, FinishReason::Cancelled);
  EXPECT_EQ(out[*never_admitted].reason, FinishReason::Cancelled);
  while (engine->step()) {
  }
  ASSERT_TRUE(engine->idle());
  EXPECT_EQ(out[*preempted].finishes, 1);
  EXPECT_EQ(out[*never_admitted].finishes, 1);
  EXPECT_EQ(out[*preempted].tokens.size(), preempted_tokens);  // nothing after the cancel
  for (size_t i = 0; i < chats.size(); ++i) {
    if (ids[i] == *preempted || ids[i] == *never_admitted) continue;
    EXPECT_EQ(out[ids[i]].reason, FinishReason::MaxTokens) << "chat " << i;
    EXPECT_EQ(out[ids[i]].tokens, alone[i]) << "chat " << i;
  }
  // Chats that ended keep their KV for a next turn (EngineOptions::kv_reuse): that is all the
  // KV left, and dropping it frees the rest.
  EXPECT_EQ(engine->telemetry().device.ledger_bytes(MemoryCategory::KvCommitted),
            engine->telemetry().scheduler.kept_kv_bytes);
  engine->drop_kept_kv();
  EXPECT_EQ(engine->telemetry().device.ledger_bytes(MemoryCategory::KvCommitted), 0u);
}

}  // namespace
}  // namespace granule

namespace granule {
namespace {

// The KV pool and mapping ahead: the engine pre-creates granules (a prefill chunk's worth
// plus one per four slots) and, while a step runs, maps what the next step writes. So the
// steps of ordinary chats create no granule, and once every chat decodes a step maps
// nothing itself. With the pool off every granule is created on the step's path. The tokens
// are the same either way, and the pool's bytes are in the ledger as "kv_pool".
TEST(EngineKvPool, StepsMapPreCreatedGranulesAheadAndGiveTheSameTokens) {
  const TempModel model(kv_wide_spec(), "granule_preemption");
  const std::vector<Chat> chats = varied_chats(6, 99);
  struct Run {
    std::vector<std::vector<int32_t>> tokens;
    uint64_t mapped = 0, mapped_ahead = 0, created_in_steps = 0, most_pool = 0, pool_target = 0;
    uint64_t mapped_in_decode_steps = 0;  // by the steps themselves, once every chat decodes
  };
  auto run = [&](int64_t pool) {
    EngineOptions o = cpu_options(8);
    o.kv_pool_granules = pool;
    auto engine = Engine::open(model.path, o);
    Run r;
    const TelemetrySnapshot opened = engine->telemetry();
    r.pool_target = opened.kv.pool_target_granules;
    EXPECT_EQ(opened.kv.pool_bytes, r.pool_target * kGranule);  // created at open
    EXPECT_EQ(opened.device.ledger_bytes(MemoryCategory::KvPool), opened.kv.pool_bytes);
    std::map<SequenceId, Output> out;
    const std::vector<SequenceId> ids = submit_all(*engine, chats, out);
    bool all_decoding = false;  // every chat has its first token: later steps only decode
    while (engine->step()) {
      const TelemetrySnapshot t = engine->telemetry();
      r.mapped += t.kv.last_granules_mapped + t.kv.last_ahead_granules;
      r.mapped_ahead += t.kv.last_ahead_granules;
      r.created_in_steps += t.kv.last_granules_created;
      if (all_decoding) r.mapped_in_decode_steps += t.kv.last_granules_mapped;
      r.most_pool = std::max(r.most_pool, t.kv.pool_bytes);
      EXPECT_EQ(t.device.ledger_bytes(MemoryCategory::KvPool), t.kv.pool_bytes);
      all_decoding = std::all_of(ids.begin(), ids.end(),
                                 [&](SequenceId id) { return !out[id].tokens.empty(); });
    }
    for (SequenceId id : ids) r.tokens.push_back(out[id].tokens);
    // Chats that ended keep their KV for a next turn (EngineOptions::kv_reuse): that is all the
    // KV left, and dropping it frees the rest.
    EXPECT_EQ(engine->telemetry().device.ledger_bytes(MemoryCategory::KvCommitted),
              engine->telemetry().scheduler.kept_kv_bytes);
    engine->drop_kept_kv();
    const TelemetrySnapshot end = engine->telemetry();
    EXPECT_EQ(end.device.ledger_bytes(MemoryCategory::KvCommitted), 0u);
    EXPECT_EQ(end.kv.pool_bytes, r.pool_target * kGranule);  // refilled, never past the target
    return r;
  };
  const Run pooled = run(-1);
  const Run unpooled = run(0);
  // 96-token chunks of 32 KiB tokens: 2 granules a chunk, plus 2 for 8 slots.
  EXPECT_EQ(pooled.pool_target, 4u);
  EXPECT_EQ(unpooled.pool_target, 0u);
  EXPECT_GT(pooled.mapped, 15u);
  EXPECT_GE(pooled.mapped_ahead, 5u);  // the decode growth: 5 of 17 granules here
  EXPECT_EQ(pooled.mapped_in_decode_steps, 0u);
  EXPECT_EQ(pooled.created_in_steps, 0u);
  EXPECT_LE(pooled.most_pool, 4 * kGranule);
  EXPECT_EQ(unpooled.created_in_steps + unpooled.mapped_ahead, unpooled.mapped);
  EXPECT_EQ(pooled.mapped, unpooled.mapped);
  EXPECT_EQ(pooled.tokens, unpooled.tokens);
}

// A prompt of several chunks: while one chunk runs, the engine maps the next chunk's
// granules, so after the first step no prefill step maps KV on its own path, and the tokens
// are those of an engine that maps only inside the steps.
TEST(EngineKvPool, LongPromptMapsTheNextChunkAhead) {
  const TempModel model(kv_wide_spec(), "granule_preemption");
  Chat chat;
  chat.prompt.resize(470);  // five 96-token chunks
  std::mt19937_64 random(7);
  for (TokenId& t : chat.prompt) t = static_cast<TokenId>(3 + random() % 380);
  chat.max_tokens = 4;
  struct Run {
    std::vector<int32_t> tokens;
    uint64_t mapped_in_later_prefill_steps = 0, mapped_ahead = 0, mapped = 0;
  };
  auto run = [&](bool map_ahead) {
    EngineOptions o = cpu_options(2);
    o.kv_map_ahead = map_ahead;
    auto engine = Engine::open(model.path, o);
    std::map<SequenceId, Output> out;
    const SequenceId id = engine->submit(chat_request(chat, out));
    Run r;
    for (int step = 0; engine->step(); ++step) {
      const TelemetrySnapshot t = engine->telemetry();
      const bool prefill = out[id].tokens.empty();
      if (step > 0 && (prefill || out[id].tokens.size() == 1))
        r.mapped_in_later_prefill_steps += t.kv.last_granules_mapped;
      r.mapped_ahead += t.kv.last_ahead_granules;
      r.mapped += t.kv.last_granules_mapped + t.kv.last_ahead_granules;
    }
    r.tokens = out[id].tokens;
    return r;
  };
  const Run ahead = run(true), inline_only = run(false);
  EXPECT_EQ(ahead.tokens.size(), 4u);
  EXPECT_EQ(ahead.tokens, inline_only.tokens);
  EXPECT_EQ(ahead.mapped_in_later_prefill_steps, 0u);
  EXPECT_GT(inline_only.mapped_in_later_prefill_steps, 2u);  // what the steps did themselves
  EXPECT_GE(ahead.mapped_ahead, inline_only.mapped_in_later_prefill_steps);
  EXPECT_EQ(ahead.mapped, inline_only.mapped);  // the same granules, only mapped earlier
}

}  // namespace
}  // namespace granule
