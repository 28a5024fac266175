// Mixtures of experts on the CPU reference backend (issue 36): the routing ops; one layer's
// expert FFN (MoeFfn) against a direct double-precision evaluation for every gating, the
// gpt-oss biases and clamped SwiGLU, the shared expert, and the device rounding contract; whole
// synthetic Qwen3-MoE and Mixtral files against llama.cpp's CPU logits and greedy tokens
// (tests/data/reference/<case>.txt, from tests/reference/make_llama_cpp_goldens.sh); and files
// with Q4_K, Q8_0 and MXFP4 experts: bit for bit their dequantised F32 copy, and the emulated
// device numerics within the int8 error of the f32 reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/fast_matmul.h"
#include "backends/cpu/host_experts.h"
#include "backends/cpu/int8_packed.h"
#include "backends/cpu/moe_ffn.h"
#include "backends/cpu/ops.h"
#include "backends/cpu/thread_pool.h"
#include "granule/engine.h"
#include "granule/error.h"
#include "granule/gguf.h"
#include "granule/model_config.h"
#include "granule/quant.h"
#include "granule/testkit/gguf_writer.h"
#include "granule/testkit/quantize.h"
#include "granule/testkit/synthetic_model.h"
#include "support/model_runtime.h"
#include "support/reference_golden.h"
#include "support/temp_model.h"

namespace granule {
namespace {

namespace fs = std::filesystem;
using T = TensorType;
using test::random_values;
using test::worst_relative;
using test::write_f32_copy;

// ---- ops ----------------------------------------------------------------------------------

TEST(CpuMoeOps, TopKIsDescendingWithTiesToTheLowerIndex) {
  const std::vector<float> v = {0.5f, 2.0f, -1.0f, 2.0f, 0.5f, 3.0f, NAN, 0.5f};
  std::vector<int32_t> idx(5);
  cpu::top_k(v.data(), static_cast<int64_t>(v.size()), 5, idx.data());
  EXPECT_EQ(idx, (std::vector<int32_t>{5, 1, 3, 0, 4}));
  std::vector<int32_t> all(8);
  cpu::top_k(v.data(), 8, 8, all.data());
  EXPECT_EQ(all.back(), 6) << "NaN is chosen last";
}

TEST(CpuMoeOps, SwigluClampedMatchesGptOssDefinition) {
  const std::vector<float> gate = {-9.0f, -1.0f, 0.0f, 0.5f, 6.9f, 7.0f, 12.0f, 3.0f};
  const std::vector<float> up = {0.3f, 9.0f, -8.0f, 1.0f, -7.5f, 2.0f, 0.0f, -6.0f};
  std::vector<float> out(gate.size());
  cpu::swiglu_clamped(gate.data(), up.data(), out.data(), static_cast<int64_t>(gate.size()));
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = std::min<double>(gate[i], 7.0);
    const double u = std::clamp<double>(up[i], -7.0, 7.0);
    const double expected = g / (1.0 + std::exp(-1.702 * g)) * (u + 1.0);
    EXPECT_NEAR(out[i], expected, 1e-5 * std::max(1.0, std::fabs(expected))) << i;
  }
}

TEST(CpuMoeOps, SoftmaxSumsToOne) {
  std::vector<float> x = random_values(37, 5, 6.0f);
  const std::vector<float> in = x;
  cpu::softmax(x.data(), 37);
  double z = 0;
  for (float v : in) z += std::exp(static_cast<double>(v));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], std::exp(in[i]) / z, 1e-6);
}

// ---- one layer against a double-precision evaluation ------------------------------------

// A tensor built in memory: values encoded to `type` (GGUF dims order).
struct OwnedTensor {
  std::vector<uint8_t> bytes;
  TensorInfo info;
  OwnedTensor(std::string name, std::vector<int64_t> dims, T type, const std::vector<float>& v) {
    const int64_t cols = dims[0];
    const int64_t rows = static_cast<int64_t>(v.size()) / cols;
    const size_t stride = row_bytes(type, cols);
    bytes.resize(stride * static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      if (type == T::F32)
        std::memcpy(bytes.data() + r * stride, v.data() + r * cols, stride);
      else
        quantize_row(type, v.data() + r * cols, bytes.data() + r * stride, cols);
    }
    info.name = std::move(name);
    info.dims = std::move(dims);
    info.ggml_type = static_cast<uint32_t>(type);
    info.size_bytes = bytes.size();
    info.data = bytes.data();
  }
  // The values the kernels see: the encoded tensor decoded.
  std::vector<float> decoded() const {
    std::vector<float> out(static_cast<size_t>(info.elements()));
    dequantize_row(static_cast<T>(info.ggml_type), info.data, out.data(), info.elements());
    return out;
  }
};

struct LayerCase {
  std::string name;
  ExpertConfig moe;
  FfnActivation activation = FfnActivation::Swiglu;
  int64_t n_embd = 64;
  int64_t n_tokens = 7;
  T gate_type = T::F32, up_type = T::F32, down_type = T::F32;
  bool biases = false;
  int64_t n_ff_shexp = 0;
  bool shexp_gate = false;
  float weight_scale = 1.0f;  // expert weights' spread (large: the clamp engages)
  bool emulate = false;
  // max |out - reference| / max |reference|: f32 summation error, or, where an int8-rounded
  // hidden vector (a quantised down matrix, emulating) is compared, one int8 step of a value
  // that f32 and double put on either side of a rounding boundary.
  double tolerance = 2e-5;
};

