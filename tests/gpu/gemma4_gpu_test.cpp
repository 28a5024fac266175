// Gemma 4 (dense) on the GPU (issue 37): the CUDA backend against the CPU oracle (the CPU backend
// rounding as the GPU does: cpu_emulate_device_numerics) and the plain f32 CPU reference, on the
// tiny-gemma4 preset widened to shapes the GPU kernels run, its layers whole: 5 sliding layers
// (heads of 128 over 2 KV heads, half of each head rotated) then 1 global (heads of 256, or 512
// as in the real Gemma 4 files, over 1 KV head, a quarter rotated through rope_freqs' divisors,
// V = K: no attn_v), twice; Q/K norms
// and V RMS-normed without a weight, attention scale 1, sandwich norms, GeGLU, the last 2 layers
// reading the KV of the last earlier layer of their kind with an FFN twice as wide, per-layer
// embeddings of 64, a per-layer output scale and the final soft-cap 30; Q/K norm weights of
// about 0.3, so that the scores (attention scale 1) stay moderate as trained norms keep them.
// F32 weights, and Q8_0 / Q4_0 (the int8 products):
//   - a prefill of 64 rows (the matvec path) and 16 graph-captured decode steps past it, a
//     prefill of 2 x 150 rows (the cuBLAS path and the flash-attention prefill kernel) whose
//     rows' windows start past token 0, then decode at 300, and 6 chats decoding together (a
//     graph of 8 rows, two of them padding) at lengths below, at and past the window;
// each row within the bound oracle_compare.h derives, greedy tokens equal away from near-ties.
// The window is all that is read (the sliding layers' KV behind it overwritten with NaN leaves
// the logits identical to the bit), and with the window part's granules unmapped as the engine
// maps, the logits equal those of a run that keeps every token mapped. A shared-KV layer owns no
// KV: the bytes per token are those of the first 6 layers. The per-layer token table sits in
// pinned, mapped host memory (the ledger's HostPinned, outside the budget) and gives logits
// identical to the bit to the resident form; the fit preview's resident weights, workspace and
// pinned host bytes are the opened engine's ledger.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/moe_ffn.h"
#include "backends/cpu/thread_pool.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_moe.h"
#include "backends/cuda/device_memory.h"
#include "gpu_test_support.h"
#include "granule/engine.h"
#include "granule/gguf.h"
#include "granule/model_config.h"
#include "granule/telemetry.h"
#include "granule/testkit/synthetic_model.h"
#include "memory/kv_space.h"
#include "memory/memory_manager.h"
#include "memory/weight_layout.h"
#include "oracle_compare.h"
#include "quantize_activations.cuh"
#include "rms_norm.cuh"
#include "runtime/runtime.h"
#include "support/model_runtime.h"
#include "support/temp_model.h"

