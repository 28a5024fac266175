// Qwen3.5 hybrids (`qwen35`, `qwen35moe`; issue 37) on the CPU reference backend: the config
// and weight table as llama.cpp reads them; the Gated DeltaNet step against a direct
// double-precision evaluation; the recurrent state carried across steps (a prompt in one step,
// in chunks and token by token give the same logits; a step that does not continue the state
// is refused); the state's ledger category; and whole synthetic F32 files against llama.cpp's
// CPU logits and greedy tokens (tests/data/reference/<case>.txt, from
// tests/reference/make_llama_cpp_goldens.sh).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/delta_net.h"
#include "backends/cpu/thread_pool.h"
#include "granule/engine.h"
#include "granule/error.h"
#include "granule/gguf.h"
#include "granule/model_config.h"
#include "granule/testkit/gguf_writer.h"
#include "granule/testkit/synthetic_model.h"
#include "memory/memory_manager.h"
#include "support/engine_chats.h"
#include "support/model_runtime.h"
#include "support/reference_golden.h"
#include "support/temp_model.h"

namespace granule {
namespace {

namespace fs = std::filesystem;
using test::random_values;

// ---- config --------------------------------------------------------------------------------

TEST(Qwen35Config, ReadsTheHybridLayoutAsLlamaCppDoes) {
  test::TempModel file(SyntheticModelSpec::preset("tiny-qwen35"), "qwen35-config");
  const auto file_ptr = ModelFile::open(file.path);
  const ModelFile& model = *file_ptr;
  const ModelConfig c = ModelConfig::from_gguf(model);
  EXPECT_EQ(c.architecture, "qwen35");
  EXPECT_TRUE(c.is_hybrid());
  EXPECT_EQ(c.recurrent_layers, (std::vector<bool>{true, true, true, false, true}));
  // Only the attention layer keeps KV, at the start of each token's record.
  for (int64_t l : {0, 1, 2, 4}) EXPECT_EQ(c.kv_layer_elements(l), 0) << "layer " << l;
  EXPECT_EQ(c.kv_layer_elements(3), 2 * 2 * 32);
  EXPECT_EQ(c.kv_offset_elements(3), 0);
  EXPECT_EQ(c.rope_dims, 16);
  EXPECT_EQ(c.rope_sections, (std::array<int32_t, 4>{3, 3, 2, 0}));
  EXPECT_EQ(c.rope_ordering, RopeOrdering::NeoX);
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_EQ(c.delta_net.conv_channels(), 2 * 2 * 16 + 4 * 16);
  // KV for the one attention layer only; the state: 4 layers x (3 x 128 conv + 4 x 16² delta).
  EXPECT_EQ(c.kv_bytes_per_token(4), 1 * 2 * 2 * 32 * 4);
  EXPECT_EQ(c.recurrent_state_bytes(), 4 * (3 * 128 + 4 * 256) * 4);
  const WeightTable w = WeightTable::from_gguf(model, c);
  EXPECT_NE(w.layers[0].ssm_in, nullptr);
  EXPECT_EQ(w.layers[0].wq, nullptr);
  EXPECT_NE(w.layers[3].wq, nullptr);
  EXPECT_EQ(w.layers[3].ssm_in, nullptr);
  EXPECT_EQ(w.layers[3].wq->dims[1], 2 * 4 * 32) << "Q carries its gate";
}

TEST(Qwen35Config, MoeHasASharedExpertWithItsGate) {
  test::TempModel file(SyntheticModelSpec::preset("tiny-qwen35moe"), "qwen35moe-config");
  const auto file_ptr = ModelFile::open(file.path);
  const ModelFile& model = *file_ptr;
  const ModelConfig c = ModelConfig::from_gguf(model);
  EXPECT_TRUE(c.is_moe());
  EXPECT_EQ(c.moe.n_ff_shexp, 48);
  EXPECT_TRUE(c.moe.normalize_weights);
  const WeightTable w = WeightTable::from_gguf(model, c);
  for (const LayerWeights& l : w.layers) {
    EXPECT_NE(l.gate_shexp, nullptr);
    EXPECT_NE(l.shexp_gate, nullptr);
    EXPECT_EQ(l.ffn_norm->name.ends_with("post_attention_norm.weight"), true);
  }
}

TEST(Qwen35Config, RecurrentLayersKeyAndMissingSectionsAreRead) {
  SyntheticModelSpec spec = SyntheticModelSpec::preset("tiny-qwen35");
  GgufWriter w = build_synthetic_model(spec);
  w.set("qwen35.rope.dimension_sections", GgufValue::int_array(GgufType::INT32, {3, 3}));
  const fs::path bad = fs::temp_directory_path() / ("qwen35-bad-" + std::to_string(::getpid()));
  w.write(bad);
  EXPECT_THROW(ModelConfig::from_gguf(*ModelFile::open(bad)), FormatError);
  fs::remove(bad);
}

// ---- the Gated DeltaNet step against a double-precision evaluation ------------------------

TEST(DeltaNet, SequenceMatchesADirectEvaluation) {
  DeltaNetConfig d;
  d.conv_kernel = 4;
  d.state_size = 8;
  d.n_k_heads = 2;
  d.n_v_heads = 6;  // value head j reads key head j % 2
  d.inner_size = 48;
  const int64_t C = d.conv_channels(), S = d.state_size, n = 7;
  const float eps = 1e-6f;
  const std::vector<float> weight = random_values(C * d.conv_kernel, 1, 0.8f);
  const std::vector<float> mixed = random_values(n * C, 2, 1.5f);
  std::vector<float> beta = random_values(n * d.n_v_heads, 3, 1.0f);
  for (float& b : beta) b = 0.5f + 0.5f * b;  // in (0, 1)
  std::vector<float> g = random_values(n * d.n_v_heads, 4, 0.5f);
  for (float& x : g) x -= 0.6f;  // log decays below 0
  std::vector<float> conv_state = random_values(d.conv_state_floats(), 5, 1.0f);
  std::vector<float> delta_state = random_values(d.delta_state_floats(), 6, 0.3f);
  const std::vector<float> conv0 = conv_state, delta0 = delta_state;

  std::vector<float> conv_out(n * C), out(n * d.value_dim());
  cpu::ThreadPool pool(2);
  cpu::delta_net_sequence(d, weight.data(), mixed.data(), beta.data(), g.data(), n, eps,
                          conv_state.data(), delta_state.data(), conv_out.data(), out.data(), pool);

  // Direct: the convolution over [state | inputs], SiLU, L2 norms, the rule on S[i][j].
  const int64_t K = d.conv_kernel;
  std::vector<double> act(n * C);
  for (int64_t c = 0; c < C; ++c) {
    std::vector<double> window;
    for (int64_t i = 0; i < K - 1; ++i) window.push_back(conv0[c * (K - 1) + i]);
    for (int64_t t = 0; t < n; ++t) window.push_back(mixed[t * C + c]);
    for (int64_t t = 0; t < n; ++t) {
      double s = 0;
      for (int64_t i = 0; i < K; ++i) s += window[t + i] * weight[c * K + i];
      act[t * C + c] = s / (1 + std::exp(-s));
    }
    for (int64_t i = 0; i < K - 1; ++i)
      EXPECT_FLOAT_EQ(conv_state[c * (K - 1) + i], static_cast<float>(window[n + i]));
  }
  auto l2 = [&](double* x) {
    double s = 0;
    for (int64_t i = 0; i < S; ++i) s += x[i] * x[i];
    for (int64_t i = 0; i < S; ++i) x[i] /= std::sqrt(s + eps);
  };
  for (int64_t t = 0; t < n; ++t)
    for (int64_t h = 0; h < 2 * d.n_k_heads; ++h) l2(&act[t * C + h * S]);
  double worst = 0;
  for (int64_t j = 0; j < d.n_v_heads; ++j) {
    std::vector<double> M(S * S);  // M[i][col]
    for (int64_t i = 0; i < S; ++i)
      for (int64_t col = 0; col < S; ++col) M[i * S + col] = delta0[j * S * S + col * S + i];
    const int64_t kh = j % d.n_k_heads;
    for (int64_t t = 0; t < n; ++t) {
      const double* q = &act[t * C + kh * S];
      const double* k = &act[t * C + d.key_dim() + kh * S];
      const double* v = &act[t * C + 2 * d.key_dim() + j * S];
      const double decay = std::exp(g[t * d.n_v_heads + j]);
      for (double& m : M) m *= decay;
      for (int64_t col = 0; col < S; ++col) {
        double sk = 0;
        for (int64_t i = 0; i < S; ++i) sk += M[i * S + col] * k[i];
        const double dlt = (v[col] - sk) * beta[t * d.n_v_heads + j];
        for (int64_t i = 0; i < S; ++i) M[i * S + col] += k[i] * dlt;
      }
      for (int64_t col = 0; col < S; ++col) {
        double o = 0;
        for (int64_t i = 0; i < S; ++i) o += M[i * S + col] * q[i];
        o /= std::sqrt(static_cast<double>(S));
        worst = std::max(worst, std::fabs(o - out[t * d.value_dim() + j * S + col]));
      }
    }
    for (int64_t i = 0; i < S; ++i)
      for (int64_t col = 0; col < S; ++col)
        worst = std::max(worst, std::fabs(M[i * S + col] - delta_state[j * S * S + col * S + i]));
  }
  EXPECT_LT(worst, 1e-5);
}

// ---- the recurrent state across steps ------------------------------------------------------

struct CpuModel : test::ModelRuntime {
  explicit CpuModel(const fs::path& path) : ModelRuntime(path, test::cpu_runtime_options(2, 64)) {}
};

const std::vector<int32_t> kPrompt = {1, 45, 300, 7, 99, 256, 12, 3, 200, 150};
constexpr int kGreedy = 8;

class Qwen35State : public ::testing::TestWithParam<std::string> {};

// The last logits of a prompt run in one step, in chunks of 3 and token by token (each step
// resuming the state the previous one left) agree within f32 reordering; a second slot run
// beside keeps its own state.
TEST_P(Qwen35State, ChunksAndSingleTokensContinueTheState) {
  test::TempModel file(SyntheticModelSpec::preset(GetParam()), "qwen35-state");
  CpuModel m(file.path);
  const int64_t vocab = m.config.n_vocab;
  const std::vector<float> whole = m.run(0, kPrompt, 0, true);
  std::vector<float> chunked, single;
  for (size_t first = 0; first < kPrompt.size(); first += 3) {
    const size_t end = std::min(kPrompt.size(), first + 3);
    const std::vector<int32_t> part(kPrompt.begin() + first, kPrompt.begin() + end);
    const std::vector<float> rows = m.run(1, part, static_cast<int64_t>(first), true);
    chunked.insert(chunked.end(), rows.begin(), rows.end());
  }
  for (size_t i = 0; i < kPrompt.size(); ++i) {
    const std::vector<float> row = m.run(0, {kPrompt[i]}, static_cast<int64_t>(i), false);
    single.insert(single.end(), row.begin(), row.end());
  }
  ASSERT_EQ(whole.size(), chunked.size());
  ASSERT_EQ(whole.size(), single.size());
  for (size_t i = 0; i < whole.size(); ++i) {
    ASSERT_NEAR(chunked[i], whole[i], 1e-4f) << i / vocab;
    ASSERT_NEAR(single[i], whole[i], 1e-4f) << i / vocab;
  }
}

// A step must continue its slot's state where it ends (or start at 0): anything else is a
// caller's error, refused, never a silently wrong state.
TEST_P(Qwen35State, AStepThatDoesNotContinueTheStateIsRefused) {
  test::TempModel file(SyntheticModelSpec::preset(GetParam()), "qwen35-refuse");
  CpuModel m(file.path);
  m.run(0, {1, 2, 3, 4}, 0, false);
  EXPECT_THROW(m.run(0, {5}, 2, false), UsageError);
  EXPECT_THROW(m.run(1, {5}, 3, false), UsageError);
  EXPECT_NO_THROW(m.run(0, {5}, 4, false));
}

TEST_P(Qwen35State, TheStateIsItsOwnLedgerCategory) {
  test::TempModel file(SyntheticModelSpec::preset(GetParam()), "qwen35-ledger");
  CpuModel m(file.path);
  const auto slots = static_cast<uint64_t>(m.kv->geometry().slots);
  EXPECT_EQ(m.runtime.memory->bytes(MemoryCategory::RecurrentState),
            slots * static_cast<uint64_t>(m.config.recurrent_state_bytes()));
  EXPECT_EQ(memory_category_name(MemoryCategory::RecurrentState), "recurrent_state");
}

INSTANTIATE_TEST_SUITE_P(Synthetic, Qwen35State, ::testing::Values("tiny-qwen35", "tiny-qwen35moe"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// ---- the engine: a turn resumes the state snapshot its chat left -------------------------

std::vector<TokenId> pseudo_random_tokens(size_t n, uint32_t seed) {
  std::vector<TokenId> t(n);
  uint32_t x = seed;
  for (TokenId& v : t) {
    x = x * 1664525u + 1013904223u;
    v = static_cast<TokenId>(3 + (x >> 8) % 380);
  }
  return t;
}

std::vector<int32_t> engine_tokens(Engine& engine, const std::vector<TokenId>& prompt,
                                   int32_t max_tokens, PromptInfo* info = nullptr) {
  test::Output out;
  engine.submit(test::chat_request({prompt, max_tokens}, out));
  test::run_to_idle(engine);
  EXPECT_EQ(out.reason, FinishReason::MaxTokens) << out.error;
  if (info) *info = out.prompt_info;
  return out.tokens;
}

EngineOptions engine_options(bool reuse) {
  EngineOptions o = test::cpu_engine_options(512, 2);
  o.prefill_chunk_tokens = 16;  // prompts in several chunks: the state carries between them
  o.kv_reuse = reuse;
  return o;
}

// Turn 2 continues turn 1: it resumes from the state turn 1 left in its slot (reusing every
// computed token) and gives the greedy tokens of a fresh prefill. A turn that diverges inside
// the kept tokens cannot resume the state (it covers all of them) and recomputes from the start.
TEST_P(Qwen35State, ANextTurnResumesTheSnapshotOrRecomputes) {
  test::TempModel model(SyntheticModelSpec::preset(GetParam()), "qwen35-turns");
  auto engine = Engine::open(model.path, engine_options(true));
  auto fresh = Engine::open(model.path, engine_options(false));
  const std::vector<TokenId> p1 = pseudo_random_tokens(40, 1);
  PromptInfo info;
  const std::vector<int32_t> t1 = engine_tokens(*engine, p1, 12, &info);
  EXPECT_EQ(info.reused_tokens, 0);
  EXPECT_EQ(t1, engine_tokens(*fresh, p1, 12));

  std::vector<TokenId> p2 = p1;
  p2.insert(p2.end(), t1.begin(), t1.end());
  const std::vector<TokenId> more = pseudo_random_tokens(21, 2);
  p2.insert(p2.end(), more.begin(), more.end());
  const std::vector<int32_t> t2 = engine_tokens(*engine, p2, 12, &info);
  EXPECT_EQ(info.reused_tokens, 40 + 11);
  EXPECT_EQ(t2, engine_tokens(*fresh, p2, 12));

  std::vector<TokenId> p3(p2.begin(), p2.begin() + 30);
  p3.push_back(p2[30] == 5 ? 6 : 5);
  const std::vector<int32_t> t3 = engine_tokens(*engine, p3, 12, &info);
  EXPECT_EQ(info.reused_tokens, 0);
  EXPECT_EQ(t3, engine_tokens(*fresh, p3, 12));
}

// One slot: chat b takes chat a's slot, so a's kept KV goes to host memory with its recurrent
// state; a's next turn brings both back and continues from the snapshot exactly as a fresh
// prefill. Without a host allowance the KV and the state are dropped and recomputed.
TEST_P(Qwen35State, SwappedOutStateComesBackWithItsKv) {
  test::TempModel model(SyntheticModelSpec::preset(GetParam()), "qwen35-swap");
  EngineOptions o = engine_options(true);
  o.max_sequences = 1;
  auto engine = Engine::open(model.path, o);
  auto fresh = Engine::open(model.path, engine_options(false));
  const std::vector<TokenId> pa = pseudo_random_tokens(40, 21);
  const std::vector<int32_t> a1 = engine_tokens(*engine, pa, 12);
  PromptInfo info;
  engine_tokens(*engine, pseudo_random_tokens(30, 22), 6, &info);
  EXPECT_EQ(info.reused_tokens, 0);
  TelemetrySnapshot t = engine->telemetry();
  EXPECT_EQ(t.scheduler.kv_swap_outs, 1u);
  const ModelConfig config = ModelConfig::from_gguf(*ModelFile::open(model.path));
  const uint64_t kv_bytes = (40u + 11u) * static_cast<uint64_t>(config.kv_bytes_per_token(4));
  const auto state = static_cast<uint64_t>(t.device.ledger_bytes(MemoryCategory::RecurrentState));
  EXPECT_EQ(t.scheduler.swapped_kv_bytes, kv_bytes + state) << "the state went with the KV";

  std::vector<TokenId> pa2 = pa;
  pa2.insert(pa2.end(), a1.begin(), a1.end());
  const std::vector<TokenId> more = pseudo_random_tokens(17, 23);
  pa2.insert(pa2.end(), more.begin(), more.end());
  const std::vector<int32_t> a2 = engine_tokens(*engine, pa2, 12, &info);
  EXPECT_EQ(info.reused_tokens, 40 + 11);
  EXPECT_EQ(info.swapped_in_tokens, 40 + 11);
  EXPECT_EQ(engine->telemetry().scheduler.kv_swap_ins, 1u);
  EXPECT_EQ(a2, engine_tokens(*fresh, pa2, 12));

  o.kv_host_cache_bytes = 0;
  auto dropping = Engine::open(model.path, o);
  engine_tokens(*dropping, pa, 12);
  engine_tokens(*dropping, pseudo_random_tokens(30, 22), 6);
  EXPECT_EQ(engine_tokens(*dropping, pa2, 12, &info), a2);
  EXPECT_EQ(info.reused_tokens, 0);
  EXPECT_EQ(dropping->telemetry().scheduler.kv_swap_outs, 0u);
}

// The fit preview holds a recurrent state slot per chat beside the weights, and KV for the
// attention layers only; on the GPU (a plan, no GPU needed) the state slots are held beside the
// workspace too.
TEST(Qwen35Engine, FitEstimateCountsTheStateSlotsAndAttentionKvOnly) {
  test::TempModel model(SyntheticModelSpec::preset("tiny-qwen35"), "qwen35-fit");
  EngineOptions o = test::cpu_engine_options(256, 4);
  const FitEstimate e = Engine::estimate(model.path, o);
  EXPECT_EQ(e.recurrent_state_bytes_per_chat,
            static_cast<uint64_t>(e.config.recurrent_state_bytes()));
  EXPECT_EQ(e.kv_bytes_per_token, 1u * 2u * 2u * 32u * 4u);
  EXPECT_EQ(e.minimum_budget_bytes,
            e.weights_bytes + e.workspace_bytes + 4 * e.recurrent_state_bytes_per_chat);
#ifdef GRANULE_HAVE_CUDA
  o.device = DeviceKind::Cuda;
  o.vram_budget_bytes = 1ull << 30;
  const FitEstimate g = Engine::estimate(model.path, o);
  EXPECT_TRUE(g.gpu);
  EXPECT_EQ(g.recurrent_state_bytes_per_chat, e.recurrent_state_bytes_per_chat);
  EXPECT_GE(g.minimum_budget_bytes, g.workspace_bytes + 4 * g.recurrent_state_bytes_per_chat);
  EXPECT_GT(g.max_context_per_chat, 0);
#endif
}

// Twelve chats on eight slots with room for four granules of KV beside what the engine holds
// (its recurrent state slots among it): chats wait and running ones are preempted (recompute:
// the state restarts from nothing with the KV); each still gives its alone tokens.
TEST(Qwen35Engine, PreemptedChatsRecomputeTheirStateAndGiveTheirAloneTokens) {
  SyntheticModelSpec spec = SyntheticModelSpec::preset("tiny-qwen35");
  spec.n_layer = 6;  // delta and attention by turns: 3 x 8 KiB of f32 KV a token
  spec.full_attention_interval = 2;
  spec.n_head = spec.n_head_kv = 8;
  spec.head_dim = 128;
  spec.rope_dims = 32;
  spec.rope_sections = {6, 5, 5, 0};
  spec.context_length = 512;
  test::TempModel model(spec, "qwen35-preempt");
  std::mt19937_64 random(20261205);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(random() % static_cast<uint64_t>(hi - lo + 1));
  };
  std::vector<test::Chat> chats(12);
  for (test::Chat& c : chats) {
    c.prompt.resize(static_cast<size_t>(uniform(5, 200)));
    for (TokenId& t : c.prompt) t = static_cast<TokenId>(uniform(3, 383));
    c.max_tokens = static_cast<int32_t>(uniform(40, 120));
  }
  EngineOptions options = test::cpu_engine_options(512, 8);
  options.prefill_chunk_tokens = 96;
  const auto alone = test::tokens_alone(model.path, chats, options);

  const TelemetrySnapshot idle = Engine::open(model.path, options)->telemetry();
  const uint64_t state = idle.device.ledger_bytes(MemoryCategory::RecurrentState);
  EXPECT_GT(state, 0u);
  options.vram_budget_bytes = idle.device.used_bytes -
                              idle.device.ledger_bytes(MemoryCategory::KvCommitted) -
                              idle.device.ledger_bytes(MemoryCategory::KvPool) + 4 * (2ull << 20);
  auto engine = Engine::open(model.path, options);
  test::Outputs out;
  std::vector<SequenceId> ids;
  for (const test::Chat& c : chats) ids.push_back(engine->submit(test::chat_request(c, out)));
  test::run_to_idle(*engine);
  const TelemetrySnapshot end = engine->telemetry();
  EXPECT_GT(end.scheduler.preemptions, 0u);
  EXPECT_EQ(end.device.ledger_bytes(MemoryCategory::RecurrentState), state);
  for (size_t i = 0; i < chats.size(); ++i) {
    const test::Output& o = out[ids[i]];
    EXPECT_EQ(o.reason, FinishReason::MaxTokens) << "chat " << i << ": " << o.error;
    EXPECT_EQ(o.tokens, alone[i]) << "chat " << i;
  }
}

// ---- whole models against llama.cpp -------------------------------------------------------

// The presets, and "qwen35-sections": full attention every other layer, a rope whose fourth
// section (2 of 8 pairs) stays unrotated for text (a rope base of 100, so that those pairs
// would turn visibly), as many key heads as value heads.
SyntheticModelSpec golden_spec(const std::string& name) {
  if (name != "qwen35-sections") return SyntheticModelSpec::preset(name);
  SyntheticModelSpec s = SyntheticModelSpec::preset("tiny-qwen35");
  s.n_layer = 4;
  s.full_attention_interval = 2;
  s.rope_sections = {2, 2, 2, 2};
  s.ssm_n_k_heads = 4;
  s.ssm_n_v_heads = 4;
  s.rope_theta = 100.0f;  // low frequencies that turn visibly within the prompt
  s.seed = 37;
  return s;
}

class LlamaCppGolden : public ::testing::TestWithParam<std::string> {};

// llama.cpp's CPU (F32 KV, flash attention off) on the same file: the teacher-forced logits at
// every prompt position within f32 tolerance, and the 8 greedy tokens identical.
TEST_P(LlamaCppGolden, LogitsAndGreedyMatchLlamaCpp) {
  const std::string name = GetParam();
  test::TempModel file(golden_spec(name), name);
  test::ReferenceGolden g;
  ASSERT_NO_FATAL_FAILURE(test::load_reference_golden(name, file.path, kPrompt, g));
  CpuModel m(file.path);
  ASSERT_EQ(g.vocab, m.config.n_vocab);
  const auto [logits, greedy] = m.prompt_and_greedy(g.tokens, kGreedy);
  ASSERT_EQ(logits.size(), g.logits.size());
  const std::vector<double> diffs = test::expect_rows_near(logits, g, 1e-4, name);
  const double worst = diffs.empty() ? 0 : *std::max_element(diffs.begin(), diffs.end());
  std::cout << "[llama.cpp] " << name << ": max |logit - llama.cpp| " << worst
            << ", greedy identical: " << (greedy == g.greedy ? "yes" : "no") << "\n";
  EXPECT_EQ(greedy, g.greedy) << name;
}

INSTANTIATE_TEST_SUITE_P(Synthetic, LlamaCppGolden,
                         ::testing::Values("tiny-qwen35", "tiny-qwen35moe", "qwen35-sections"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace granule