struct Layer {
  ModelConfig config;
  std::vector<std::unique_ptr<OwnedTensor>> owned;
  LayerWeights weights;

  const TensorInfo* add(std::string name, std::vector<int64_t> dims, T type, float scale,
                        uint32_t seed) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    owned.push_back(
        std::make_unique<OwnedTensor>(std::move(name), std::move(dims), type,
                                      random_values(static_cast<size_t>(n), seed, scale)));
    return &owned.back()->info;
  }
  std::vector<float> values(const TensorInfo* t) const {
    for (const auto& o : owned)
      if (&o->info == t) return o->decoded();
    return {};
  }
};

std::unique_ptr<Layer> make_layer(const LayerCase& c) {
  auto layer = std::make_unique<Layer>();
  ModelConfig& cfg = layer->config;
  cfg.n_embd = c.n_embd;
  cfg.moe = c.moe;
  cfg.activation = c.activation;
  const int64_t d = c.n_embd, f = c.moe.n_ff_exp, e = c.moe.n_expert;
  const float in_scale = std::sqrt(3.0f / static_cast<float>(d));
  LayerWeights& w = layer->weights;
  w.router = layer->add("router", {d, e}, T::F32, 2.0f * in_scale, 11);
  w.gate_exps = layer->add("gate", {d, f, e}, c.gate_type, c.weight_scale * in_scale, 12);
  w.up_exps = layer->add("up", {d, f, e}, c.up_type, c.weight_scale * in_scale, 13);
  w.down_exps = layer->add("down", {f, d, e}, c.down_type, std::sqrt(3.0f / f), 14);
  if (c.biases) {
    w.router_bias = layer->add("router_b", {e}, T::F32, 0.5f, 15);
    w.gate_exps_bias = layer->add("gate_b", {f, e}, T::F32, 0.5f, 16);
    w.up_exps_bias = layer->add("up_b", {f, e}, T::F32, 0.5f, 17);
    w.down_exps_bias = layer->add("down_b", {d, e}, T::F32, 0.5f, 18);
  }
  if (c.n_ff_shexp > 0) {
    w.gate_shexp = layer->add("gate_sh", {d, c.n_ff_shexp}, c.gate_type, in_scale, 19);
    w.up_shexp = layer->add("up_sh", {d, c.n_ff_shexp}, c.up_type, in_scale, 20);
    w.down_shexp = layer->add("down_sh", {c.n_ff_shexp, d}, c.down_type,
                              std::sqrt(3.0f / static_cast<float>(c.n_ff_shexp)), 21);
    if (c.shexp_gate) w.shexp_gate = layer->add("shexp_gate", {d}, T::F32, in_scale, 22);
  }
  return layer;
}

bool is_quantised(const TensorInfo* t) {
  const auto type = static_cast<T>(t->ggml_type);
  return type != T::F32 && type != T::F16 && type != T::BF16;
}