namespace granule {
namespace {

struct Gemma4Case {
  TensorType type;
  int64_t window;
  int64_t global_head = 256;  // 512: Gemma 4's real global layers (attention_wide)
  int64_t top_k = 2;          // the MoE form's experts per token, of 8 (gemma4_moe_spec)
};

SyntheticModelSpec gemma4_spec(const Gemma4Case& c) {
  SyntheticModelSpec s = SyntheticModelSpec::preset("tiny-gemma4");
  s.name = "tiny-gemma4-gpu";
  s.n_embd = 256;
  s.n_head = 4;
  s.n_head_kv = 1;  // global
  s.head_dim = c.global_head;
  s.n_head_kv_swa = 2;
  s.head_dim_swa = 128;
  s.rope_dims_swa = 64;
  s.n_ff = 512;
  s.n_ff_shared = 1024;
  s.n_embd_per_layer = 64;
  s.n_vocab = 1000;
  s.gemma4_qk_norm = 0.3f;  // scores of std ~1 to 1.5 (synthetic_model.h)
  s.sliding_window = c.window;
  s.weight_type = c.type;
  s.embedding_type = c.type;
  return s;
}

// Gemma 4's mixture-of-experts form (the 26B-A4B's layers) on the tiny-gemma4-moe preset widened
// as gemma4_spec() widens the dense one: GeGLU experts beside every dense FFN (8 experts of 64,
// the case's top-k of the file's softmax routing), their own norms, the router's input scale and
// each expert's output scale; no shared KV, no per-layer embeddings (as the 26B-A4B).
// The whole-model cases take top 6 (the 26B-A4B takes 8 of 128): with top 2 of 8 the expert at
// the boundary carries a third to a half of a token's experts, and whole-model comparisons of
// int8-reading files cannot pass by chance (ExpertsMatchTheCpuOracle says why); with top 6 a
// token rerouted on a near-tie swaps an expert of small weight, within the bound. F32 too: at
// top 2 its prefill of 2 x 150 (the f16 GEMM path) passed every row's bound on an H100 but
// flipped 31 greedy tokens within it against 20 allowed — rows where the oracle itself took
// another expert than the f32 reference, so their bound spans ~4 logit spreads (max |err|/spread
// 2.31 at err/bound 0.57). ExpertsMatchTheCpuOracle holds top 2 and top 6 (F32 to the bit).
SyntheticModelSpec gemma4_moe_spec(const Gemma4Case& c) {
  SyntheticModelSpec s = SyntheticModelSpec::preset("tiny-gemma4-moe");
  s.name = "tiny-gemma4-moe-gpu";
  s.n_embd = 256;
  s.n_head = 4;
  s.n_head_kv = 1;  // global
  s.head_dim = c.global_head;
  s.n_head_kv_swa = 2;
  s.head_dim_swa = 128;
  s.rope_dims_swa = 64;
  s.n_ff = 512;
  s.n_vocab = 1000;
  s.n_expert = 8;
  s.n_expert_used = c.top_k;
  s.n_ff_exp = 64;
  // Gemma 4's router reads rms_norm(x) / sqrt(n_embd) · ffn_gate_inp.scale (about 4): logits of
  // standard deviation ~0.25 with the writer's default router weights, where top-2 of 8 is a
  // near-tie on many rows and the int8 products' rounding reroutes them. Trained routers are
  // decisive: weights 8 times larger give logits of standard deviation ~2 (at 4, the F32
  // oracle still rerouted a row of 64 against the reference, and the window carried it 8 rows on).
  s.router_scale = 8.0f;
  s.gemma4_qk_norm = 0.3f;
  s.sliding_window = c.window;
  s.weight_type = c.type;
  s.embedding_type = c.type;
  s.expert_type = c.type;
  return s;
}

RuntimeOptions options(bool gpu, bool oracle, int64_t context = 512) {
  RuntimeOptions o;
  o.device = gpu ? DeviceKind::Cuda : DeviceKind::Cpu;
  o.backend.vram_budget_bytes = uint64_t{1} << 40;
  o.backend.cpu_emulate_device_numerics = oracle;
  o.backend.cpu_exact_numerics = !gpu;  // the CPU reference numerics
  o.backend.cpu_threads = 2;
  o.context_length = context;
  o.slots = 8;
  o.kv_pool_granules = 0;
  return o;
}

using Rig = test::ModelRuntime;
using test::random_tokens;

std::string case_name(const Gemma4Case& c) {
  return std::string(tensor_type_name(static_cast<uint32_t>(c.type))) + "_window" +
         std::to_string(c.window) + "_global" + std::to_string(c.global_head) +
         (c.top_k != 2 ? "_top" + std::to_string(c.top_k) : "");
}

std::string refusal_of(const SyntheticModelSpec& spec) {
  test::TempModel model(spec, "gemma4-refusal");
  auto file = ModelFile::open(model.path);
  const ModelConfig config = ModelConfig::from_gguf(*file);
  const WeightTable weights = WeightTable::from_gguf(*file, config);
  return cuda_model_refusal(config, weights);
}

class Gemma4Gpu : public ::testing::TestWithParam<Gemma4Case> {};

TEST_P(Gemma4Gpu, MatchesTheCpuOracle) {
  GRANULE_REQUIRE_GPU();
  const Gemma4Case& p = GetParam();
  test::TempModel model(gemma4_spec(p), "gemma4-gpu");
  Rig ref(model.path, options(false, false)), oracle(model.path, options(false, true)),
      gpu(model.path, options(true, false));
  const ModelConfig& c = gpu.config;
  // Every Gemma 4 feature the CUDA layers take is in the file.
  ASSERT_EQ(c.architecture, "gemma4");
  // tiny-gemma4's pattern of 6 over 8 layers: 0-4 and 6-7 slide, 5 is global; the 2 shared
  // layers (6, 7) read layer 4's KV (the last earlier sliding layer's).
  ASSERT_TRUE(c.layer_slides(0) && !c.layer_slides(5) && c.layer_slides(7));
  ASSERT_EQ(c.head_dim_of(0), 128);
  ASSERT_EQ(c.head_dim_of(5), p.global_head);
  ASSERT_NE(c.n_head_kv_of(0), c.n_head_kv_of(5));
  ASSERT_LT(c.rope_dims_of(0), c.head_dim_of(0));
  ASSERT_TRUE(c.value_norm && c.attention_scale == 1.0f);
  ASSERT_EQ(c.kv_source(6), 4);  // the shared sliding layer reads layer 4's KV
  ASSERT_EQ(c.kv_source(7), 4);
  ASSERT_NE(c.n_ff_of(7), c.n_ff_of(0));
  ASSERT_GT(c.n_embd_per_layer, 0);
  ASSERT_GT(c.final_logit_softcap, 0.0f);
  ASSERT_EQ(gpu.weights.layers[5].wv, nullptr);  // V = K on the global layers
  ASSERT_NE(gpu.weights.layers[5].out_scale, nullptr);
  const int64_t vocab = c.n_vocab;
  const std::string name = "gemma4 " + case_name(p);
  auto all3 = [&](const std::vector<BatchSequence>& batch, std::vector<float>& r,
                  std::vector<float>& o, std::vector<float>& g) {
    const std::vector<float> a = ref.step(batch), b = oracle.step(batch), d = gpu.step(batch, true);
    r.insert(r.end(), a.begin(), a.end());
    o.insert(o.end(), b.begin(), b.end());
    g.insert(g.end(), d.begin(), d.end());
  };
  // 64 prompt rows with every row's logits (matvec path), then 16 decode steps (graphs).
  {
    const std::vector<int32_t> prompt = random_tokens(64, vocab, 1);
    std::vector<float> r, o, g;
    all3({{0, prompt, 0, true}}, r, o, g);
    gpu_test::expect_close_to_oracle(r, o, g, vocab, name + " prefill 64", false);
    const std::vector<int32_t> next = random_tokens(16, vocab, 2);
    std::vector<float> r2, o2, g2;
    for (int i = 0; i < 16; ++i)
      all3({{0, std::span<const int32_t>(&next[static_cast<size_t>(i)], 1), 64 + i, false}}, r2, o2,
           g2);
    gpu_test::expect_close_to_oracle(r2, o2, g2, vocab, name + " decode (graphs)", false);
    EXPECT_GT(gpu.graphs().replays, 0u);
  }
  // 150 prompt rows (the cuBLAS path and the flash prefill kernel), then 150 more on the same
  // chat: its rows' windows start past token 0 with either window.
  {
    const std::vector<int32_t> prompt = random_tokens(300, vocab, 3);
    std::vector<float> r, o, g;
    all3({{1, std::span<const int32_t>(prompt.data(), 150), 0, true}}, r, o, g);
    all3({{1, std::span<const int32_t>(prompt.data() + 150, 150), 150, true}}, r, o, g);
    // The f16 GEMM operands round as the oracle's int8 blocks do not (oracle_compare.h).
    gpu_test::expect_close_to_oracle(r, o, g, vocab, name + " prefill 2 x 150", true);
    const std::vector<int32_t> next = random_tokens(4, vocab, 4);
    std::vector<float> r2, o2, g2;
    for (int i = 0; i < 4; ++i)
      all3({{1, std::span<const int32_t>(&next[static_cast<size_t>(i)], 1), 300 + i, false}}, r2,
           o2, g2);
    gpu_test::expect_close_to_oracle(r2, o2, g2, vocab, name + " decode at 300", false);
  }
  // Six chats at different lengths (below, at and past the window) decoding together.
  {
    std::vector<int64_t> lengths;
    for (int s = 0; s < 6; ++s) {
      const int n = 3 + 29 * s;
      const std::vector<int32_t> prompt = random_tokens(n, vocab, 10 + s);
      for (Rig* rig : {&ref, &oracle, &gpu}) rig->step({{2 + s, prompt, 0, false}}, rig == &gpu);
      lengths.push_back(n);
    }
    std::vector<float> r, o, g;
    for (int step = 0; step < 6; ++step) {
      const std::vector<int32_t> next = random_tokens(6, vocab, 100 + step);
      std::vector<BatchSequence> batch;
      for (int s = 0; s < 6; ++s)
        batch.push_back({2 + s, std::span<const int32_t>(&next[static_cast<size_t>(s)], 1),
                         lengths[static_cast<size_t>(s)] + step, false});
      all3(batch, r, o, g);
    }
    gpu_test::expect_close_to_oracle(r, o, g, vocab, name + " batched decode of 6", false);
  }
}

// The mixture-of-experts form (26B-A4B) against the CPU oracle: the dense FFN and the experts
// side by side from the same residual, each with its own norms, the router on its own normed and
// scaled input, the experts' GeGLU in the MoE kernels: a 64-row prefill (the matvec path and the
// grouped tensor-core / dp4a experts), 16 graph-captured decode steps (the per-pair decode
// kernels), a prefill of 2 x 150 rows (the GEMM path), decode at 300, and 6 chats decoding together
// (a graph of 8 rows: the grouped experts); each row within the oracle's bound (a rerouted token
// excused as oracle_compare.h says), greedy tokens equal away from near-ties.
class Gemma4MoeGpu : public ::testing::TestWithParam<Gemma4Case> {};

TEST_P(Gemma4MoeGpu, MatchesTheCpuOracle) {
  GRANULE_REQUIRE_GPU();
  const Gemma4Case& p = GetParam();
  test::TempModel model(gemma4_moe_spec(p), "gemma4-moe-gpu");
  Rig ref(model.path, options(false, false)), oracle(model.path, options(false, true)),
      gpu(model.path, options(true, false));
  const ModelConfig& c = gpu.config;
  ASSERT_EQ(c.architecture, "gemma4");
  ASSERT_TRUE(c.is_moe());
  ASSERT_EQ(c.activation, FfnActivation::GeluTanh);
  ASSERT_TRUE(c.layer_slides(0) && !c.layer_slides(5));
  for (const LayerWeights& l : gpu.weights.layers) {
    ASSERT_NE(l.w_gate, nullptr);  // the dense FFN beside the experts
    ASSERT_NE(l.router_in_scale, nullptr);
    ASSERT_NE(l.down_exps_scale, nullptr);
    ASSERT_NE(l.ffn_pre_norm_2, nullptr);
    ASSERT_NE(l.ffn_post_norm_1, nullptr);
    ASSERT_NE(l.ffn_post_norm_2, nullptr);
  }
  const int64_t vocab = c.n_vocab;
  const std::string name = "gemma4-moe " + case_name(p);
  auto all3 = [&](const std::vector<BatchSequence>& batch, std::vector<float>& r,
                  std::vector<float>& o, std::vector<float>& g) {
    const std::vector<float> a = ref.step(batch), b = oracle.step(batch), d = gpu.step(batch, true);
    r.insert(r.end(), a.begin(), a.end());
    o.insert(o.end(), b.begin(), b.end());
    g.insert(g.end(), d.begin(), d.end());
  };
  {
    const std::vector<int32_t> prompt = random_tokens(64, vocab, 1);
    std::vector<float> r, o, g;
    all3({{0, prompt, 0, true}}, r, o, g);
    gpu_test::expect_close_to_oracle(r, o, g, vocab, name + " prefill 64", true);
    const std::vector<int32_t> next = random_tokens(16, vocab, 2);
    std::vector<float> r2, o2, g2;
    for (int i = 0; i < 16; ++i)
      all3({{0, std::span<const int32_t>(&next[static_cast<size_t>(i)], 1), 64 + i, false}}, r2, o2,
           g2);
    gpu_test::expect_close_to_oracle(r2, o2, g2, vocab, name + " decode (graphs)", true);
    EXPECT_GT(gpu.graphs().replays, 0u);
  }
  {
    const std::vector<int32_t> prompt = random_tokens(300, vocab, 3);
    std::vector<float> r, o, g;
    all3({{1, std::span<const int32_t>(prompt.data(), 150), 0, true}}, r, o, g);
    all3({{1, std::span<const int32_t>(prompt.data() + 150, 150), 150, true}}, r, o, g);
    gpu_test::expect_close_to_oracle(r, o, g, vocab, name + " prefill 2 x 150", true);
    const std::vector<int32_t> next = random_tokens(4, vocab, 4);
    std::vector<float> r2, o2, g2;
    for (int i = 0; i < 4; ++i)
      all3({{1, std::span<const int32_t>(&next[static_cast<size_t>(i)], 1), 300 + i, false}}, r2,
           o2, g2);
    gpu_test::expect_close_to_oracle(r2, o2, g2, vocab, name + " decode at 300", true);
  }
  {
    // The prompts go in chunks of at most 64 tokens (the matvec path, the oracle's numerics): a
    // prompt prefilled whole past 64 takes the f16 GEMM path, whose operand rounding the oracle
    // does not model, and a token it reroutes on a near-tie stays in the window's KV for every
    // decode step after (section 2 holds that path to its own allowance).
    std::vector<int64_t> lengths;
    for (int s = 0; s < 6; ++s) {
      const int n = 3 + 29 * s;
      const std::vector<int32_t> prompt = random_tokens(n, vocab, 10 + s);
      for (int at = 0; at < n; at += 64) {
        const std::span<const int32_t> chunk(prompt.data() + at,
                                             static_cast<size_t>(std::min(64, n - at)));
        for (Rig* rig : {&ref, &oracle, &gpu}) rig->step({{2 + s, chunk, at, false}}, rig == &gpu);
      }
      lengths.push_back(n);
    }
    std::vector<float> r, o, g;
    for (int step = 0; step < 6; ++step) {
      const std::vector<int32_t> next = random_tokens(6, vocab, 100 + step);
      std::vector<BatchSequence> batch;
      for (int s = 0; s < 6; ++s)
        batch.push_back({2 + s, std::span<const int32_t>(&next[static_cast<size_t>(s)], 1),
                         lengths[static_cast<size_t>(s)] + step, false});
      all3(batch, r, o, g);
    }
    gpu_test::expect_close_to_oracle(r, o, g, vocab, name + " batched decode of 6", true);
  }
}

// The GPU against itself: chats decoding together give each chat the logits it gets decoding
// alone (the same file, the same prefills, two engines), within the summation tolerance
// (oracle_compare.h's 1e-3 of the spread: F32 runs the same kernels per row at every batch size
// but the attention's split sizes may differ). Chats 0-7 of 3 + 29 s tokens prefilled whole (past
// 64 tokens on the GEMM path), chats 8-10 of 90, 119 and 148 tokens prefilled in chunks of 40
// (the matvec path), after a chat of 300 tokens decoded past its window part's first granule (the
// history of MatchesTheCpuOracle's batched decode). Batches of 2, 3, 4, 6 and 8 chats (a graph of 8
// rows, two of them padding, for 6), the 6 in reverse order (whether a fault follows the row or the
// chat), the two long ones alone together (2 rows: the per-pair expert kernels), and the short ones
// beside the chunk-prefilled long ones; with graphs and early launch as the engine runs them, then
// without graphs, then without early launch (programmatic dependent launch), so that a failure says
// which of them it needs. Printed per batch: the worst row and the chats past the tolerance.
TEST_P(Gemma4MoeGpu, BatchedDecodeMatchesEachChatDecodedAlone) {
  GRANULE_REQUIRE_GPU();
  const Gemma4Case& p = GetParam();
  if (p.type != TensorType::F32)
    GTEST_SKIP() << "F32 only: int8 experts take other kernel families at 1 and 8 rows";
  test::TempModel model(gemma4_moe_spec(p), "gemma4-moe-batched");
  struct Mode {
    const char* name;
    bool graphs, early_launch;
  };
  constexpr int kWhole = 8, kChats = 11;
  size_t failures = 0;
  for (const Mode& mode : {Mode{"graphs, early launch", true, true}, Mode{"no graphs", false, true},
                           Mode{"no early launch", true, false}}) {
    RuntimeOptions o = options(true, false);
    o.slots = kChats + 1;
    o.backend.cuda_graphs = mode.graphs;
    kernels::KernelConfig kc = gpu_test::kernel_config();
    kc.early_launch = kc.early_launch && mode.early_launch;
    o.backend.kernel_config = kc;
    Rig together(model.path, o), alone(model.path, o);
    const int64_t vocab = together.config.n_vocab;
    // MatchesTheCpuOracle's history before its batched decode: a chat prefilled in 2 x 150 rows
    // and decoded past 300 tokens, where its window part lets its first granule go.
    const std::vector<int32_t> long_prompt = random_tokens(300, vocab, 3);
    for (int at = 0; at < 300; at += 150)
      for (Rig* rig : {&together, &alone})
        rig->step({{kChats, std::span<const int32_t>(long_prompt.data() + at, 150), at, true}},
                  true);
    const std::vector<int32_t> long_next = random_tokens(4, vocab, 4);
    for (int i = 0; i < 4; ++i)
      for (Rig* rig : {&together, &alone})
        rig->step({{kChats, std::span<const int32_t>(&long_next[static_cast<size_t>(i)], 1),
                    300 + i, false}},
                  true);
    std::vector<int64_t> lengths;
    for (int s = 0; s < kChats; ++s) {
      const int n = s < kWhole ? 3 + 29 * s : 90 + 29 * (s - kWhole);
      const std::vector<int32_t> prompt = random_tokens(n, vocab, 10 + s);
      const int chunk = s < kWhole ? n : 40;
      for (int at = 0; at < n; at += chunk) {
        const std::span<const int32_t> part(prompt.data() + at,
                                            static_cast<size_t>(std::min(chunk, n - at)));
        together.step({{s, part, at, false}}, true);
        alone.step({{s, part, at, false}}, true);
      }
      lengths.push_back(n);
    }
    const std::vector<std::vector<int>> batches = {{0, 1},
                                                   {0, 1, 2},
                                                   {0, 1, 2, 3},
                                                   {0, 1, 2, 3, 4, 5},
                                                   {5, 4, 3, 2, 1, 0},
                                                   {4, 5},
                                                   {0, 1, 2, 3, 4, 5, 6, 7},
                                                   {0, 1, 2, 8, 9, 10}};
    uint32_t seed = 500;
    for (const std::vector<int>& chats : batches) {
      double worst = 0;
      std::string past;
      for (int step = 0; step < 2; ++step) {
        const std::vector<int32_t> next = random_tokens(kChats, vocab, seed++);
        std::vector<BatchSequence> batch;
        for (const int c : chats)
          batch.push_back({c, std::span<const int32_t>(&next[static_cast<size_t>(c)], 1),
                           lengths[static_cast<size_t>(c)], false});
        const std::vector<float> t = together.step(batch, true);
        ASSERT_EQ(t.size(), chats.size() * static_cast<size_t>(vocab));
        for (size_t r = 0; r < chats.size(); ++r) {
          const std::vector<float> a = alone.step({batch[r]}, true);
          const float* row = t.data() + static_cast<int64_t>(r) * vocab;
          const double err = gpu_test::centred_error(row, a.data(), vocab,
                                                     gpu_test::spread_of(a.data(), vocab).std);
          worst = std::max(worst, err);
          if (!(err <= gpu_test::kSummationTolerance)) {
            ++failures;
            past += " row " + std::to_string(r) + " (chat " + std::to_string(chats[r]) + ", " +
                    std::to_string(lengths[static_cast<size_t>(chats[r])]) + " tokens) " +
                    std::to_string(err);
          }
        }
        for (const int c : chats) ++lengths[static_cast<size_t>(c)];
      }
      std::string names;
      for (const int c : chats) names += (names.empty() ? "" : ",") + std::to_string(c);
      std::cout << "[gemma4-moe batched] " << case_name(p) << " " << mode.name << ", chats "
                << names << ": worst |err|/spread " << worst
                << (past.empty() ? "" : ", past 1e-3:" + past) << "\n";
    }
    std::cout << "[gemma4-moe batched] " << mode.name << ": KV granules unmapped behind windows "
              << together.kv->stats().granules_unmapped << "\n";
    if (mode.graphs) EXPECT_GT(together.graphs().replays, 0u) << mode.name;
  }
  EXPECT_EQ(failures, 0u) << "chats decoding together differ from the same chats decoding alone";
}

// The experts alone (the opened engine's CudaMoe, every layer): runs of 2 to 64 rows give each
// row the experts' sum a run of that row alone gives. Rows 6 and 7 are padding (slot -1, inputs
// far from the others'), as in the decode graph of 6 chats. F32 experts take the same dp4a/float
// family per pair at every run length (moe.cu): equal to the bit. Quantised ones take the tiled
// or tensor-core products from 8 rows and the warp-per-row ones alone, which differ in f32
// summation order (and so, rarely, in an int8 rounding of the activation between gate/up and
// down): within 1e-2 of the row's largest value, where a wrong expert or a lost pair is of its
// order. The router reads its own input rows (Gemma 4's), the experts theirs, as
// cuda_gemma4.cpp passes them. Printed: the worst difference over the row's largest value.
TEST_P(Gemma4MoeGpu, ExpertsOfSeveralRowsEqualEachRowAlone) {
  GRANULE_REQUIRE_GPU();
  const Gemma4Case& p = GetParam();
  test::TempModel model(gemma4_moe_spec(p), "gemma4-moe-experts");
  Rig gpu(model.path, options(true, false));
  auto& backend = dynamic_cast<cuda::CudaBackend&>(*gpu.backend);
  cuda::CudaMoe& moe = *backend.model().moe();
  const kernels::KernelConfig& kc = backend.model().kernel_config();
  cudaStream_t stream = backend.model().stream();
  const int n = static_cast<int>(gpu.config.n_embd);
  constexpr int kRows = 64;
  std::mt19937 rng(77);
  std::vector<float> router_in = gpu_test::random_floats(kRows * static_cast<size_t>(n), rng, 0.1f);
  std::vector<float> expert_in = gpu_test::random_floats(kRows * static_cast<size_t>(n), rng);
  std::vector<int32_t> slot_of(kRows);
  for (int r = 0; r < kRows; ++r) slot_of[static_cast<size_t>(r)] = r == 6 || r == 7 ? -1 : r % 8;
  for (int i = 0; i < 2 * n; ++i)  // the padding rows
    expert_in[static_cast<size_t>(6 * n + i)] = router_in[static_cast<size_t>(6 * n + i)] = 30.0f;
  const gpu_test::DeviceArray<float> router_x(router_in), x(expert_in);
  const gpu_test::DeviceArray<int8_t> qs(kRows * static_cast<size_t>(n));
  const gpu_test::DeviceArray<float2> ds(kRows * static_cast<size_t>(n / 32));
  CUDA_OK(kernels::launch_quantize_q8(x.get(), kRows, n, {qs.get(), ds.get()}, kc, stream));
  const gpu_test::DeviceArray<int32_t> slots(slot_of);
  const bool exact = p.type == TensorType::F32;
  int compared = 0, differ = 0;
  double worst_ratio = 0;
  std::string where;
  for (int64_t layer = 0; layer < gpu.config.n_layer; ++layer) {
    auto run = [&](int first, int rows) {
      gpu_test::DeviceArray<float> out(std::vector<float>(static_cast<size_t>(rows * n), 0.0f));
      const kernels::ActivationQ8 q{qs.get() + first * n, ds.get() + first * (n / 32)};
      moe.forward(static_cast<int>(layer), rows, x.get() + first * n, q, slots.get() + first,
                  out.get(), kc, stream, nullptr, router_x.get() + first * n);
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      return out.download();
    };
    std::vector<std::vector<float>> alone;
    for (int r = 0; r < kRows; ++r) alone.push_back(run(r, 1));
    for (const int rows : {2, 3, 4, 6, 8, 16, 64}) {
      const std::vector<float> together = run(0, rows);
      for (int r = 0; r < rows; ++r) {
        if (r == 6 || r == 7) continue;  // padding
        const float* a = alone[static_cast<size_t>(r)].data();
        const float* b = together.data() + static_cast<int64_t>(r) * n;
        float largest = 0, worst = 0;
        for (int i = 0; i < n; ++i) {
          largest = std::max(largest, std::fabs(a[i]));
          worst = std::max(worst, std::fabs(a[i] - b[i]));
        }
        ++compared;
        worst_ratio = std::max(worst_ratio, static_cast<double>(worst / largest));
        const bool same = exact ? std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0
                                : worst <= 1e-2f * largest;
        if (!same && ++differ <= 12)
          where += " layer " + std::to_string(layer) + " run " + std::to_string(rows) + " row " +
                   std::to_string(r) + " (" + std::to_string(worst / largest) + ")";
      }
    }
  }
  std::cout << "[gemma4-moe experts] " << case_name(p) << ": " << compared
            << " rows compared, worst " << worst_ratio << " of the row's largest, " << differ
            << " differ" << (where.empty() ? "" : ":" + where) << "\n";
  EXPECT_EQ(differ, 0) << "a row's experts depend on the rows run beside it";
}

// The experts alone against the CPU oracle on the same inputs, with top 2 and top 6 of the 8
// experts whatever the case's top-k (CudaMoe built from the file as
// MoeSharedExpertGpu.MatchesTheCpuOracle builds it, no engine): for every layer, 64 residual rows
// normed on the device as cuda_gemma4.cpp norms them (the router's input by its folded norm weight,
// the experts' by pre_ffw_norm_2 into f32 and int8 blocks), then runs of 1, 5 (the per-pair
// kernels), 8, 24 and 64 rows (grouped: the tensor-core products for the quantised files) through
// CudaMoe::forward, and the same f32 rows through cpu::MoeFfn rounding as the kernels round (the
// router's input given, the experts' int8 input by the RMSNorm kernel's rule, h by division, the
// expert scale folded into the routing weight). Why this and not only the whole model: with
// int8-reading products, whole-model comparisons cannot tell a defect here from chance. On the CPU
// alone, the oracle with every product's output moved by 1e-7 of itself (as f32 summation order
// moves it) flips int8 roundings whose effect grows within 3 layers into a ~1 % difference of the
// residual (the int8 rounding noise drawn afresh), and top-2-of-8 tokens on near-ties (gaps of 2 %
// of the logits' spread) take another expert: the Q4_0 file's prefill of 64 then puts 26-29 rows
// past the bound (max |err|/spread 2.11, err/bound 7.42) in 3 seeds of 6 — what an H100 showed —
// and Q8_0's 1-15. With the inputs shared, the router's logits differ by summation order only and a
// row by an int8 rounding of h at most: on the CPU the oracle against itself so perturbed stays
// within 3e-3 of a row's largest value (Q4_0; F32 2e-4), where a wrong expert, scale or lost pair
// is of its order. Bound: 1e-2 of the row's largest (F32: 1e-3), up to 1 row in 16 past it (a
// near-tie of the logits' summation order). Printed: the worst difference over the row's largest
// value.
TEST_P(Gemma4MoeGpu, ExpertsMatchTheCpuOracle) {
  GRANULE_REQUIRE_GPU();
  const bool exact = GetParam().type == TensorType::F32;
  const double tolerance = exact ? 1e-3 : 1e-2;
  constexpr int kRows = 64;
  for (const int64_t top_k : {int64_t{2}, int64_t{6}}) {
    Gemma4Case p = GetParam();
    p.top_k = top_k;
    SCOPED_TRACE("top " + std::to_string(top_k));
    test::TempModel model(gemma4_moe_spec(p), "gemma4-moe-experts-oracle");
    auto file = ModelFile::open(model.path);
    const ModelConfig config = ModelConfig::from_gguf(*file);
    const WeightTable weights = WeightTable::from_gguf(*file, config);
    ASSERT_EQ(config.moe.n_expert_used, top_k);
    ASSERT_EQ(cuda::CudaMoe::refusal(config, weights), "");
    MemoryManager memory(uint64_t{1} << 40);
    cuda::CudaStream stream;
    const kernels::KernelConfig kc = gpu_test::kernel_config();
    cuda::CudaMoe moe(config, weights, memory, kRows, uint64_t{1} << 40, stream.get());
    const int n = static_cast<int>(config.n_embd);
    const size_t values = static_cast<size_t>(kRows) * static_cast<size_t>(n);
    std::mt19937 rng(91);
    const gpu_test::DeviceArray<float> x(gpu_test::random_floats(values, rng, 4.0f));
    const gpu_test::DeviceArray<float> router_in(values), expert_in(values);
    const gpu_test::DeviceArray<int8_t> qs(values);
    const gpu_test::DeviceArray<float2> ds(values / kernels::kQ8Block);
    const kernels::ActivationQ8 xq{qs.get(), ds.get()};
    std::vector<int32_t> slot_of(kRows);
    for (int r = 0; r < kRows; ++r) slot_of[static_cast<size_t>(r)] = r % 8;
    const gpu_test::DeviceArray<int32_t> slots(slot_of);
    cpu::ThreadPool pool(2);
    double worst_ratio = 0;
    int compared = 0, failing_runs = 0;
    std::string where;
    for (int64_t layer = 0; layer < config.n_layer; ++layer) {
      const cuda::CudaMoe::Gemma4Layer& g = moe.gemma4_layer(layer);
      kernels::RmsNormOutputs router;
      router.f32 = router_in.get();
      CUDA_OK(kernels::launch_rms_norm(x.get(), g.router_norm, kRows, n, config.rms_eps, router, kc,
                                       stream.get()));
      kernels::RmsNormOutputs experts;
      experts.f32 = expert_in.get();
      experts.q8 = xq;
      CUDA_OK(kernels::launch_rms_norm(x.get(), g.pre_norm, kRows, n, config.rms_eps, experts, kc,
                                       stream.get()));
      CUDA_OK(cudaStreamSynchronize(stream.get()));
      const std::vector<float> router_host = router_in.download(),
                               expert_host = expert_in.download();
      const LayerWeights& lw = weights.layers[static_cast<size_t>(layer)];
      for (const int rows : {1, 5, 8, 24, 64}) {
        const gpu_test::DeviceArray<float> out(
            std::vector<float>(static_cast<size_t>(rows) * static_cast<size_t>(n), 0.0f));
        moe.forward(static_cast<int>(layer), rows, expert_in.get(), xq, slots.get(), out.get(), kc,
                    stream.get(), nullptr, router_in.get());
        CUDA_OK(cudaStreamSynchronize(stream.get()));
        const std::vector<float> gpu = out.download();
        cpu::MoeFfn ffn(config, lw);
        std::vector<float> want(gpu.size());
        ffn.run(expert_host.data(), rows, want.data(), pool,
                {.emulate_device = true, .router_input = router_host.data()}, nullptr);
        int past = 0;
        for (int r = 0; r < rows; ++r) {
          const float* a = want.data() + static_cast<int64_t>(r) * n;
          const float* b = gpu.data() + static_cast<int64_t>(r) * n;
          double largest = 0, worst = 0;
          for (int i = 0; i < n; ++i) {
            largest = std::max(largest, static_cast<double>(std::fabs(a[i])));
            const double e = std::fabs(static_cast<double>(a[i]) - b[i]);
            worst = std::isnan(e) ? INFINITY : std::max(worst, e);
          }
          ++compared;
          worst_ratio = std::max(worst_ratio, worst / largest);
          if (!(worst <= tolerance * largest)) {
            ++past;
            if (where.size() < 400)
              where += " layer " + std::to_string(layer) + " run " + std::to_string(rows) +
                       " row " + std::to_string(r) + " (" + std::to_string(worst / largest) + ")";
          }
        }
        if (past > rows / 16) ++failing_runs;
      }
    }
    std::cout << "[gemma4-moe experts vs oracle] " << case_name(p) << ": " << compared
              << " rows compared, worst " << worst_ratio << " of the row's largest, runs past "
              << failing_runs << (where.empty() ? "" : ", rows past the bound:" + where) << "\n";
    EXPECT_EQ(failing_runs, 0) << "the experts differ from the CPU oracle's on the same inputs";
  }
}

INSTANTIATE_TEST_SUITE_P(Types, Gemma4MoeGpu,
                         ::testing::Values(Gemma4Case{TensorType::F32, 8, 256, 6},
                                           Gemma4Case{TensorType::Q8_0, 128, 512, 6},
                                           Gemma4Case{TensorType::Q4_0, 8, 256, 6}),
                         [](const ::testing::TestParamInfo<Gemma4Case>& i) {
                           return case_name(i.param);
                         });

// Overwrites with NaN (f16 0xFFFF) the K and V of every sliding layer that keeps KV, for tokens
// [0, end) of `slot` on the device (each layer's own width: Gemma 4's kinds differ).
void poison_behind(Rig& rig, int32_t slot, int64_t end) {
  const ModelConfig& c = rig.config;
  const KvSpace& kv = *rig.kv;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (!c.layer_slides(l) || c.kv_layer_elements(l) == 0) continue;
    const int part = c.kv_part(l);
    const int64_t stride = kv.part(part).bytes_per_token;
    const auto layer_bytes = static_cast<size_t>(c.kv_layer_elements(l) * 2);  // K, V in f16
    uint8_t* first = kv.slot_base(slot) + kv.part_offset_bytes(part) + c.kv_offset_elements(l) * 2;
    for (int64_t t = 0; t < end; ++t)
      ASSERT_EQ(cudaMemset(first + t * stride, 0xFF, layer_bytes), cudaSuccess);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

TEST_P(Gemma4Gpu, ReadsOnlyTheWindow) {
  GRANULE_REQUIRE_GPU();
  const Gemma4Case& p = GetParam();
  test::TempModel model(gemma4_spec(p), "gemma4-gpu-window");
  Rig gpu(model.path, options(true, false));
  const int64_t vocab = gpu.config.n_vocab, w = p.window;
  ASSERT_EQ(gpu.config.sliding_window, w);
  const std::vector<int32_t> prompt = random_tokens(300, vocab, 7);
  std::vector<float> intact, poisoned;
  for (int32_t slot : {0, 1})
    gpu.step({{slot, std::span<const int32_t>(prompt.data(), 150), 0, false}});
  poison_behind(gpu, 1, 151 - w);
  for (int32_t slot : {0, 1}) {
    std::vector<float>& out = slot == 0 ? intact : poisoned;
    const std::vector<float> l =
        gpu.step({{slot, std::span<const int32_t>(prompt.data() + 150, 150), 150, true}});
    out.insert(out.end(), l.begin(), l.end());
  }
  poison_behind(gpu, 1, 301 - w);
  for (int32_t slot : {0, 1}) {
    std::vector<float>& out = slot == 0 ? intact : poisoned;
    const std::vector<int32_t> chunk = random_tokens(40, vocab, 8);
    const std::vector<float> l = gpu.step({{slot, chunk, 300, true}});
    out.insert(out.end(), l.begin(), l.end());
  }
  const std::vector<int32_t> next = random_tokens(8, vocab, 9);
  for (int i = 0; i < 8; ++i) {
    poison_behind(gpu, 1, 341 + i - w);
    for (int32_t slot : {0, 1}) {
      std::vector<float>& out = slot == 0 ? intact : poisoned;
      const std::vector<float> l = gpu.step(
          {{slot, std::span<const int32_t>(&next[static_cast<size_t>(i)], 1), 340 + i, false}});
      out.insert(out.end(), l.begin(), l.end());
    }
  }
  ASSERT_EQ(intact.size(), poisoned.size());
  size_t differ = 0;
  for (size_t i = 0; i < intact.size(); ++i)
    if (std::memcmp(&intact[i], &poisoned[i], sizeof(float)) != 0) ++differ;
  EXPECT_EQ(differ, 0u) << "logits changed when the KV behind the window was overwritten";
  for (const float x : intact) ASSERT_TRUE(std::isfinite(x));
  EXPECT_GT(gpu.graphs().replays, 0u);
}

// KV by layer kind on the device: a run that maps as the engine does (the sliding layers'
// granules behind the window unmapped under the CUDA fences while graphs replay) gives logits
// identical to the bit to a run that keeps every token mapped, on 1,000-token chats (a prefill in
// chunks of 150 on the flash path, 40-row chunks on the matvec path, then graph-captured decode
// of 3 chats together); the window part stays within its window, the look-ahead and a granule.
TEST_P(Gemma4Gpu, UnmapsBehindTheWindowAndMatchesKeepingEverything) {
  GRANULE_REQUIRE_GPU();
  const Gemma4Case& p = GetParam();
  test::TempModel model(gemma4_spec(p), "gemma4-gpu-unmap");
  Rig sliding(model.path, options(true, false, 2048));
  Rig keeping(model.path, options(true, false, 2048));
  const int64_t vocab = sliding.config.n_vocab;
  const KvSpace& kv = *sliding.kv;
  ASSERT_EQ(kv.parts(), 2);
  const uint64_t g = kv.granule_bytes();
  const auto window_token_bytes =
      static_cast<uint64_t>(kv.part(ModelConfig::kKvPartWindow).bytes_per_token);
  const int64_t lookahead = kv.geometry().lookahead_tokens;
  const uint64_t bound =
      ((static_cast<uint64_t>(p.window + lookahead) * window_token_bytes + g - 1) / g + 1) * g;
  size_t differ = 0;
  auto both = [&](const std::vector<BatchSequence>& batch) {
    const std::vector<float> a = sliding.step(batch, true), b = keeping.step(batch, false);
    EXPECT_EQ(a.size(), b.size());
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
      if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) ++differ;
  };
  constexpr int64_t kPrompt = 1000;
  for (int32_t slot = 0; slot < 3; ++slot) {
    const std::vector<int32_t> prompt = random_tokens(kPrompt, vocab, 20 + slot);
    int64_t at = 0;
    for (; at + 150 <= 900; at += 150)
      both({{slot, std::span<const int32_t>(prompt.data() + at, 150), at, false}});
    for (; at < kPrompt; at += 40) {
      const auto n = static_cast<size_t>(std::min<int64_t>(40, kPrompt - at));
      both({{slot, std::span<const int32_t>(prompt.data() + at, n), at, false}});
    }
  }
  for (int step = 0; step < 40; ++step) {
    const std::vector<int32_t> next = random_tokens(3, vocab, 200 + step);
    std::vector<BatchSequence> batch;
    for (int32_t slot = 0; slot < 3; ++slot)
      batch.push_back({slot, std::span<const int32_t>(&next[static_cast<size_t>(slot)], 1),
                       kPrompt + step, false});
    both(batch);
    for (int32_t slot = 0; slot < 3; ++slot)
      EXPECT_LE(kv.committed_bytes(slot, ModelConfig::kKvPartWindow), bound) << "slot " << slot;
  }
  EXPECT_EQ(differ, 0u) << "logits differ from the run that keeps every token mapped";
  EXPECT_GT(kv.stats().granules_unmapped, 0u);
  EXPECT_LT(kv.committed_bytes(0), keeping.kv->committed_bytes(0));
  EXPECT_GT(sliding.graphs().replays, 0u);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::cout << "[gemma4-gpu] window part per chat at " << kPrompt + 40
            << " tokens: " << kv.committed_bytes(0, ModelConfig::kKvPartWindow) / 1024
            << " KiB (bound " << bound / 1024 << " KiB) against "
            << keeping.kv->committed_bytes(0, ModelConfig::kKvPartWindow) / 1024
            << " KiB kept; unmapped " << kv.stats().granules_unmapped << " granules\n";
}

// The per-layer token table in pinned, mapped host memory (the default) against the resident
// form (BackendOptions::cuda_ple_table_on_device): the ledger holds the table's bytes as
// HostPinned, outside the budget, where the resident form holds them as weights; and the logits
// equal to the bit over a 64-row prefill (matvec path), graph-captured decode, a 150-row prefill
// (the GEMM path) and 6 chats decoding together.
TEST_P(Gemma4Gpu, TheTokenTableStaysInHostMemoryAndMatchesTheResidentForm) {
  GRANULE_REQUIRE_GPU();
  const Gemma4Case& p = GetParam();
  test::TempModel model(gemma4_spec(p), "gemma4-gpu-table");
  RuntimeOptions on_device = options(true, false);
  on_device.backend.cuda_ple_table_on_device = true;
  Rig mapped(model.path, options(true, false)), resident(model.path, on_device);
  const WeightLayout layout = weight_layout(mapped.config, mapped.weights, true);
  const uint64_t table = layout.per_layer_table_bytes;
  ASSERT_GT(table, 0u);
  const MemoryManager& m = *mapped.runtime.memory;
  const MemoryManager& r = *resident.runtime.memory;
  EXPECT_EQ(m.bytes(MemoryCategory::HostPinned), table);
  EXPECT_EQ(r.bytes(MemoryCategory::HostPinned), 0u);
  EXPECT_EQ(r.bytes(MemoryCategory::WeightsResident),
            m.bytes(MemoryCategory::WeightsResident) + table);
  EXPECT_EQ(r.used_bytes(), m.used_bytes() + table);  // pinned host bytes are not in the budget

  const int64_t vocab = mapped.config.n_vocab;
  size_t compared = 0, differ = 0;
  auto both = [&](const std::vector<BatchSequence>& batch) {
    const std::vector<float> a = mapped.step(batch, true), b = resident.step(batch, true);
    ASSERT_EQ(a.size(), b.size());
    compared += a.size();
    for (size_t i = 0; i < a.size(); ++i)
      if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) ++differ;
  };
  const std::vector<int32_t> prompt = random_tokens(64, vocab, 41);
  both({{0, prompt, 0, true}});
  const std::vector<int32_t> next = random_tokens(16, vocab, 42);
  for (int i = 0; i < 16; ++i)
    both({{0, std::span<const int32_t>(&next[static_cast<size_t>(i)], 1), 64 + i, false}});
  const std::vector<int32_t> long_prompt = random_tokens(150, vocab, 43);
  both({{1, long_prompt, 0, true}});
  std::vector<int64_t> lengths;
  for (int s = 0; s < 6; ++s) {
    const int n = 3 + 29 * s;
    both({{2 + s, random_tokens(n, vocab, 50 + s), 0, false}});
    lengths.push_back(n);
  }
  for (int step = 0; step < 4; ++step) {
    const std::vector<int32_t> tokens = random_tokens(6, vocab, 60 + step);
    std::vector<BatchSequence> batch;
    for (int s = 0; s < 6; ++s)
      batch.push_back({2 + s, std::span<const int32_t>(&tokens[static_cast<size_t>(s)], 1),
                       lengths[static_cast<size_t>(s)] + step, false});
    both(batch);
  }
  EXPECT_GT(compared, 0u);
  EXPECT_EQ(differ, 0u) << "logits differ between the host-mapped and the resident table";
  EXPECT_GT(mapped.graphs().replays, 0u);
  // What the PCIe reads cost a decode step (printed, not asserted): 32 graph-replayed steps of
  // one chat on each form, after the steps above warmed both.
  auto decode_us = [&](Rig& rig, int32_t slot) {
    const std::vector<int32_t> tokens = random_tokens(32, vocab, 90);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 32; ++i)
      rig.step(
          {{slot, std::span<const int32_t>(&tokens[static_cast<size_t>(i)], 1), 150 + i, false}},
          true);
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
               .count() /
           32;
  };
  const double mapped_us = decode_us(mapped, 1), resident_us = decode_us(resident, 1);
  std::cout << "[gemma4-gpu] " << case_name(p) << " decode step: table in host memory " << mapped_us
            << " us, in device memory " << resident_us << " us\n";
}

