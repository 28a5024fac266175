// KV by layer kind (issue 37): a model's sliding-window layers keep their KV in a part of each
// slot of their own, whose granules wholly behind the window are unmapped as the window slides.
// On the CPU backend (whose KV runs on the same KvSpace, over host memory):
//   - a long Gemma-shaped chat (a prompt in chunks, then greedy decode) gives logits identical to
//     the bit to a run whose KV keeps every token, while the window part's committed bytes stay
//     within the window and the look-ahead plus one granule and the global part's grow;
//   - swapping the chat's KV to host memory and back (the window part's live range only) and
//     going on gives the same tokens;
//   - a shorter prefix of the chat can no longer be continued from the slot once its window has
//     slid past it (prefix reuse then computes again), the whole chat can; through the engine,
//     turns reuse what they can and their greedy tokens equal a fresh prefill's.
// And the layout: a model without sliding layers keeps one part, a Gemma one two, each granule
// aligned; the KV a window part needs is bounded (bytes_for_tokens), and so is the fit preview's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <span>
#include <vector>

#include "backends/backend.h"
#include "granule/engine.h"
#include "granule/gguf.h"
#include "granule/model_config.h"
#include "granule/telemetry.h"
#include "granule/testkit/synthetic_model.h"
#include "memory/kv_space.h"
#include "memory/memory_manager.h"
#include "support/engine_chats.h"
#include "support/model_runtime.h"
#include "support/temp_model.h"

namespace granule {
namespace {

constexpr int64_t kWindow = 64;
constexpr int64_t kContext = 1024;

// tiny-gemma3 (5 sliding layers to 1 global) with a wide KV (4 KV heads of 128, 4 KiB per layer
// and token in f32), so that a 2 MiB granule of the window part holds ~100 tokens.
SyntheticModelSpec window_spec() {
  SyntheticModelSpec s = SyntheticModelSpec::preset("tiny-gemma3");
  s.name = "kv-window-gemma";
  s.n_head = 4;
  s.n_head_kv = 4;
  s.head_dim = 128;
  s.sliding_window = kWindow;
  s.context_length = kContext;
  return s;
}

// The CPU backend over a KvSpace of the given parts (the runtime's, or one whose window part
// keeps every token).
struct Rig {
  std::unique_ptr<ModelFile> file;
  ModelConfig config;
  WeightTable weights;
  BackendOptions options;
  std::unique_ptr<MemoryManager> memory;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<KvSpace> kv;

  Rig(const std::filesystem::path& path, bool keep_everything) {
    file = ModelFile::open(path);
    config = ModelConfig::from_gguf(*file);
    weights = WeightTable::from_gguf(*file, config);
    options.cpu_threads = 2;
    memory = std::make_unique<MemoryManager>(uint64_t{1} << 40);
    backend = make_cpu_backend({*file, config, weights, *memory, options});
    KvGeometry g;
    g.bytes_per_token = backend->kv_bytes_per_token();
    g.max_tokens = kContext;
    g.slots = 2;
    g.parts = kv_parts(config, kCpuKvElementBytes);
    if (keep_everything)
      for (KvPartGeometry& p : g.parts) p.window_tokens = 0;
    kv = std::make_unique<KvSpace>(backend->make_kv_virtual_memory(), g, *memory);
    backend->attach_kv(*kv);
  }
  ~Rig() {
    kv.reset();
    backend.reset();
  }