// The contract of issue 36 evaluated directly, in double, over the decoded weights; the
// device rounding (int8 inputs of quantised expert matrices) applied with round_through_q8
// when emulating.
std::vector<float> reference_moe(const Layer& l, const LayerCase& c, const std::vector<float>& x,
                                 std::vector<uint32_t>& counts) {
  const ExpertConfig& m = c.moe;
  const int64_t d = c.n_embd, f = m.n_ff_exp, n_expert = m.n_expert, k = m.n_expert_used;
  const LayerWeights& w = l.weights;
  const auto router = l.values(w.router), gate = l.values(w.gate_exps), up = l.values(w.up_exps),
             down = l.values(w.down_exps), router_b = l.values(w.router_bias),
             gate_b = l.values(w.gate_exps_bias), up_b = l.values(w.up_exps_bias),
             down_b = l.values(w.down_exps_bias);
  auto matvec = [](const float* mat, int64_t rows, int64_t cols, const std::vector<float>& in) {
    std::vector<double> y(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t i = 0; i < cols; ++i) s += static_cast<double>(mat[r * cols + i]) * in[i];
      y[r] = s;
    }
    return y;
  };
  auto rounded = [&](std::vector<float> v, bool quantised, cpu::Q8Rounding rule) {
    if (c.emulate && quantised)
      cpu::round_through_q8(v.data(), static_cast<int64_t>(v.size()), rule);
    return v;
  };
  auto act = [&](double g, double u, bool clamped) {
    if (!clamped) return g / (1.0 + std::exp(-g)) * u;
    g = std::min(g, 7.0);
    u = std::clamp(u, -7.0, 7.0);
    return g / (1.0 + std::exp(-1.702 * g)) * (u + 1.0);
  };
  std::vector<float> out(x.size());
  counts.assign(static_cast<size_t>(n_expert), 0);
  for (int64_t t = 0; t < c.n_tokens; ++t) {
    const std::vector<float> xt(x.begin() + t * d, x.begin() + (t + 1) * d);
    std::vector<double> logits = matvec(router.data(), n_expert, d, xt);
    for (int64_t e = 0; e < n_expert; ++e) logits[e] += router_b.empty() ? 0.0 : router_b[e];
    std::vector<double> p = logits;
    if (m.gating == ExpertGating::Softmax) {
      const double mx = *std::max_element(p.begin(), p.end());
      double z = 0;
      for (double& v : p) z += (v = std::exp(v - mx));
      for (double& v : p) v /= z;
    } else if (m.gating == ExpertGating::Sigmoid) {
      for (double& v : p) v = 1.0 / (1.0 + std::exp(-v));
    }
    std::vector<int32_t> order(static_cast<size_t>(n_expert));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
    std::vector<double> wk(static_cast<size_t>(k));
    for (int64_t i = 0; i < k; ++i) wk[i] = p[order[i]];
    if (m.gating == ExpertGating::SoftmaxOfTopK) {
      double z = 0;
      for (double& v : wk) z += (v = std::exp(v - p[order[0]]));
      for (double& v : wk) v /= z;
    }
    if (m.normalize_weights) {
      const double z = std::accumulate(wk.begin(), wk.end(), 0.0);
      for (double& v : wk) v /= z;
    }
    for (double& v : wk) v *= m.weights_scale;
    std::vector<double> acc(static_cast<size_t>(d), 0.0);
    const std::vector<float> x_gate =
        rounded(xt, is_quantised(w.gate_exps), cpu::Q8Rounding::MultiplyByInverse);
    const std::vector<float> x_up =
        rounded(xt, is_quantised(w.up_exps), cpu::Q8Rounding::MultiplyByInverse);
    for (int64_t i = 0; i < k; ++i) {
      const int32_t e = order[i];
      ++counts[e];
      std::vector<double> g = matvec(gate.data() + e * f * d, f, d, x_gate);
      std::vector<double> u = matvec(up.data() + e * f * d, f, d, x_up);
      std::vector<float> h(static_cast<size_t>(f));
      for (int64_t j = 0; j < f; ++j) {
        const double gb = gate_b.empty() ? 0.0 : gate_b[e * f + j];
        const double ub = up_b.empty() ? 0.0 : up_b[e * f + j];
        h[j] = static_cast<float>(
            act(g[j] + gb, u[j] + ub, c.activation == FfnActivation::SwigluClamped));
      }
      h = rounded(h, is_quantised(w.down_exps), cpu::Q8Rounding::Divide);
      std::vector<double> y = matvec(down.data() + e * d * f, d, f, h);
      for (int64_t j = 0; j < d; ++j)
        acc[j] += wk[i] * (y[j] + (down_b.empty() ? 0.0 : down_b[e * d + j]));
    }
    if (w.gate_shexp) {
      const int64_t fs = w.gate_shexp->dims[1];
      const auto gs = l.values(w.gate_shexp), us = l.values(w.up_shexp),
                 ds = l.values(w.down_shexp);
      const auto gi =
          matvec(gs.data(), fs, d,
                 rounded(xt, is_quantised(w.gate_shexp), cpu::Q8Rounding::MultiplyByInverse));
      const auto ui =
          matvec(us.data(), fs, d,
                 rounded(xt, is_quantised(w.up_shexp), cpu::Q8Rounding::MultiplyByInverse));
      std::vector<float> h(static_cast<size_t>(fs));
      for (int64_t j = 0; j < fs; ++j) h[j] = static_cast<float>(act(gi[j], ui[j], false));
      h = rounded(h, is_quantised(w.down_shexp), cpu::Q8Rounding::Divide);
      const auto y = matvec(ds.data(), d, fs, h);
      double scale = 1.0;
      if (w.shexp_gate) {
        const auto sg = l.values(w.shexp_gate);
        double s = 0;
        for (int64_t j = 0; j < d; ++j) s += static_cast<double>(sg[j]) * xt[j];
        scale = 1.0 / (1.0 + std::exp(-s));
      }
      for (int64_t j = 0; j < d; ++j) acc[j] += y[j] * scale;
    }
    for (int64_t j = 0; j < d; ++j) out[t * d + j] = static_cast<float>(acc[j]);
  }
  return out;
}

ExpertConfig expert_config(int64_t n_expert, int64_t k, int64_t n_ff_exp, ExpertGating gating,
                           bool normalize, float scale = 1.0f) {
  ExpertConfig m;
  m.n_expert = n_expert;
  m.n_expert_used = k;
  m.n_ff_exp = n_ff_exp;
  m.gating = gating;
  m.normalize_weights = normalize;
  m.weights_scale = scale;
  return m;
}

std::vector<LayerCase> layer_cases() {
  std::vector<LayerCase> cases;
  {
    LayerCase c{.name = "qwen3moe_softmax_normalised",
                .moe = expert_config(8, 2, 32, ExpertGating::Softmax, true)};
    cases.push_back(c);
  }
  {
    LayerCase c{.name = "gpt_oss_topk_softmax_biases_clamped",
                .moe = expert_config(6, 3, 64, ExpertGating::SoftmaxOfTopK, false),
                .activation = FfnActivation::SwigluClamped,
                .biases = true,
                .weight_scale = 6.0f};
    cases.push_back(c);
  }
  {
    LayerCase c{.name = "sigmoid_scaled_shared_expert",
                .moe = expert_config(16, 4, 32, ExpertGating::Sigmoid, true, 2.5f),
                .n_ff_shexp = 96,
                .shexp_gate = true};
    cases.push_back(c);
  }
  {
    LayerCase c{.name = "one_token_top1_unnormalised",
                .moe = expert_config(4, 1, 32, ExpertGating::Softmax, false),
                .n_tokens = 1};
    cases.push_back(c);
  }
  {  // more tokens than a chunk of the expert loop (64)
    LayerCase c{.name = "prefill_150_tokens",
                .moe = expert_config(8, 2, 32, ExpertGating::Softmax, true),
                .n_tokens = 150};
    cases.push_back(c);
  }
  {  // the device rounding contract: int8 inputs of quantised gate/up, f32 router
    LayerCase c{.name = "emulated_mxfp4_q8_0_gate_up",
                .moe = expert_config(8, 2, 256, ExpertGating::Softmax, true),
                .gate_type = T::MXFP4,
                .up_type = T::Q8_0,
                .down_type = T::F16,
                .n_ff_shexp = 256,
                .emulate = true};
    cases.push_back(c);
  }
  {  // and of a quantised down projection (Divide)
    LayerCase c{.name = "emulated_q4_k_down",
                .moe = expert_config(8, 2, 256, ExpertGating::Softmax, true),
                .gate_type = T::Q8_0,
                .up_type = T::Q8_0,
                .down_type = T::Q4_K,
                .n_ff_shexp = 256,
                .emulate = true,
                .tolerance = 3e-3};
    cases.push_back(c);
  }
  {  // float experts read f32 activations even when emulating
    LayerCase c{.name = "emulated_f16_experts_unrounded",
                .moe = expert_config(8, 2, 32, ExpertGating::Softmax, true),
                .gate_type = T::F16,
                .up_type = T::F16,
                .down_type = T::BF16,
                .emulate = true};
    cases.push_back(c);
  }
  return cases;
}