INSTANTIATE_TEST_SUITE_P(
    Types, Gemma4Gpu,
    ::testing::Values(Gemma4Case{TensorType::F32, 8, 256}, Gemma4Case{TensorType::F32, 128, 512},
                      Gemma4Case{TensorType::Q8_0, 128, 256}, Gemma4Case{TensorType::Q4_0, 8, 512}),
    [](const ::testing::TestParamInfo<Gemma4Case>& i) { return case_name(i.param); });

// A table whose per-layer slices are not whole blocks (Q4_K rows: blocks of 256, slices of 64)
// is gathered a whole row per token, from host memory all the same: the GPU within the oracle's
// bound over a 64-row prefill and graph-captured decode.
TEST(Gemma4TokenTable, WholeRowsWhereSlicesAreNotWholeBlocks) {
  GRANULE_REQUIRE_GPU();
  SyntheticModelSpec spec = gemma4_spec({TensorType::Q4_0, 8, 512});
  spec.embedding_type = TensorType::Q4_K;  // token_embd and per_layer_token_embd
  test::TempModel model(spec, "gemma4-gpu-rows");
  Rig ref(model.path, options(false, false)), oracle(model.path, options(false, true)),
      gpu(model.path, options(true, false));
  const WeightLayout layout = weight_layout(gpu.config, gpu.weights, true);
  ASSERT_EQ(layout.per_layer_table.tensor->ggml_type, static_cast<uint32_t>(TensorType::Q4_K));
  ASSERT_NE(gpu.config.n_embd_per_layer % 256, 0);
  EXPECT_EQ(gpu.runtime.memory->bytes(MemoryCategory::HostPinned), layout.per_layer_table_bytes);
  const int64_t vocab = gpu.config.n_vocab;
  std::vector<float> r, o, g;
  auto all3 = [&](const std::vector<BatchSequence>& batch) {
    const std::vector<float> a = ref.step(batch), b = oracle.step(batch), d = gpu.step(batch, true);
    r.insert(r.end(), a.begin(), a.end());
    o.insert(o.end(), b.begin(), b.end());
    g.insert(g.end(), d.begin(), d.end());
  };
  const std::vector<int32_t> prompt = random_tokens(64, vocab, 81);
  all3({{0, prompt, 0, true}});
  const std::vector<int32_t> next = random_tokens(8, vocab, 82);
  for (int i = 0; i < 8; ++i)
    all3({{0, std::span<const int32_t>(&next[static_cast<size_t>(i)], 1), 64 + i, false}});
  gpu_test::expect_close_to_oracle(r, o, g, vocab, "gemma4 Q4_K table, whole rows", false);
  EXPECT_GT(gpu.graphs().replays, 0u);
}

