// The fit preview's expert plan (runtime/fit_estimate.h) on mixture-of-experts tables built by
// hand in the real shapes: qwen3-30b-a3b (48 layers × 128 experts, top-8, a Q4_K_M-like mix
// whose down projections are Q6_K on some layers) and gpt-oss-20b (24 × 32, top-4, MXFP4
// experts with biases). What stays resident, bytes per expert, how many experts a budget
// holds per layer, the PCIe bytes per token at uniform routing and the bound they imply,
// the minimum budget, KV room, and the CPU, where every expert is in host memory.
#include <gtest/gtest.h>

#include <deque>
#include <string>

#include "backends/cpu/host_experts.h"
#include "backends/cpu/int8_packed.h"
#include "granule/engine.h"
#include "granule/tensor_type.h"
#include "memory/expert_placement.h"
#include "memory/host_expert_share.h"
#include "runtime/fit_estimate.h"

namespace granule {
namespace {

constexpr uint64_t GiB = 1ull << 30;
constexpr double kH2d = 55.4e9;

// Tensors of the shapes and types asked, sized as GGUF stores them; addresses stay put.
struct Tables {
  ModelConfig config;
  WeightTable weights;
  std::deque<TensorInfo> tensors;

  const TensorInfo* tensor(const std::string& name, TensorType type, std::vector<int64_t> dims) {
    TensorInfo& t = tensors.emplace_back();
    t.name = name;
    t.dims = dims;
    t.ggml_type = static_cast<uint32_t>(type);
    int64_t rows = 1;
    for (size_t i = 1; i < dims.size(); ++i) rows *= dims[i];
    t.size_bytes = row_bytes(type, dims[0]) * static_cast<uint64_t>(rows);
    return &t;
  }
};

// llama.cpp's Q4_K_M gives some layers' down projections Q6_K (the first and last eighth,
// and every third in between): here the same pattern, so layers differ in expert bytes.
bool more_bits(int64_t layer, int64_t n_layer) {
  return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

Tables qwen3_30b_a3b() {
  Tables t;
  ModelConfig& c = t.config;
  c.architecture = "qwen3moe";
  c.n_layer = 48;
  c.n_embd = 2048;
  c.n_head = 32;
  c.n_head_kv = 4;
  c.head_dim = 128;
  c.n_vocab = 151936;
  c.context_length = 40960;
  c.qk_norm = true;
  c.moe.n_expert = 128;
  c.moe.n_expert_used = 8;
  c.moe.n_ff_exp = 768;
  c.moe.normalize_weights = true;
  const int64_t E = c.n_embd, F = c.moe.n_ff_exp, X = c.moe.n_expert;
  WeightTable& w = t.weights;
  w.token_embd = t.tensor("token_embd.weight", TensorType::Q4_K, {E, c.n_vocab});
  w.output = t.tensor("output.weight", TensorType::Q6_K, {E, c.n_vocab});
  w.output_norm = t.tensor("output_norm.weight", TensorType::F32, {E});
  for (int64_t l = 0; l < c.n_layer; ++l) {
    LayerWeights& L = w.layers.emplace_back();
    L.attn_norm = t.tensor("attn_norm", TensorType::F32, {E});
    L.wq = t.tensor("attn_q", TensorType::Q4_K, {E, c.n_head * c.head_dim});
    L.wk = t.tensor("attn_k", TensorType::Q4_K, {E, c.n_head_kv * c.head_dim});
    L.wv = t.tensor("attn_v", TensorType::Q6_K, {E, c.n_head_kv * c.head_dim});
    L.wo = t.tensor("attn_output", TensorType::Q4_K, {c.n_head * c.head_dim, E});
    L.q_norm = t.tensor("attn_q_norm", TensorType::F32, {c.head_dim});
    L.k_norm = t.tensor("attn_k_norm", TensorType::F32, {c.head_dim});
    L.ffn_norm = t.tensor("ffn_norm", TensorType::F32, {E});
    L.router = t.tensor("ffn_gate_inp", TensorType::F32, {E, X});
    L.gate_exps = t.tensor("ffn_gate_exps", TensorType::Q4_K, {E, F, X});
    L.up_exps = t.tensor("ffn_up_exps", TensorType::Q4_K, {E, F, X});
    L.down_exps = t.tensor(
        "ffn_down_exps", more_bits(l, c.n_layer) ? TensorType::Q6_K : TensorType::Q4_K, {F, E, X});
  }
  return t;
}

Tables gpt_oss_20b() {
  Tables t;
  ModelConfig& c = t.config;
  c.architecture = "gpt-oss";
  c.n_layer = 24;
  c.n_embd = 2880;
  c.n_head = 64;
  c.n_head_kv = 8;
  c.head_dim = 64;
  c.n_vocab = 201088;
  c.context_length = 131072;
  c.moe.n_expert = 32;
  c.moe.n_expert_used = 4;
  c.moe.n_ff_exp = 2880;
  c.moe.gating = ExpertGating::SoftmaxOfTopK;
  c.activation = FfnActivation::SwigluClamped;
  c.attn_sinks = true;
  c.attn_output_bias = true;
  const int64_t E = c.n_embd, F = c.moe.n_ff_exp, X = c.moe.n_expert;
  WeightTable& w = t.weights;
  w.token_embd = t.tensor("token_embd.weight", TensorType::Q8_0, {E, c.n_vocab});
  w.output = t.tensor("output.weight", TensorType::Q8_0, {E, c.n_vocab});
  w.output_norm = t.tensor("output_norm.weight", TensorType::F32, {E});
  for (int64_t l = 0; l < c.n_layer; ++l) {
    LayerWeights& L = w.layers.emplace_back();
    L.attn_norm = t.tensor("attn_norm", TensorType::F32, {E});
    L.wq = t.tensor("attn_q", TensorType::BF16, {E, c.n_head * c.head_dim});
    L.wk = t.tensor("attn_k", TensorType::BF16, {E, c.n_head_kv * c.head_dim});
    L.wv = t.tensor("attn_v", TensorType::BF16, {E, c.n_head_kv * c.head_dim});
    L.wo = t.tensor("attn_output", TensorType::BF16, {c.n_head * c.head_dim, E});
    L.bq = t.tensor("attn_q.bias", TensorType::F32, {c.n_head * c.head_dim});
    L.bk = t.tensor("attn_k.bias", TensorType::F32, {c.n_head_kv * c.head_dim});
    L.bv = t.tensor("attn_v.bias", TensorType::F32, {c.n_head_kv * c.head_dim});
    L.bo = t.tensor("attn_output.bias", TensorType::F32, {E});
    L.attn_sinks = t.tensor("attn_sinks", TensorType::F32, {c.n_head});
    L.ffn_norm = t.tensor("post_attention_norm", TensorType::F32, {E});
    L.router = t.tensor("ffn_gate_inp", TensorType::F32, {E, X});
    L.router_bias = t.tensor("ffn_gate_inp.bias", TensorType::F32, {X});
    L.gate_exps = t.tensor("ffn_gate_exps", TensorType::MXFP4, {E, F, X});
    L.up_exps = t.tensor("ffn_up_exps", TensorType::MXFP4, {E, F, X});
    L.down_exps = t.tensor("ffn_down_exps", TensorType::MXFP4, {F, E, X});
    L.gate_exps_bias = t.tensor("ffn_gate_exps.bias", TensorType::F32, {F, X});
    L.up_exps_bias = t.tensor("ffn_up_exps.bias", TensorType::F32, {F, X});
    L.down_exps_bias = t.tensor("ffn_down_exps.bias", TensorType::F32, {E, X});
  }
  return t;
}

// A preview's inputs as Engine::estimate sets them for CUDA (f16 KV) with `budget`.
FitEstimate gpu_estimate(const Tables& t, uint64_t budget) {
  FitEstimate e;
  e.config = t.config;
  e.gpu = true;
  e.budget_bytes = budget;
  e.workspace_bytes = 256ull << 20;
  e.chats = 1;
  e.context_per_chat = 4096;
  e.kv_element_bytes = 2;
  e.kv_bytes_per_token = static_cast<uint64_t>(t.config.kv_bytes_per_token(2));
  e.h2d_bytes_per_second = kH2d;
  estimate_mixture_of_experts(e, t.weights);
  return e;
}

// The bytes one expert of `layer` takes, from the tensor sizes (gate + up + down + biases).
uint64_t expert_bytes_of(const Tables& t, size_t layer) {
  const LayerWeights& l = t.weights.layers[layer];
  uint64_t sum = 0;
  for (const TensorInfo* x :
       {l.gate_exps, l.up_exps, l.down_exps, l.gate_exps_bias, l.up_exps_bias, l.down_exps_bias})
    if (x) sum += x->size_bytes;
  return sum / static_cast<uint64_t>(t.config.moe.n_expert);
}

TEST(FitEstimateMoe, Qwen3FootprintSplitsAlwaysResidentFromExperts) {
  const Tables t = qwen3_30b_a3b();
  const ExpertFootprint f = expert_footprint(t.config, t.weights);
  // One expert: gate and up Q4_K (2048 / 256 × 144 bytes a row × 768 rows each), down Q4_K or
  // Q6_K (768 / 256 × 144 or 210 bytes a row × 2048 rows).
  const uint64_t q4 = 2 * 1152 * 768 + 432 * 2048, q6 = 2 * 1152 * 768 + 630 * 2048;
  ASSERT_EQ(f.layer_expert_bytes.size(), 48u);
  EXPECT_EQ(f.layer_expert_bytes[0], q6);
  EXPECT_EQ(f.layer_expert_bytes[6], q4);
  EXPECT_EQ(f.expert_bytes, q6);
  uint64_t experts = 0, all = 0;
  for (size_t l = 0; l < 48; ++l) experts += 128 * expert_bytes_of(t, l);
  for (const TensorInfo& x : t.tensors) all += x.size_bytes;
  EXPECT_EQ(f.experts_bytes, experts);
  EXPECT_EQ(f.always_resident_bytes + f.experts_bytes, all);
  // Attention, norms, routers and the embeddings and head: about 1.3 GB of the ~18 GB.
  EXPECT_GT(f.always_resident_bytes, 1'000'000'000u);
  EXPECT_LT(f.always_resident_bytes, 1'500'000'000u);
  EXPECT_GT(f.experts_bytes, 16'000'000'000u);
}

TEST(FitEstimateMoe, LargeBudgetHoldsEveryExpertAndNothingCrossesPcie) {
  const Tables t = qwen3_30b_a3b();
  const FitEstimate e = gpu_estimate(t, 80 * GiB);
  EXPECT_TRUE(e.loads);
  EXPECT_TRUE(e.fits);
  EXPECT_EQ(e.experts.n_expert, 128);
  EXPECT_EQ(e.experts.n_expert_used, 8);
  EXPECT_EQ(e.experts.resident_experts, 48 * 128);
  for (int32_t n : e.experts.resident_per_layer) EXPECT_EQ(n, 128);
  EXPECT_EQ(e.experts.pcie_bytes_per_token, 0.0);
  EXPECT_EQ(e.experts.pcie_tokens_per_second, 0.0);
  EXPECT_EQ(e.pcie_tokens_per_second, 0.0);
  EXPECT_EQ(e.resident_weight_bytes, e.weights_bytes);
  EXPECT_EQ(e.streamed_layers, 0);
  EXPECT_EQ(e.resident_layers, 48);
  // KV room: what the budget leaves beside every weight and the workspace.
  EXPECT_EQ(e.kv_capacity_tokens,
            static_cast<int64_t>((80 * GiB - e.weights_bytes - e.workspace_bytes) /
                                 e.kv_bytes_per_token));
}

TEST(FitEstimateMoe, HalfTheExpertsSpreadOverLayersAndTheRestCrossPcie) {
  const Tables t = qwen3_30b_a3b();
  const ExpertFootprint f = expert_footprint(t.config, t.weights);
  const FitEstimate probe = gpu_estimate(t, 0);
  const uint64_t minimum = probe.minimum_budget_bytes;
  // The minimum holds the staging area of the step's streamed experts (128 slots).
  EXPECT_EQ(probe.staging_bytes, 128 * f.expert_bytes);
  EXPECT_EQ(minimum, f.always_resident_bytes + probe.workspace_bytes + probe.kv_reserve_bytes +
                         probe.staging_bytes);
  EXPECT_EQ(probe.kv_reserve_bytes, 512u * probe.kv_bytes_per_token);
  // Room for 3072 of the 6144 experts at the plan's size (the largest layer's), and a little.
  const FitEstimate e = gpu_estimate(t, minimum + 3072 * f.expert_bytes + 1000);
  EXPECT_TRUE(e.loads);
  EXPECT_EQ(e.experts.resident_experts, 3072);
  EXPECT_EQ(e.experts.expert_budget_bytes, 3072 * f.expert_bytes + 1000);
  double pcie = 0;
  uint64_t resident_bytes = 0;
  for (size_t l = 0; l < 48; ++l) {
    EXPECT_EQ(e.experts.resident_per_layer[l], 64) << "layer " << l;
    pcie += 8.0 * (64.0 / 128.0) * static_cast<double>(expert_bytes_of(t, l));
    resident_bytes += 64 * expert_bytes_of(t, l);
  }
  EXPECT_DOUBLE_EQ(e.experts.pcie_bytes_per_token, pcie);
  // About 8 × 24 × 2.8 MB ≈ 540 MB a token at batch 1: ~100 tokens/s at 55 GB/s.
  EXPECT_NEAR(e.experts.pcie_bytes_per_token, 5.4e8, 0.3e8);
  EXPECT_DOUBLE_EQ(e.experts.pcie_tokens_per_second, kH2d / pcie);
  EXPECT_DOUBLE_EQ(e.pcie_tokens_per_second, e.experts.pcie_tokens_per_second);
  EXPECT_EQ(e.resident_weight_bytes, f.always_resident_bytes + resident_bytes);
  // The experts sized by the largest layer leave a little KV room beyond the reserve.
  EXPECT_GE(e.kv_capacity_tokens, 512);

  // An odd count: 3000 experts give 62 or 63 per layer.
  const FitEstimate odd = gpu_estimate(t, minimum + 3000 * f.expert_bytes);
  EXPECT_EQ(odd.experts.resident_experts, 3000);
  for (int32_t n : odd.experts.resident_per_layer) EXPECT_TRUE(n == 62 || n == 63) << n;
}

TEST(FitEstimateMoe, MinimumBudgetHoldsNoExpertAndBelowItNothingLoads) {
  const Tables t = qwen3_30b_a3b();
  const uint64_t minimum = gpu_estimate(t, 0).minimum_budget_bytes;
  const FitEstimate at = gpu_estimate(t, minimum);
  EXPECT_TRUE(at.loads);
  EXPECT_EQ(at.experts.resident_experts, 0);
  double every_choice = 0;
  for (size_t l = 0; l < 48; ++l) every_choice += 8.0 * static_cast<double>(expert_bytes_of(t, l));
  EXPECT_DOUBLE_EQ(at.experts.pcie_bytes_per_token, every_choice);
  const FitEstimate below = gpu_estimate(t, minimum - 1);
  EXPECT_FALSE(below.loads);
  EXPECT_FALSE(below.fits);
  EXPECT_EQ(below.experts.resident_experts, 0);
  EXPECT_EQ(below.minimum_budget_bytes, minimum);
}

TEST(FitEstimateMoe, GptOssExpertsCarryTheirBiases) {
  const Tables t = gpt_oss_20b();
  const ExpertFootprint f = expert_footprint(t.config, t.weights);
  // MXFP4: 32 elements in 17 bytes. gate, up, down 2880 × 2880 each, biases f32.
  const uint64_t matrix = 2880 / 32 * 17 * 2880;
  EXPECT_EQ(f.expert_bytes, 3 * matrix + 3 * 2880 * 4);
  EXPECT_EQ(f.experts_bytes, 24 * 32 * f.expert_bytes);
  const FitEstimate e =
      gpu_estimate(t, gpu_estimate(t, 0).minimum_budget_bytes + 24 * 8 * f.expert_bytes);
  EXPECT_EQ(e.experts.resident_experts, 24 * 8);
  for (int32_t n : e.experts.resident_per_layer) EXPECT_EQ(n, 8);
  // Top-4 of 32 with a quarter resident: 3 host experts a layer a token.
  EXPECT_DOUBLE_EQ(e.experts.pcie_bytes_per_token,
                   24 * 4 * 0.75 * static_cast<double>(f.expert_bytes));
}

// A CPU plan of `t` (f32 KV) at `budget` bytes for `chats` chats of 4,096 tokens, not yet
// estimated.
FitEstimate cpu_plan(const Tables& t, uint64_t budget, int32_t chats) {
  FitEstimate e;
  e.config = t.config;
  e.gpu = false;
  e.budget_bytes = budget;
  e.workspace_bytes = 64ull << 20;
  e.chats = chats;
  e.context_per_chat = 4096;
  e.kv_bytes_per_token = static_cast<uint64_t>(t.config.kv_bytes_per_token(4));
  return e;
}

TEST(FitEstimateMoe, CpuHoldsEveryExpertInHostMemory) {
  const Tables t = qwen3_30b_a3b();
  FitEstimate e = cpu_plan(t, 64 * GiB, 2);
  estimate_mixture_of_experts(e, t.weights);
  EXPECT_EQ(e.experts.resident_experts, 48 * 128);
  EXPECT_EQ(e.experts.pcie_bytes_per_token, 0.0);
  EXPECT_EQ(e.resident_weight_bytes, e.weights_bytes);
  EXPECT_EQ(e.minimum_budget_bytes, e.weights_bytes + e.workspace_bytes);
  EXPECT_TRUE(e.loads);
  EXPECT_TRUE(e.fits);
}

// The CPU's experts run on int8 copies while those fit what the memory available leaves beside
// the other matrices' copies (the CPU backend's own plan_copies), else on the exact path:
// qwen3-30b-a3b's 16.3 GiB of experts on a 24 GiB machine with 21 GiB available take the
// copies, with 12 GiB they do not.
TEST(FitEstimateMoe, CpuExpertsTakeTheInt8CopiesWhereTheMemoryAvailableHoldsThem) {
  const Tables t = qwen3_30b_a3b();
  auto estimate = [&](uint64_t available) {
    FitEstimate e = cpu_plan(t, 24 * GiB, 1);
    e.host_available_bytes = available;
    e.host_total_bytes = 24 * GiB;
    estimate_mixture_of_experts(e, t.weights);
    return e.experts;
  };
  const ExpertFitEstimate roomy = estimate(21 * GiB), tight = estimate(12 * GiB);
  // The matrices the int8 kernels run are copied too (where this processor runs them): the
  // attention's four and the head.
  const bool int8 = cpu::Int8Weights::supports(TensorType::Q4_K, 2048);
  uint64_t copied = int8 ? t.weights.output->size_bytes : 0;
  for (const LayerWeights& l : t.weights.layers)
    if (int8) copied += l.wq->size_bytes + l.wk->size_bytes + l.wv->size_bytes + l.wo->size_bytes;
  EXPECT_EQ(roomy.cpu_copy_budget_bytes, 21 * GiB - 24 * GiB / 10 - copied);
  EXPECT_GT(roomy.cpu_copy_budget_bytes, roomy.experts_bytes);
  EXPECT_EQ(roomy.cpu_int8_experts, int8);
  EXPECT_LT(tight.cpu_copy_budget_bytes, tight.experts_bytes);
  EXPECT_FALSE(tight.cpu_int8_experts);
}

// The share of a decode run's missed experts the host computes (memory/host_expert_share.h, the
// CUDA backend's rule): given, at every run size up to 64 rows; by default all of them from 8
// rows and kHostExpertAutoSmallShare below; none past 64 rows or with setting 0.
TEST(FitEstimateMoe, HostExpertShareRule) {
  EXPECT_EQ(host_expert_share_at(-1, 1), kHostExpertAutoSmallShare);
  EXPECT_EQ(host_expert_share_at(-1, kHostExpertAutoMinRows - 1), kHostExpertAutoSmallShare);
  EXPECT_EQ(host_expert_share_at(-1, kHostExpertAutoMinRows), 256);
  EXPECT_EQ(host_expert_share_at(-1, kHostExpertMaxRows), 256);
  EXPECT_EQ(host_expert_share_at(-1, kHostExpertMaxRows + 1), 0);
  EXPECT_EQ(host_expert_share_at(-1, 0), 0);
  for (const int rows : {1, 7, 8, 64}) {
    EXPECT_EQ(host_expert_share_at(0, rows), 0);
    EXPECT_EQ(host_expert_share_at(96, rows), 96);
    EXPECT_EQ(host_expert_share_at(300, rows), 256);
  }
  EXPECT_EQ(host_expert_share_at(96, kHostExpertMaxRows + 1), 0);
}

// The preview takes the host's share of batch 1's missed experts where the backend would: the
// experts stream, the int8 kernels run them, and their copies fit the memory available. PCIe
// then carries the rest of the missed bytes, and its bound rises with it.
TEST(FitEstimateMoe, TheHostsShareOfBatchOnesMissesLeavesPcieTheRest) {
  const Tables t = qwen3_30b_a3b();
  const ExpertFootprint f = expert_footprint(t.config, t.weights);
  const uint64_t budget = gpu_estimate(t, 0).minimum_budget_bytes + 3072 * f.expert_bytes;
  auto estimate = [&](int setting, uint64_t available) {
    FitEstimate e = gpu_estimate(t, budget);  // no host memory given: the host computes none
    EXPECT_EQ(e.experts.host_share, 0);
    EXPECT_DOUBLE_EQ(e.experts.pcie_bytes_per_token, e.experts.missed_bytes_per_token);
    e.host_available_bytes = available;
    e.host_total_bytes = 128 * GiB;
    estimate_mixture_of_experts(e, t.weights, setting);
    return e;
  };
  const bool runs = cpu::HostExperts::refusal(t.config, t.weights).empty();
  const FitEstimate rule = estimate(-1, 120 * GiB);
  const ExpertFitEstimate& x = rule.experts;
  ASSERT_EQ(x.resident_experts, 3072);
  EXPECT_GT(x.missed_bytes_per_token, 0.0);
  EXPECT_EQ(x.host_share, runs ? kHostExpertAutoSmallShare : 0);
  EXPECT_DOUBLE_EQ(x.pcie_bytes_per_token,
                   x.missed_bytes_per_token * (1.0 - x.host_share / 256.0));
  EXPECT_DOUBLE_EQ(x.pcie_tokens_per_second, kH2d / x.pcie_bytes_per_token);
  EXPECT_DOUBLE_EQ(rule.pcie_tokens_per_second, x.pcie_tokens_per_second);
  EXPECT_EQ(estimate(96, 120 * GiB).experts.host_share, runs ? 96 : 0);
  // Setting 0, or copies (16.3 GiB) that do not fit 8 GiB available: every miss crosses PCIe.
  for (const FitEstimate& none : {estimate(0, 120 * GiB), estimate(-1, 8 * GiB)}) {
    EXPECT_EQ(none.experts.host_share, 0);
    EXPECT_DOUBLE_EQ(none.experts.pcie_bytes_per_token, x.missed_bytes_per_token);
  }
  // Every expert resident: nothing is missed, nothing computed on the host.
  const FitEstimate all = [&] {
    FitEstimate e = gpu_estimate(t, 64 * GiB);
    e.host_available_bytes = 120 * GiB;
    e.host_total_bytes = 128 * GiB;
    estimate_mixture_of_experts(e, t.weights);
    return e;
  }();
  EXPECT_EQ(all.experts.host_share, 0);
  EXPECT_EQ(all.experts.pcie_bytes_per_token, 0.0);
}

}  // namespace
}  // namespace granule