class MoeLayer : public ::testing::TestWithParam<LayerCase> {};
void PrintTo(const LayerCase& c, std::ostream* os) { *os << c.name; }

// The case: MoeFfn's output equals the contract evaluated in double over the same weights,
// within f32 summation error, and its routing counts are the reference's.
TEST_P(MoeLayer, MatchesTheContractEvaluatedInDouble) {
  const LayerCase& c = GetParam();
  auto layer = make_layer(c);
  const std::vector<float> x = random_values(static_cast<size_t>(c.n_tokens * c.n_embd), 3, 1.7f);
  std::vector<uint32_t> expected_counts;
  const std::vector<float> expected = reference_moe(*layer, c, x, expected_counts);

  cpu::ThreadPool pool(2);
  cpu::MoeFfn ffn(layer->config, layer->weights);
  std::vector<float> out(x.size());
  std::vector<uint32_t> counts(static_cast<size_t>(c.moe.n_expert), 0);
  ffn.run(x.data(), c.n_tokens, out.data(), pool, {.emulate_device = c.emulate}, counts.data());
  EXPECT_EQ(counts, expected_counts);
  double worst = 0, norm = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(out[i]) - expected[i]));
    norm = std::max(norm, std::fabs(static_cast<double>(expected[i])));
  }
  EXPECT_GT(norm, 0.1);
  EXPECT_LE(worst / norm, c.tolerance) << c.name;
  // Batch-invariant: each token alone gives the same bits.
  for (int64_t t = 0; t < c.n_tokens; t += std::max<int64_t>(1, c.n_tokens / 5)) {
    std::vector<float> alone(static_cast<size_t>(c.n_embd));
    ffn.run(x.data() + t * c.n_embd, 1, alone.data(), pool, {.emulate_device = c.emulate}, nullptr);
    EXPECT_EQ(std::memcmp(alone.data(), out.data() + t * c.n_embd, alone.size() * sizeof(float)), 0)
        << c.name << " token " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, MoeLayer, ::testing::ValuesIn(layer_cases()),
                         [](const auto& info) { return info.param.name; });

// The case: the emulated rounding is really applied (a quantised expert layer differs from its
// f32 evaluation by the int8 error), and float experts are not rounded at all.
TEST(MoeLayerRounding, EmulationChangesQuantisedExpertsOnly) {
  for (const bool quantised : {true, false}) {
    LayerCase c{.name = "x",
                .moe = expert_config(8, 2, 256, ExpertGating::Softmax, true),
                .gate_type = quantised ? T::Q8_0 : T::F32,
                .up_type = quantised ? T::Q8_0 : T::F32,
                .down_type = quantised ? T::Q8_0 : T::F32};
    auto layer = make_layer(c);
    const std::vector<float> x = random_values(static_cast<size_t>(c.n_tokens * c.n_embd), 4);
    cpu::ThreadPool pool(2);
    cpu::MoeFfn ffn(layer->config, layer->weights);
    std::vector<float> exact(x.size()), emulated(x.size());
    ffn.run(x.data(), c.n_tokens, exact.data(), pool, {.emulate_device = false}, nullptr);
    ffn.run(x.data(), c.n_tokens, emulated.data(), pool, {.emulate_device = true}, nullptr);
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i)
      worst = std::max(worst, static_cast<double>(std::fabs(exact[i] - emulated[i])));
    if (quantised) {
      EXPECT_GT(worst, 1e-5);
      EXPECT_LT(worst, 0.05);
    } else {
      EXPECT_EQ(worst, 0.0);
    }
  }
}

// ---- the host's share of a GPU step's experts (cpu/host_experts.h) -------------------------

// The case: HostExperts, given the router's choices of every row and a mask of the experts it
// computes, gives for the whole mask the bits MoeFfn's fast path gives (the same int8 copies,
// inputs and top-k order), zeros for rows that chose none of its experts, and for two masks
// that split the experts two sums that add up to it; for Q4_K / Q6_K experts, gpt-oss's MXFP4
// experts with biases and the clamped SwiGLU, and Q4_0 ones over 9 rows.
class HostExpertsLayer : public ::testing::TestWithParam<LayerCase> {};