// The fit preview against the ledger of an engine opened on the widened file (global heads of
// 512, Q4_0): the per-layer embeddings' matrices and norms are in the resident weights, their
// inputs and scratch in the workspace, their token table in HostPinned, each exactly as
// estimated, before and after steps that capture graphs and take the GEMM path.
TEST(Gemma4LedgerEstimate, ThePerLayerEmbeddingsAreWhereTheEstimateSays) {
  GRANULE_REQUIRE_GPU();
  test::TempModel model(gemma4_spec({TensorType::Q4_0, 128, 512}), "gemma4-ledger");
  const EngineOptions o{.device = DeviceKind::Cuda, .context_length = 1024, .max_sequences = 4};
  const FitEstimate e = Engine::estimate(model.path, o);
  ASSERT_TRUE(e.loads);
  ASSERT_GT(e.host_pinned_bytes, 0u);
  auto engine = Engine::open(model.path, o);
  auto expect_ledger = [&](const TelemetrySnapshot& t, const char* when) {
    EXPECT_EQ(t.streaming.layers_streamed, 0) << when;
    EXPECT_EQ(t.device.ledger_bytes(MemoryCategory::WeightsResident), e.resident_weight_bytes)
        << when;
    EXPECT_EQ(t.device.ledger_bytes(MemoryCategory::Workspace), e.workspace_bytes) << when;
    EXPECT_EQ(t.device.ledger_bytes(MemoryCategory::HostPinned), e.host_pinned_bytes) << when;
  };
  expect_ledger(engine->telemetry(), "at open");
  SamplingParams greedy = SamplingParams::greedy();
  greedy.max_tokens = 16;
  greedy.ignore_eos = true;
  const std::vector<int32_t> tokens = random_tokens(150, e.config.n_vocab, 70);
  std::vector<TokenId> prompt(tokens.begin(), tokens.end());
  engine->submit({.prompt_tokens = prompt, .sampling = greedy});
  prompt.resize(9);
  engine->submit({.prompt_tokens = prompt, .sampling = greedy});
  for (int i = 0; i < 10000 && engine->step(); ++i) {
  }
  EXPECT_TRUE(engine->idle());
  const TelemetrySnapshot after = engine->telemetry();
  expect_ledger(after, "after steps");
  EXPECT_GT(after.graphs.captures, 0u);
}