  std::vector<float> run(int32_t slot, std::span<const int32_t> tokens, int64_t start) {
    EXPECT_TRUE(kv->map_through(slot, start + static_cast<int64_t>(tokens.size()), start));
    const BatchSequence seq{slot, tokens, start, false};
    std::vector<float> logits;
    backend->forward(std::span<const BatchSequence>(&seq, 1), logits);
    return logits;
  }
};

int32_t argmax(const std::vector<float>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<int32_t> prompt_tokens(int n, int64_t vocab) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(3 + (i * 37 + i / 7) % (vocab - 3)));
  return t;
}

TEST(KvWindow, PartsByLayerKindGranuleAligned) {
  test::TempModel gemma(window_spec(), "kv-window-parts");
  Rig rig(gemma.path, false);
  ASSERT_EQ(rig.kv->parts(), 2);
  const int64_t layer_bytes = 2 * 4 * 128 * kCpuKvElementBytes;
  EXPECT_EQ(rig.kv->part(ModelConfig::kKvPartAll).bytes_per_token, layer_bytes);
  EXPECT_EQ(rig.kv->part(ModelConfig::kKvPartWindow).bytes_per_token, 5 * layer_bytes);
  EXPECT_EQ(rig.kv->part(ModelConfig::kKvPartWindow).window_tokens, kWindow);
  EXPECT_EQ(rig.kv->part_offset_bytes(0), 0u);
  EXPECT_EQ(rig.kv->part_offset_bytes(1) % rig.kv->granule_bytes(), 0u);
  EXPECT_GE(rig.kv->part_offset_bytes(1), static_cast<uint64_t>(kContext * layer_bytes));
  // The global layer is layer 5: first in its part; sliding layer 3 is the fourth of its part.
  EXPECT_EQ(rig.config.kv_part(5), ModelConfig::kKvPartAll);
  EXPECT_EQ(rig.config.kv_offset_elements(5), 0);
  EXPECT_EQ(rig.config.kv_offset_elements(3), 3 * layer_bytes / kCpuKvElementBytes);
  // The fit: a window part holds its window's granules and one more, however long the chat.
  const uint64_t g = rig.kv->granule_bytes();
  const uint64_t window_granules =
      (static_cast<uint64_t>(kWindow * 5 * layer_bytes) + g - 1) / g + 1;
  const uint64_t global_granules = (static_cast<uint64_t>(1000 * layer_bytes) + g - 1) / g;
  EXPECT_EQ(rig.kv->bytes_for_tokens(1000), (window_granules + global_granules) * g);

  SyntheticModelSpec plain = SyntheticModelSpec::preset("tiny");
  test::TempModel llama(plain, "kv-window-plain");
  Rig one(llama.path, false);
  EXPECT_EQ(one.kv->parts(), 1);
  EXPECT_TRUE(one.kv->geometry().parts.empty());
}

TEST(KvWindow, LongChatStaysWithinTheWindowAndMatchesKeepingEverything) {
  test::TempModel model(window_spec(), "kv-window-chat");
  Rig windowed(model.path, false), everything(model.path, true);
  const int64_t vocab = windowed.config.n_vocab;
  const uint64_t g = windowed.kv->granule_bytes();
  const auto window_token_bytes =
      static_cast<uint64_t>(windowed.kv->part(ModelConfig::kKvPartWindow).bytes_per_token);
  const int64_t lookahead = windowed.kv->geometry().lookahead_tokens;
  // The bound: the window, the look-ahead and the granule the window's start falls in.
  const uint64_t bound =
      ((static_cast<uint64_t>(kWindow + lookahead) * window_token_bytes + g - 1) / g + 1) * g;
  ASSERT_LT(bound, static_cast<uint64_t>(700) * window_token_bytes);  // the chat outgrows it

  // A prompt of 300 tokens in chunks of 64, then 400 greedy tokens.
  const std::vector<int32_t> prompt = prompt_tokens(300, vocab);
  std::vector<float> a, b;
  uint64_t most_window = 0;
  for (int64_t start = 0; start < 300; start += 64) {
    const auto n = static_cast<size_t>(std::min<int64_t>(64, 300 - start));
    const std::span<const int32_t> chunk(prompt.data() + start, n);
    a = windowed.run(0, chunk, start);
    b = everything.run(0, chunk, start);
    ASSERT_TRUE(same_bits(a, b)) << "chunk at " << start;
    most_window =
        std::max(most_window, windowed.kv->committed_bytes(0, ModelConfig::kKvPartWindow));
  }
  // A prefill chunk holds its own tokens too: after it, the window bound holds again.
  std::vector<int32_t> generated;
  int64_t position = 300;
  for (int i = 0; i < 400; ++i, ++position) {
    const int32_t next = argmax(a);
    generated.push_back(next);
    a = windowed.run(0, std::span<const int32_t>(&next, 1), position);
    b = everything.run(0, std::span<const int32_t>(&next, 1), position);
    ASSERT_TRUE(same_bits(a, b)) << "decode step at " << position;
    const uint64_t window = windowed.kv->committed_bytes(0, ModelConfig::kKvPartWindow);
    EXPECT_LE(window, bound) << "at " << position;
    most_window = std::max(most_window, window);
  }
  // The global part grew with the chat, the window part stayed flat; keeping everything, both
  // grew.
  const auto global_token_bytes =
      static_cast<uint64_t>(windowed.kv->part(ModelConfig::kKvPartAll).bytes_per_token);
  EXPECT_GE(windowed.kv->committed_bytes(0, ModelConfig::kKvPartAll),
            static_cast<uint64_t>(position) * global_token_bytes);
  EXPECT_GE(everything.kv->committed_bytes(0, ModelConfig::kKvPartWindow),
            static_cast<uint64_t>(position) * window_token_bytes);
  EXPECT_LT(windowed.kv->committed_bytes(0), everything.kv->committed_bytes(0));
  EXPECT_GT(windowed.kv->stats().granules_unmapped, 0u);
  std::cout << "[kv-window] " << position << " tokens: window part " << most_window / 1024
            << " KiB at most (bound " << bound / 1024 << " KiB), keeping everything "
            << everything.kv->committed_bytes(0, ModelConfig::kKvPartWindow) / 1024 << " KiB\n";

  // The ledger: what is committed is charged, nothing more.
  EXPECT_EQ(windowed.memory->bytes(MemoryCategory::KvCommitted),
            windowed.kv->stats().committed_bytes);

  // A shorter prefix cannot be continued any more (its window slid out), the whole chat can.
  EXPECT_TRUE(windowed.kv->can_continue_at(0, position));
  EXPECT_FALSE(windowed.kv->can_continue_at(0, 100));
  EXPECT_TRUE(everything.kv->can_continue_at(0, 100));

  // Swapped to host memory (each part's live range), released, and back in the other slot.
  std::vector<uint8_t> host(windowed.kv->live_bytes(position));
  ASSERT_LT(host.size(), static_cast<size_t>(position) * windowed.backend->kv_bytes_per_token());
  ASSERT_TRUE(windowed.backend->copy_kv_to_host(0, position, host.data()));
  windowed.kv->release(0);
  EXPECT_EQ(windowed.kv->committed_bytes(0), 0u);
  ASSERT_TRUE(windowed.kv->map_through(1, position, position));
  ASSERT_TRUE(windowed.kv->can_continue_at(1, position));
  ASSERT_TRUE(windowed.backend->copy_kv_from_host(1, host.data(), position));
  for (int i = 0; i < 20; ++i, ++position) {
    const int32_t next = argmax(b);
    a = windowed.run(1, std::span<const int32_t>(&next, 1), position);
    b = everything.run(0, std::span<const int32_t>(&next, 1), position);
    ASSERT_TRUE(same_bits(a, b)) << "after the swap, at " << position;
  }
}

// The fit preview counts the sliding layers' KV as their window (and a granule), not the context:
// a budget that holds 3 chats of full-context KV for every layer holds far longer ones.
TEST(KvWindow, FitCountsTheWindowLayersAsBounded) {
  test::TempModel model(window_spec(), "kv-window-fit");
  EngineOptions o;
  o.device = DeviceKind::Cpu;
  o.cpu_threads = 2;
  o.context_length = kContext;
  o.max_sequences = 3;
  o.vram_budget_bytes = 512ull << 20;
  const FitEstimate e = Engine::estimate(model.path, o);
  const uint64_t layer_bytes = 2 * 4 * 128 * kCpuKvElementBytes;
  EXPECT_EQ(e.kv_bytes_per_token, 6 * layer_bytes);
  EXPECT_EQ(e.kv_window_bytes_per_token, 5 * layer_bytes);
  EXPECT_EQ(e.kv_window_tokens, kWindow);
  // Up to the window every layer's KV counts; past it the global layer's only grows.
  EXPECT_EQ(e.kv_bytes_per_chat(kWindow), kWindow * 6 * layer_bytes);
  EXPECT_EQ(e.kv_bytes_per_chat(1000) - e.kv_bytes_per_chat(900), 100 * layer_bytes);
  EXPECT_LT(e.kv_bytes_per_chat(1000), 1000 * 6 * layer_bytes);
  // The longest context a share of the budget holds inverts it.
  for (const int64_t context : {int64_t{10}, kWindow, int64_t{500}, int64_t{5000}}) {
    const uint64_t bytes = e.kv_bytes_per_chat(context);
    EXPECT_GE(e.kv_context_for(bytes), context) << context;
    EXPECT_LT(e.kv_context_for(bytes - 1), context + 1) << context;
  }
  // Each chat's share of what the weights leave holds more tokens than full KV would.
  ASSERT_GT(e.budget_bytes, e.weights_bytes + e.workspace_bytes)
      << e.weights_bytes << " + " << e.workspace_bytes;
  const uint64_t rest = e.budget_bytes - e.weights_bytes - e.workspace_bytes;
  EXPECT_EQ(e.max_context_per_chat, std::min<int64_t>(e.kv_context_for(rest / 3), kContext));
  EXPECT_GT(e.kv_context_for(rest / 3), static_cast<int64_t>(rest / 3 / e.kv_bytes_per_token));
}

// Through the engine: turns of a Gemma-shaped chat continue from their kept KV, a turn that
// diverges near the end of the kept tokens reuses the common prefix (the slot still holds its
// window), one that diverges early is computed again (its window slid out); every turn's greedy
// tokens equal those of a fresh prefill.
std::vector<int32_t> fresh_tokens(const test::TempModel& model, const std::vector<TokenId>& prompt,
                                  int32_t max_tokens) {
  EngineOptions o = test::cpu_engine_options(kContext, 1);
  o.prefill_chunk_tokens = 128;
  o.kv_reuse = false;
  auto engine = Engine::open(model.path, o);
  test::Output out;
  engine->submit(test::chat_request({prompt, max_tokens}, out));
  test::run_to_idle(*engine);
  return out.tokens;
}

TEST(KvWindow, EngineReusesAPrefixOnlyWhileItsWindowIsHeld) {
  test::TempModel model(window_spec(), "kv-window-engine");
  EngineOptions o = test::cpu_engine_options(kContext, 2);
  o.prefill_chunk_tokens = 128;
  o.kv_reuse = true;
  auto engine = Engine::open(model.path, o);
  const int64_t vocab = 384;
  auto turn = [&](const std::vector<TokenId>& prompt, int32_t max_tokens) {
    test::Output out;
    engine->submit(test::chat_request({prompt, max_tokens}, out));
    test::run_to_idle(*engine);
    EXPECT_EQ(out.tokens, fresh_tokens(model, prompt, max_tokens));
    return out;
  };
  const std::vector<TokenId> p1 = prompt_tokens(400, vocab);
  const test::Output t1 = turn(p1, 30);
  EXPECT_EQ(t1.prompt_info.reused_tokens, 0);
  // The window part's KV stayed flat while the chat grew past it.
  const TelemetrySnapshot after = engine->telemetry();
  EXPECT_GT(after.kv.granules_unmapped, 0u);

  std::vector<TokenId> p2 = p1;
  p2.insert(p2.end(), t1.tokens.begin(), t1.tokens.end());
  const std::vector<TokenId> more = prompt_tokens(40, vocab - 7);
  p2.insert(p2.end(), more.begin(), more.end());
  const test::Output t2 = turn(p2, 30);
  EXPECT_EQ(t2.prompt_info.reused_tokens, 400 + 29);  // the whole of turn 1
  const auto kept = static_cast<int64_t>(p2.size()) + 29;

  // Diverging 10 tokens before the end of the kept KV: its window is still held.
  std::vector<TokenId> p3(p2.begin(), p2.end());
  p3.insert(p3.end(), t2.tokens.begin(), t2.tokens.end());
  p3.resize(static_cast<size_t>(kept - 10));
  p3.push_back(p3.back() == 5 ? 6 : 5);
  const test::Output t3 = turn(p3, 10);
  EXPECT_EQ(t3.prompt_info.reused_tokens, kept - 10);

  // Diverging at token 100: the window behind it was let go, the prompt is computed again.
  std::vector<TokenId> p4(p1.begin(), p1.begin() + 100);
  p4.push_back(p4.back() == 5 ? 6 : 5);
  const test::Output t4 = turn(p4, 10);
  EXPECT_EQ(t4.prompt_info.reused_tokens, 0);
}

// KvSpace alone, randomized: sequences on three slots grow by steps (map_through from their
// length), are cut back (truncate) and released, on a part that keeps every token beside one with
// a window of 40. Every token a sequence may still read keeps what was written to it (no granule
// under it was remapped), the window part stays within its bound, and the ledger matches.
TEST(KvWindow, RandomizedSlidingKeepsWhatTheWindowReadsAndTheLedger) {
  MemoryManager memory(uint64_t{1} << 30);
  const uint64_t g = 4096;
  KvGeometry geometry;
  geometry.parts = {{100, 0}, {300, 40}};
  geometry.bytes_per_token = 400;
  geometry.max_tokens = 2000;
  geometry.slots = 3;
  geometry.lookahead_tokens = 4;
  KvSpace kv(make_host_virtual_memory(g), geometry, memory);
  const uint64_t bound = ((40 + 4) * 300 + g - 1) / g * g + g;
  std::mt19937 rng(11);
  std::vector<int64_t> length(3, 0);
  // The byte a token holds in a part: its position and slot, written when it is computed.
  auto mark = [](int32_t slot, int64_t token) { return static_cast<uint8_t>(token * 7 + slot); };
  auto at = [&](int32_t slot, int part, int64_t token) {
    return kv.slot_base(slot) + kv.part_offset_bytes(part) +
           static_cast<uint64_t>(token * kv.part(part).bytes_per_token);
  };
  for (int op = 0; op < 4000; ++op) {
    const auto slot = static_cast<int32_t>(rng() % 3);
    const uint32_t kind = rng() % 20;
    int64_t& n = length[static_cast<size_t>(slot)];
    if (kind == 0) {
      kv.release(slot);
      n = 0;
    } else if (kind == 1 && n > 0) {
      // Cut back within the window (an edit the window still covers) when the slot holds it.
      const int64_t keep = std::max<int64_t>(0, n - static_cast<int64_t>(rng() % 30));
      if (kv.can_continue_at(slot, keep)) {
        kv.truncate(slot, keep);
        n = keep;
      }
    } else {
      const int64_t step = kind < 4 ? 1 + static_cast<int64_t>(rng() % 120) : 1;
      if (n + step > geometry.max_tokens) continue;
      ASSERT_TRUE(kv.map_through(slot, n + step, n));
      for (int64_t t = n; t < n + step; ++t)
        for (int part = 0; part < 2; ++part) *at(slot, part, t) = mark(slot, t);
      n += step;
      EXPECT_LE(kv.committed_bytes(slot, 1),
                std::max<uint64_t>(bound, (step + 44) * 300 / g * g + 2 * g));
    }
    ASSERT_TRUE(kv.can_continue_at(slot, n)) << "op " << op;
    // What continuing reads is intact: every token of the global part, the window's of the other.
    for (int64_t t = 0; t < n; ++t) ASSERT_EQ(*at(slot, 0, t), mark(slot, t)) << "op " << op;
    for (int64_t t = std::max<int64_t>(0, n + 1 - 40); t < n; ++t)
      ASSERT_EQ(*at(slot, 1, t), mark(slot, t)) << "op " << op << " token " << t;
    ASSERT_EQ(memory.bytes(MemoryCategory::KvCommitted), kv.stats().committed_bytes);
  }
  uint64_t committed = 0;
  for (int32_t s = 0; s < 3; ++s) committed += kv.committed_bytes(s);
  EXPECT_EQ(committed, kv.stats().committed_bytes);
  EXPECT_GT(kv.stats().granules_unmapped, 0u);
}

}  // namespace
}  // namespace granule