TEST_P(HostExpertsLayer, MatchesTheFastPathOverTheChoicesItIsGiven) {
  const LayerCase& c = GetParam();
  if (!cpu::Int8Weights::supports(c.gate_type, c.n_embd))
    GTEST_SKIP() << "no int8 kernels on this CPU";
  auto layer = make_layer(c);
  WeightTable table;
  table.layers.push_back(layer->weights);
  ASSERT_EQ(cpu::HostExperts::refusal(layer->config, table), "");
  cpu::ThreadPool pool(2);
  cpu::FastMatmul fast(table, pool);
  ASSERT_NE(fast.find_expert(layer->weights.gate_exps, 0), nullptr);
  const int64_t d = c.n_embd, n = c.n_tokens, e = c.moe.n_expert, k = c.moe.n_expert_used;
  const std::vector<float> x = random_values(static_cast<size_t>(n * d), 5, 1.3f);
  cpu::MoeFfn ffn(layer->config, layer->weights);
  std::vector<float> want(x.size());
  ffn.run(x.data(), n, want.data(), pool, {.fast = &fast}, nullptr);

  // The router's choices, as MoeFfn makes them.
  std::vector<float> logits(static_cast<size_t>(n * e));
  const TensorInfo* router = layer->weights.router;
  cpu::matmul(static_cast<T>(router->ggml_type), router->data, e, d, x.data(), n, logits.data(),
              &pool);
  const std::vector<float> bias = layer->values(layer->weights.router_bias);
  std::vector<int32_t> ids(static_cast<size_t>(n * k));
  std::vector<float> weights(ids.size());
  for (int64_t t = 0; t < n; ++t) {
    float* row = logits.data() + t * e;
    for (size_t j = 0; j < bias.size(); ++j) row[j] += bias[j];
    cpu::route_token(c.moe, row, ids.data() + t * k, weights.data() + t * k);
  }

  cpu::HostExperts host(layer->config, table, pool);
  EXPECT_EQ(host.expert_bytes(0), (layer->weights.gate_exps->size_bytes +
                                   layer->weights.up_exps->size_bytes +
                                   layer->weights.down_exps->size_bytes) /
                                      static_cast<uint64_t>(e));
  std::vector<float> all(x.size(), NAN);
  const std::vector<uint8_t> every(static_cast<size_t>(e), 1);
  const cpu::HostExperts::Work w =
      host.run(0, n, x.data(), ids.data(), weights.data(), every.data(), all.data(), pool);
  EXPECT_EQ(w.pairs, n * k);
  EXPECT_EQ(std::memcmp(all.data(), want.data(), all.size() * sizeof(float)), 0)
      << "every choice on the host: not the fast path's bits";

  std::vector<uint8_t> even(static_cast<size_t>(e)), odd(static_cast<size_t>(e));
  for (int64_t i = 0; i < e; ++i) (i % 2 ? odd : even)[static_cast<size_t>(i)] = 1;
  std::vector<float> y_even(x.size(), NAN), y_odd(x.size(), NAN);
  const auto we = host.run(0, n, x.data(), ids.data(), weights.data(), even.data(), y_even.data(),
                           pool);
  const auto wo = host.run(0, n, x.data(), ids.data(), weights.data(), odd.data(), y_odd.data(),
                           pool);
  EXPECT_EQ(we.pairs + wo.pairs, n * k);
  EXPECT_EQ(we.experts + wo.experts, w.experts);
  double worst = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(y_even[i]) + y_odd[i] - want[i]));
    norm = std::max(norm, std::fabs(static_cast<double>(want[i])));
  }
  EXPECT_GT(norm, 0.01);
  EXPECT_LE(worst / norm, 1e-5);
  for (int64_t t = 0; t < n; ++t) {
    bool chose_even = false;
    for (int64_t j = 0; j < k; ++j) chose_even |= ids[static_cast<size_t>(t * k + j)] % 2 == 0;
    if (chose_even) continue;
    for (int64_t i = 0; i < d; ++i)
      ASSERT_EQ(y_even[static_cast<size_t>(t * d + i)], 0.0f) << "row " << t;
  }
}

std::vector<LayerCase> host_expert_cases() {
  return {
      {.name = "q4_k_gate_up_q6_k_down",
       .moe = expert_config(8, 2, 256, ExpertGating::Softmax, true),
       .n_embd = 256,
       .n_tokens = 4,
       .gate_type = T::Q4_K,
       .up_type = T::Q4_K,
       .down_type = T::Q6_K},
      {.name = "gpt_oss_mxfp4_biases_clamped",
       .moe = expert_config(8, 4, 128, ExpertGating::SoftmaxOfTopK, false),
       .activation = FfnActivation::SwigluClamped,
       .n_embd = 128,
       .n_tokens = 3,
       .gate_type = T::MXFP4,
       .up_type = T::MXFP4,
       .down_type = T::MXFP4,
       .biases = true,
       .weight_scale = 6.0f},
      {.name = "q4_0_nine_rows",
       .moe = expert_config(16, 4, 64, ExpertGating::Softmax, true),
       .n_embd = 128,
       .n_tokens = 9,
       .gate_type = T::Q4_0,
       .up_type = T::Q4_0,
       .down_type = T::Q4_0},
  };
}

INSTANTIATE_TEST_SUITE_P(Cases, HostExpertsLayer, ::testing::ValuesIn(host_expert_cases()),
                         [](const auto& info) { return info.param.name; });