// Needs no GPU: the widened file runs on the CUDA backend; its shared layers own no KV (the
// bytes per token are the first 6 layers'), and with Gemma 4's real global heads of 512 too; so
// does the widened mixture-of-experts form; the tiny presets' heads of 32 are refused, with the
// reason.
TEST(Gemma4CudaRefusal, DenseRunsTheRestIsRefusedByReason) {
  const SyntheticModelSpec spec = gemma4_spec({TensorType::Q4_0, 8});
  EXPECT_EQ(refusal_of(spec), "");
  {
    test::TempModel model(spec, "gemma4-kv");
    auto file = ModelFile::open(model.path);
    const ModelConfig c = ModelConfig::from_gguf(*file);
    int64_t own = 0;
    for (int64_t l = 0; l < 6; ++l) own += 2 * c.kv_dim_of(l);
    EXPECT_EQ(c.kv_bytes_per_token(2), own * 2);
    EXPECT_EQ(c.kv_layer_elements(6), 0);
    EXPECT_EQ(c.kv_layer_elements(7), 0);
  }
  // The mixture-of-experts form runs widened; the tiny preset's heads of 32 do not.
  EXPECT_EQ(refusal_of(gemma4_moe_spec({TensorType::Q4_0, 8})), "");
  EXPECT_EQ(refusal_of(gemma4_moe_spec({TensorType::Q8_0, 8, 512})), "");
  const std::string moe = refusal_of(SyntheticModelSpec::preset("tiny-gemma4-moe"));
  EXPECT_NE(moe.find("head sizes"), std::string::npos) << moe;
  SyntheticModelSpec wide = spec;
  wide.head_dim = 512;  // Gemma 4's real global heads (attention_wide)
  EXPECT_EQ(refusal_of(wide), "");
  const std::string tiny = refusal_of(SyntheticModelSpec::preset("tiny-gemma4"));
  EXPECT_NE(tiny.find("head sizes"), std::string::npos) << tiny;
  EXPECT_NE(tiny.find("not 32"), std::string::npos) << tiny;
}

// Needs no GPU: the CPU oracle rounds Gemma 4 as the CUDA layers do (f16 KV, int8 or f16
// activations into the products, the per-layer embedding products on the matvec kernels), so it
// differs from the f32 reference, but by rounding only, on the matvec (64 rows) and the GEMM (150
// rows) chunk sizes: within 2% of the logits' spread with F32 weights (f16 KV and GEMM operands;
// measured 0.4% and 0.7% with global heads of 256), 30% with Q8_0 (int8 activations; measured 14%
// and 7%, where the widened Gemma 3 file of gemma3_gpu_test measures 7% and 2%). The
// mixture-of-experts form with F32 weights on 64 rows: the median row within 2%. With
// Q8_0 its int8 rounding (7 to 14% of the spread) reroutes nearly every token somewhere in the 8
// layers of 8 experts (measured median 56% to 120%), so that form is left to the GPU test, where
// the GPU and the oracle differ by summation order only.
TEST(Gemma4CudaOracle, RoundsAsTheGpuAndStaysNearTheReference) {
  struct OracleCase {
    Gemma4Case c;
    bool moe;  // the mixture-of-experts form (its experts rounded as the MoE kernels round)
  };
  for (const auto& [c, moe] :
       {OracleCase{{TensorType::F32, 8, 256}, false}, OracleCase{{TensorType::Q8_0, 8, 256}, false},
        OracleCase{{TensorType::F32, 8, 512}, false}, OracleCase{{TensorType::F32, 8, 256}, true},
        OracleCase{{TensorType::F32, 8, 512}, true}}) {
    const TensorType type = c.type;
    test::TempModel model(moe ? gemma4_moe_spec(c) : gemma4_spec(c), "gemma4-oracle");
    Rig ref(model.path, options(false, false)), oracle(model.path, options(false, true));
    const int64_t vocab = ref.config.n_vocab;
    for (const int n : {64, 150}) {
      if (moe && n == 150) continue;  // a reroute reaches every later row (see below)
      const std::vector<int32_t> prompt = random_tokens(n, vocab, 30 + n);
      const int32_t slot = n == 64 ? 0 : 1;
      const std::vector<float> r = ref.step({{slot, prompt, 0, true}});
      const std::vector<float> o = oracle.step({{slot, prompt, 0, true}});
      ASSERT_EQ(r.size(), o.size());
      double worst = 0;
      bool differs = false;
      std::vector<double> errors;
      for (int row = 0; row < n; ++row) {
        const float* a = r.data() + static_cast<int64_t>(row) * vocab;
        const float* b = o.data() + static_cast<int64_t>(row) * vocab;
        const double spread = gpu_test::spread_of(a, vocab).std;
        errors.push_back(gpu_test::centred_error(b, a, vocab, spread));
        worst = std::max(worst, errors.back());
        differs = differs || std::memcmp(a, b, static_cast<size_t>(vocab) * sizeof(float)) != 0;
      }
      const double bound = type == TensorType::F32 ? 0.02 : 0.3;
      std::string rows_past;
      for (int row = 0; row < n; ++row)
        if (errors[static_cast<size_t>(row)] > bound) rows_past += " " + std::to_string(row);
      std::sort(errors.begin(), errors.end());
      const double median = errors[errors.size() / 2];
      std::cout << "[gemma4-oracle] " << (moe ? "moe " : "") << case_name(c) << " " << n
                << " rows: max |oracle - ref| / spread " << worst << ", median " << median
                << ", rows past " << bound << ":" << rows_past << "\n";
      EXPECT_TRUE(differs) << "the oracle rounds nothing";
      // With experts a token whose k-th and (k+1)-th router logits are within the rounding takes
      // another expert on one side: its row (and, through a global layer's KV, the rows after
      // it) then differs by a share of an expert's output, not by rounding (oracle_compare.h);
      // the rest stay within the dense bound (measured on 64 rows: medians 0.28% and 0.33%, one
      // row rerouted with global heads of 256). On 150 rows (the GEMM chunk) the medians are 0.8%
      // and 0.9%, but a reroute at row 86 reaches every later row through the global layers, so
      // the median there is chance.
      EXPECT_LT(moe ? median : worst, bound);
    }
  }
}

}  // namespace
}  // namespace granule