TEST(HostExpertsRefusal, ExpertsTheInt8KernelsDoNotRun) {
  LayerCase c{.name = "f32", .moe = expert_config(4, 2, 32, ExpertGating::Softmax, true)};
  auto layer = make_layer(c);
  WeightTable table;
  table.layers.push_back(layer->weights);
  EXPECT_NE(cpu::HostExperts::refusal(layer->config, table), "");
  cpu::ThreadPool pool(1);
  EXPECT_THROW(cpu::HostExperts(layer->config, table, pool), UsageError);
}

// What CudaMoe::setup_host and the fit preview ask before the host computes streamed experts:
// yes with room for the copies; no, with the sizes, when the memory available cannot hold them;
// no for a width the plan kernel cannot copy, or experts the int8 kernels do not run.
TEST(HostExpertsRefusal, StreamedFitNamesWhatStopsIt) {
  const LayerCase c = host_expert_cases().front();
  auto layer = make_layer(c);
  WeightTable table;
  table.layers.push_back(layer->weights);
  const uint64_t GiB = uint64_t{1} << 30;
  const auto fits = cpu::HostExperts::streamed_fit(layer->config, table, 64 * GiB, 128 * GiB);
  EXPECT_EQ(fits.reason, "");
  EXPECT_FALSE(fits.memory_short);
  EXPECT_GT(fits.copy_bytes, 0u);
  EXPECT_LE(fits.copy_bytes, fits.budget_bytes);
  // 1 GiB available, under the reserve (a tenth of 128 GiB): the copies (any size) do not fit.
  const auto short_of_memory = cpu::HostExperts::streamed_fit(layer->config, table, GiB, 128 * GiB);
  EXPECT_TRUE(short_of_memory.memory_short);
  EXPECT_NE(short_of_memory.reason.find("MiB"), std::string::npos) << short_of_memory.reason;
  ModelConfig odd = layer->config;
  odd.n_embd = 30;
  const auto width = cpu::HostExperts::streamed_fit(odd, table, 64 * GiB, 128 * GiB);
  EXPECT_FALSE(width.memory_short);
  EXPECT_NE(width.reason.find("multiple of 4"), std::string::npos) << width.reason;
  LayerCase f32{.name = "f32", .moe = expert_config(4, 2, 32, ExpertGating::Softmax, true)};
  auto plain = make_layer(f32);
  WeightTable plain_table;
  plain_table.layers.push_back(plain->weights);
  const auto refused = cpu::HostExperts::streamed_fit(plain->config, plain_table, 64 * GiB, 128 * GiB);
  EXPECT_EQ(refused.reason, cpu::HostExperts::refusal(plain->config, plain_table));
  EXPECT_FALSE(refused.memory_short);
}

// ---- whole models against llama.cpp -------------------------------------------------------

struct ModelCase {
  std::string name;
  SyntheticModelSpec spec;
};

std::vector<ModelCase> llama_cpp_cases() {
  SyntheticModelSpec wide = SyntheticModelSpec::preset("tiny-qwen3moe");
  wide.n_expert = 16;
  wide.n_expert_used = 4;
  wide.router_scale = 2.0f;
  wide.n_layer = 3;
  wide.seed = 23;
  return {
      {"tiny-qwen3moe", SyntheticModelSpec::preset("tiny-qwen3moe")},
      {"tiny-mixtral", SyntheticModelSpec::preset("tiny-mixtral")},
      {"qwen3moe-16x4", wide},
  };
}

const std::vector<int32_t> kPrompt = {1, 45, 300, 7, 99, 256, 12, 3, 200, 150};
constexpr int kGreedy = 8;

struct CpuModel : test::ModelRuntime {
  CpuModel(const fs::path& path, bool emulate = false) : ModelRuntime(path, options(emulate)) {}
  static RuntimeOptions options(bool emulate) {
    RuntimeOptions o = test::cpu_runtime_options(2, 64);
    o.backend.cpu_emulate_device_numerics = emulate;
    return o;
  }
};

class LlamaCppGolden : public ::testing::TestWithParam<ModelCase> {};
void PrintTo(const ModelCase& c, std::ostream* os) { *os << c.name; }

// The case: llama.cpp's CPU (F32 KV, flash attention off) on the same file: the teacher-forced
// logits at every prompt position within f32 tolerance, and the 8 greedy tokens identical.
TEST_P(LlamaCppGolden, LogitsAndGreedyMatchLlamaCpp) {
  const ModelCase& c = GetParam();
  test::TempModel file(c.spec, c.name);
  const fs::path& model = file.path;
  test::ReferenceGolden g;
  ASSERT_NO_FATAL_FAILURE(test::load_reference_golden(c.name, model, kPrompt, g));
  CpuModel m(model);
  ASSERT_TRUE(m.config.is_moe());
  ASSERT_EQ(g.vocab, m.config.n_vocab);
  const auto [logits, greedy] = m.prompt_and_greedy(g.tokens, kGreedy);
  ASSERT_EQ(logits.size(), g.logits.size());
  const std::vector<double> diffs = test::expect_rows_near(logits, g, 1e-4, c.name);
  const double worst = diffs.empty() ? 0 : *std::max_element(diffs.begin(), diffs.end());
  std::cout << "[llama.cpp] " << c.name << ": max |logit - llama.cpp| " << worst
            << ", greedy identical: " << (greedy == g.greedy ? "yes" : "no") << "\n";
  EXPECT_EQ(greedy, g.greedy) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Synthetic, LlamaCppGolden, ::testing::ValuesIn(llama_cpp_cases()),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           for (auto& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// ---- quantised experts ----------------------------------------------------------------------

struct QuantCase {
  std::string name;
  SyntheticModelSpec spec;
};

// Rows of 256 (the K quants' block) for Mixtral- and Qwen3-MoE-style files.
std::vector<QuantCase> quant_cases() {
  std::vector<QuantCase> out;
  for (const std::string base : {"tiny-mixtral", "tiny-qwen3moe"}) {
    for (const T type : {T::Q4_K, T::Q8_0, T::MXFP4}) {
      SyntheticModelSpec s = SyntheticModelSpec::preset(base);
      s.n_embd = 256;
      s.n_head = 4;
      s.head_dim = base == "tiny-qwen3moe" ? 64 : 0;
      if (base == "tiny-mixtral")
        s.n_ff = 256;
      else
        s.n_ff_exp = 256;
      s.expert_type = type;
      s.weight_type = type == T::Q4_K ? T::Q4_K : T::Q8_0;
      s.embedding_type = T::Q8_0;
      s.output_type = T::Q6_K;
      if (type == T::Q4_K) s.tensor_types = {{"blk.0.ffn_down_exps.weight", T::Q6_K}};
      std::string name = base + "-" + std::string(tensor_type_info(type).name);
      for (auto& ch : name)
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      out.push_back({name, s});
    }
  }
  return out;
}

class QuantisedExperts : public ::testing::TestWithParam<QuantCase> {};
void PrintTo(const QuantCase& c, std::ostream* os) { *os << c.name; }

// The case: a file with quantised experts runs, bit for bit, as its F32 copy holding Granule's
// own decoded values (each expert's slab found and decoded in place).
TEST_P(QuantisedExperts, RunLikeTheirDequantisedF32Copy) {
  const QuantCase& c = GetParam();
  test::TempModel file(c.spec, c.name);
  CpuModel model(file.path);
  const fs::path f32_path = file.path.string() + ".f32.gguf";
  write_f32_copy(*model.file, f32_path);
  CpuModel f32(f32_path);
  const auto [logits, greedy] = model.prompt_and_greedy(kPrompt, kGreedy);
  const auto [f32_logits, f32_greedy] = f32.prompt_and_greedy(kPrompt, kGreedy);
  fs::remove(f32_path);
  ASSERT_EQ(logits.size(), f32_logits.size());
  EXPECT_EQ(std::memcmp(logits.data(), f32_logits.data(), logits.size() * sizeof(float)), 0);
  EXPECT_EQ(greedy, f32_greedy);
}

// The case: the CUDA oracle (emulated device numerics) differs from the f32 reference by the
// int8 activations' error only: percent-level, not zero, not order one.
TEST_P(QuantisedExperts, EmulatedNumericsWithinTheInt8Error) {
  const QuantCase& c = GetParam();
  test::TempModel file(c.spec, c.name);
  CpuModel exact(file.path), oracle(file.path, true);
  const std::vector<float> a = exact.run(0, kPrompt, 0, true);
  const std::vector<float> b = oracle.run(0, kPrompt, 0, true);
  const double rel = worst_relative(a, b, exact.config.n_vocab);
  std::cout << "[oracle] " << c.name << ": max |oracle - f32| / std " << rel << "\n";
  EXPECT_GT(rel, 1e-4);
  EXPECT_LT(rel, 0.3);
  EXPECT_EQ(oracle.run(1, kPrompt, 0, true), b) << "deterministic";
}

// The case: llama.cpp on the same file (its CPU products quantise activations to 8 bits for
// quantised weights) stays within that rounding's error of the f32 reference, as the CUDA
// oracle does; greedy tokens are printed, not compared (random models have near-tied logits).
TEST_P(QuantisedExperts, WithinActivationRoundingOfLlamaCpp) {
  const QuantCase& c = GetParam();
  test::TempModel file(c.spec, c.name);
  test::ReferenceGolden g;
  ASSERT_NO_FATAL_FAILURE(test::load_reference_golden("moe-" + c.name, file.path, kPrompt, g));
  CpuModel exact(file.path), oracle(file.path, true);
  const auto [a, greedy] = exact.prompt_and_greedy(kPrompt, kGreedy);
  const auto [b, oracle_greedy] = oracle.prompt_and_greedy(kPrompt, kGreedy);
  ASSERT_EQ(a.size(), g.logits.size());
  const double rel = worst_relative(a, g.logits, g.vocab);
  const double rel_oracle = worst_relative(b, g.logits, g.vocab);
  auto agree = [&](const std::vector<int32_t>& t) {
    size_t n = 0;
    while (n < t.size() && n < g.greedy.size() && t[n] == g.greedy[n]) ++n;
    return n;
  };
  std::cout << "[llama.cpp] " << c.name << ": max |f32 - llama.cpp| / std " << rel
            << ", |oracle - llama.cpp| / std " << rel_oracle << "; greedy prefix agreeing "
            << agree(greedy) << "/8 (f32), " << agree(oracle_greedy) << "/8 (oracle)\n";
  // A token whose k-th and (k+1)-th experts nearly tie may route differently under either
  // rounding: its row then differs by order one. Most rows must be within the rounding error.
  int64_t close_rows = 0;
  for (int64_t r = 0; r < g.rows; ++r) {
    const size_t off = static_cast<size_t>(r * g.vocab);
    const std::vector<float> ra(a.begin() + off, a.begin() + off + g.vocab);
    const std::vector<float> rg(g.logits.begin() + off, g.logits.begin() + off + g.vocab);
    const double row_rel = worst_relative(ra, rg, g.vocab);
    if (row_rel < 0.2)
      ++close_rows;
    else
      std::cout << "  row " << r << ": " << row_rel << "\n";
  }
  EXPECT_GE(close_rows, g.rows - 1);
}

INSTANTIATE_TEST_SUITE_P(Files, QuantisedExperts, ::testing::ValuesIn(quant_cases()),
                         [](const auto& info) { return info.param.name; });

// The case: several sequences in one batch give the logits each gives alone (experts grouped
// across the batch change no bits).
TEST(CpuMoeBackend, BatchedSequencesEqualEachAlone) {
  test::TempModel file(SyntheticModelSpec::preset("tiny-qwen3moe"), "moe-batch");
  CpuModel batched(file.path), alone(file.path);
  const std::vector<int32_t> a = {1, 45, 300, 7, 99}, b = {1, 260, 261, 262};
  ASSERT_TRUE(batched.kv->map_through(0, 5));
  ASSERT_TRUE(batched.kv->map_through(1, 4));
  std::vector<float> logits;
  const std::vector<BatchSequence> batch = {{0, a, 0, true}, {1, b, 0, true}};
  batched.backend->forward(batch, logits);
  const std::vector<float> la = alone.run(0, a, 0, true);
  const std::vector<float> lb = alone.run(1, b, 0, true);
  std::vector<float> expected = la;
  expected.insert(expected.end(), lb.begin(), lb.end());
  ASSERT_EQ(logits.size(), expected.size());
  EXPECT_EQ(std::memcmp(logits.data(), expected.data(), logits.size() * sizeof(float)), 0);
}

// The case: Device Auto opens a mixture of experts whose heads (16) the CUDA kernels do not
// take on the CPU on every machine (on a GPU machine, the fallback), with the CPU backend's
// logits, and its fit estimate counts every expert's bytes.
TEST(CpuMoeEngine, AutoRunsOnTheCpuAndTheEstimateCountsEveryExpert) {
  test::TempModel file(SyntheticModelSpec::preset("tiny-mixtral"), "moe-engine");
  EngineOptions options;
  options.device = DeviceKind::Auto;
  options.context_length = 64;
  options.max_sequences = 2;
  options.cpu_threads = 2;
  std::unique_ptr<Engine> engine;
  ASSERT_NO_THROW(engine = Engine::open(file.path, options));
  EXPECT_EQ(engine->device_name().rfind("CPU", 0), 0u) << engine->device_name();
  const std::vector<int32_t> tokens = {1, 45, 300, 7};
  const auto logits = engine->logits_for(tokens);
  ASSERT_EQ(logits.size(), tokens.size());
  CpuModel direct(file.path);
  const std::vector<float> expected = direct.run(0, tokens, 0, true);
  const auto vocab = static_cast<size_t>(direct.config.n_vocab);
  for (size_t r = 0; r < tokens.size(); ++r)
    EXPECT_EQ(logits[r],
              std::vector<float>(expected.begin() + r * vocab, expected.begin() + (r + 1) * vocab));

  const FitEstimate fit = Engine::estimate(file.path, options);
  EXPECT_FALSE(fit.gpu);
  uint64_t tensor_bytes = 0;
  for (const TensorInfo& t : direct.file->tensors()) tensor_bytes += t.size_bytes;
  EXPECT_EQ(fit.weights_bytes, tensor_bytes);
}

// The case: the CPU backend reports its routing to the telemetry (the window's expert panel):
// every expert resident, each token's top-k choices counted once per layer, nothing streamed.
TEST(CpuMoeEngine, TelemetryCountsEveryRoutingChoice) {
  test::TempModel file(SyntheticModelSpec::preset("tiny-qwen3moe"), "moe-telemetry");
  EngineOptions options;
  options.device = DeviceKind::Cpu;
  options.context_length = 64;
  options.max_sequences = 2;
  options.cpu_threads = 2;
  std::unique_ptr<Engine> engine = Engine::open(file.path, options);
  const std::vector<int32_t> tokens = {1, 45, 300, 7, 99};
  engine->logits_for(tokens);
  const ExpertTelemetry first = engine->telemetry().experts;
  CpuModel direct(file.path);
  const ModelConfig& c = direct.config;
  ASSERT_EQ(first.n_layer, c.n_layer);
  ASSERT_EQ(first.n_expert, c.moe.n_expert);
  EXPECT_EQ(first.resident_count(), c.n_layer * c.moe.n_expert);
  uint64_t choices = 0;
  for (uint32_t n : first.routed) choices += n;
  const auto expected = static_cast<uint64_t>(tokens.size() * c.n_layer * c.moe.n_expert_used);
  EXPECT_EQ(choices, expected);
  EXPECT_EQ(first.hits, expected);
  EXPECT_EQ(first.misses, 0u);
  EXPECT_EQ(first.bytes_streamed, 0u);
  EXPECT_EQ(first.tokens, tokens.size());
  EXPECT_GT(first.expert_bytes, 0u);
  // Snapshots are cumulative: a second pass adds as many choices.
  engine->logits_for(tokens);
  EXPECT_EQ(engine->telemetry().experts.hits, 2 * expected);
}

}  // namespace
}  // namespace granule
