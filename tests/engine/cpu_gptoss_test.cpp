// gpt-oss on the CPU reference backend (issue 36): its attention config read from GGUF (sinks,
// output bias, sliding-window layers and their pattern, YaRN), YaRN's rope against ggml's
// formula, the sink in the softmax, the window in a whole forward pass, Device Auto on the CPU
// where CUDA refuses the file (head size 32: tests/gpu/gptoss_gpu_test.cpp runs gpt-oss on the
// GPU at head size 64); whole synthetic gpt-oss files (and YaRN on a dense
// Qwen2 file) against llama.cpp's CPU logits and greedy tokens (tests/data/reference/<case>.txt,
// from tests/reference/make_llama_cpp_goldens.sh); the synthetic writer's router skew, measured
// as routing counts per expert on the CPU; and its random-block mode.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <numeric>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/moe_ffn.h"
#include "backends/cpu/ops.h"
#include "backends/cpu/thread_pool.h"
#include "granule/engine.h"
#include "granule/error.h"
#include "granule/gguf.h"
#include "granule/model_config.h"
#include "granule/quant.h"
#include "granule/testkit/synthetic_model.h"
#include "model/rope.h"
#include "support/model_runtime.h"
#include "support/reference_golden.h"
#include "support/temp_model.h"

namespace granule {
namespace {

namespace fs = std::filesystem;
using T = TensorType;

struct Loaded {
  test::TempModel file;
  std::unique_ptr<ModelFile> model;
  ModelConfig config;
  WeightTable weights;
  explicit Loaded(const SyntheticModelSpec& spec)
      : file(spec, "gptoss"),
        model(ModelFile::open(file.path)),
        config(ModelConfig::from_gguf(*model)),
        weights(WeightTable::from_gguf(*model, config)) {}
};

// ---- config ---------------------------------------------------------------------------------

// The case: tiny-gpt-oss is read as llama.cpp reads gpt-oss: NeoX rope, YaRN, sinks, output
// bias, and the even layers sliding (load_swa_pattern(ml, 2)).
TEST(GptOssConfig, AttentionKeysAndTensors) {
  Loaded m(SyntheticModelSpec::preset("tiny-gpt-oss"));
  const ModelConfig& c = m.config;
  EXPECT_EQ(c.architecture, "gpt-oss");
  EXPECT_EQ(c.rope_ordering, RopeOrdering::NeoX);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_NE(c.n_head * c.head_dim, c.n_embd);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.attn_sinks);
  EXPECT_TRUE(c.attn_output_bias);
  EXPECT_EQ(c.rope_scaling.type, "yarn");
  EXPECT_EQ(c.rope_scaling.factor, 32.0f);
  EXPECT_EQ(c.rope_scaling.original_context, 128);
  EXPECT_EQ(c.rope_scaling.yarn_beta_fast, 32.0f);
  EXPECT_EQ(c.rope_scaling.yarn_beta_slow, 1.0f);
  EXPECT_EQ(c.sliding_window, 8);
  EXPECT_EQ(c.swa_layers, (std::vector<bool>{true, false, true}));
  EXPECT_TRUE(c.layer_slides(0));
  EXPECT_FALSE(c.layer_slides(1));
  EXPECT_FALSE(c.layer_slides(3)) << "past the last layer";
  for (const LayerWeights& l : m.weights.layers) {
    ASSERT_NE(l.bo, nullptr);
    EXPECT_EQ(l.bo->dims, (std::vector<int64_t>{64}));
    ASSERT_NE(l.attn_sinks, nullptr);
    EXPECT_EQ(l.attn_sinks->dims, (std::vector<int64_t>{4}));
  }
  // The byte count includes the attention extras.
  uint64_t extras = 0;
  for (const LayerWeights& l : m.weights.layers)
    extras += l.bo->size_bytes + l.attn_sinks->size_bytes;
  uint64_t tensors = 0;
  for (const TensorInfo& t : m.model->tensors()) tensors += t.size_bytes;
  EXPECT_EQ(m.weights.total_bytes(), tensors) << "every tensor counted, extras " << extras;
}

// The case: attention.sliding_window_pattern as a period and as a per-layer bool array.
TEST(GptOssConfig, SlidingWindowPatternKey) {
  SyntheticModelSpec spec = SyntheticModelSpec::preset("tiny-gpt-oss");
  spec.n_layer = 4;
  {
    GgufWriter w = build_synthetic_model(spec);
    w.set("gpt-oss.attention.sliding_window_pattern", GgufValue::u32(3));
    test::TempModel unused(spec, "unused");
    w.write(unused.path);
    auto file = ModelFile::open(unused.path);
    const ModelConfig c = ModelConfig::from_gguf(*file);
    EXPECT_EQ(c.swa_layers, (std::vector<bool>{true, true, false, true}));
  }
  {
    GgufWriter w = build_synthetic_model(spec);
    w.set("gpt-oss.attention.sliding_window_pattern",
          GgufValue::int_array(GgufType::BOOL, {0, 1, 1, 0}));
    test::TempModel unused(spec, "unused");
    w.write(unused.path);
    auto file = ModelFile::open(unused.path);
    const ModelConfig c = ModelConfig::from_gguf(*file);
    EXPECT_EQ(c.swa_layers, (std::vector<bool>{false, true, true, false}));
  }
  {
    GgufWriter w = build_synthetic_model(spec);
    w.set("gpt-oss.attention.sliding_window_pattern", GgufValue::int_array(GgufType::BOOL, {0, 1}));
    test::TempModel unused(spec, "unused");
    w.write(unused.path);
    auto file = ModelFile::open(unused.path);
    EXPECT_THROW(ModelConfig::from_gguf(*file), FormatError) << "one bool per layer";
  }
}

// The case: a gpt-oss file without its window is refused as llama.cpp refuses it, naming the
// key; a separate rope base for the sliding layers is refused rather than ignored.
TEST(GptOssConfig, MissingWindowAndSwaRopeBaseAreClearErrors) {
  SyntheticModelSpec spec = SyntheticModelSpec::preset("tiny-gpt-oss");
  spec.sliding_window = 0;
  test::TempModel no_window(spec, "nowindow");
  auto file = ModelFile::open(no_window.path);
  try {
    ModelConfig::from_gguf(*file);
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("gpt-oss.attention.sliding_window"), std::string::npos);
  }
  GgufWriter w = build_synthetic_model(SyntheticModelSpec::preset("tiny-gpt-oss"));
  w.set("gpt-oss.rope.freq_base_swa", GgufValue::f32(10000.0f));
  test::TempModel swa_base(spec, "swabase");
  w.write(swa_base.path);
  auto file2 = ModelFile::open(swa_base.path);
  EXPECT_THROW(ModelConfig::from_gguf(*file2), UnsupportedError);
}

// The case: the real shape's preset describes gpt-oss-20b.
TEST(GptOssConfig, RealShapePreset) {
  const SyntheticModelSpec s = SyntheticModelSpec::preset("gpt-oss-20b");
  EXPECT_EQ(s.architecture, "gpt-oss");
  EXPECT_EQ(s.n_layer, 24);
  EXPECT_EQ(s.n_embd, 2880);
  EXPECT_EQ(s.n_head, 64);
  EXPECT_EQ(s.n_head_kv, 8);
  EXPECT_EQ(s.head_dim, 64);
  EXPECT_EQ(s.n_expert, 32);
  EXPECT_EQ(s.n_expert_used, 4);
  EXPECT_EQ(s.n_ff_exp, 2880);
  EXPECT_EQ(s.n_vocab, 201088);
  EXPECT_EQ(s.sliding_window, 128);
  EXPECT_TRUE(s.yarn_rope_scaling);
  EXPECT_EQ(s.rope_scaling_factor, 32.0f);
  EXPECT_EQ(s.rope_original_context, 4096);
  EXPECT_EQ(s.expert_type, T::MXFP4);
  EXPECT_TRUE(s.attn_sinks && s.attn_output_bias && s.qkv_bias && s.expert_biases);
}

#ifdef GRANULE_HAVE_CUDA
// The case: the CUDA backend runs gpt-oss's attention (sinks, output bias, sliding windows,
// YaRN) and a dense model with YaRN scaling; the tiny preset's head size 32 its kernels do not
// have, so Device Auto runs that file on the CPU.
TEST(GptOssConfig, CudaBackendRefusesOnlyWhatItDoesNotRun) {
  Loaded oss(SyntheticModelSpec::preset("tiny-gpt-oss"));
  EXPECT_NE(cuda_model_refusal(oss.config, oss.weights).find("head sizes"), std::string::npos);
  SyntheticModelSpec wide = SyntheticModelSpec::preset("tiny-gpt-oss");
  wide.head_dim = 64;
  Loaded oss64(wide);
  EXPECT_EQ(cuda_model_refusal(oss64.config, oss64.weights), "");
  SyntheticModelSpec dense = SyntheticModelSpec::preset("small-256");
  dense.architecture = "qwen2";
  dense.yarn_rope_scaling = true;
  dense.rope_scaling_factor = 4.0f;
  dense.rope_original_context = 512;
  Loaded yarn(dense);
  EXPECT_EQ(yarn.config.rope_scaling.type, "yarn");
  EXPECT_EQ(cuda_model_refusal(yarn.config, yarn.weights), "");
}
#endif

// ---- rope -----------------------------------------------------------------------------------

// ggml's rope_yarn for one pair, transcribed in float (ggml-cpu/ops.cpp: theta_scale powers,
// ramp over i0/2, theta_interp/theta_extrap mix, mscale on cos and sin).
void ggml_yarn_reference(int64_t head_dim, float base, const RopeScaling& s, int64_t position,
                         std::vector<float>& cosines, std::vector<float>& sines) {
  const float freq_scale = 1.0f / s.factor;
  auto corr_dim = [&](float n_rot) {
    return static_cast<float>(head_dim) *
           std::log(static_cast<float>(s.original_context) / (n_rot * 2.0f * 3.14159265358979f)) /
           (2.0f * std::log(base));
  };
  const float low = std::max(0.0f, std::floor(corr_dim(s.yarn_beta_fast)));
  const float high =
      std::min(static_cast<float>(head_dim) - 1.0f, std::ceil(corr_dim(s.yarn_beta_slow)));
  // llama-context.cpp: yarn_attn_factor = get_mscale(factor) / (1 + 0.1 ln factor) * attn_factor
  const float attn_factor = (0.1f * std::log(s.factor) + 1.0f) *
                            (1.0f / (1.0f + 0.1f * std::log(s.factor))) * s.attn_factor;
  const float theta_scale = std::pow(base, -2.0f / static_cast<float>(head_dim));
  float theta_extrap = static_cast<float>(position);
  cosines.assign(static_cast<size_t>(head_dim / 2), 0.0f);
  sines.assign(static_cast<size_t>(head_dim / 2), 0.0f);
  for (int64_t i0 = 0; i0 < head_dim; i0 += 2) {
    const float y = (static_cast<float>(i0 / 2) - low) / std::max(0.001f, high - low);
    const float ramp_mix = 1.0f - std::min(1.0f, std::max(0.0f, y));
    const float theta_interp = freq_scale * theta_extrap;
    const float theta = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
    const float mscale = attn_factor * (1.0f + 0.1f * std::log(1.0f / freq_scale));
    cosines[static_cast<size_t>(i0 / 2)] = std::cos(theta) * mscale;
    sines[static_cast<size_t>(i0 / 2)] = std::sin(theta) * mscale;
    theta_extrap *= theta_scale;
  }
}

// The case: the correction range of gpt-oss-20b (head 64, base 150000, original 4096,
// betas 32 / 1) is pairs 8 to 18, and the magnitude is 1 + 0.1 ln 32.
TEST(GptOssRope, YarnCorrectionRangeAndMagnitudeOfGptOss20b) {
  RopeScaling s;
  s.type = "yarn";
  s.factor = 32.0f;
  s.original_context = 4096;
  const YarnCorrection r = yarn_correction(64, 150000.0f, s);
  EXPECT_EQ(r.low, 8.0f);
  EXPECT_EQ(r.high, 18.0f);
  EXPECT_EQ(yarn_ramp(r, 0), 1.0);
  EXPECT_EQ(yarn_ramp(r, 8), 1.0);
  EXPECT_DOUBLE_EQ(yarn_ramp(r, 13), 0.5);
  EXPECT_EQ(yarn_ramp(r, 18), 0.0);
  EXPECT_EQ(yarn_ramp(r, 31), 0.0);
  EXPECT_NEAR(rope_magnitude(s), 1.0 + 0.1 * std::log(32.0), 1e-6);
  RopeScaling none;
  EXPECT_EQ(rope_magnitude(none), 1.0f);
}

// The case: rotating with rope_frequencies + rope_magnitude gives ggml's YaRN rotation at
// short and long positions, for the real shape and the tiny one.
TEST(GptOssRope, YarnRotationMatchesGgml) {
  struct Shape {
    int64_t head_dim;
    float base;
    int64_t original;
  };
  for (const Shape sh : {Shape{64, 150000.0f, 4096}, Shape{32, 150000.0f, 128}}) {
    RopeScaling s;
    s.type = "yarn";
    s.factor = 32.0f;
    s.original_context = sh.original;
    const std::vector<double> freqs = rope_frequencies(sh.head_dim, sh.base, s, nullptr);
    const float magnitude = rope_magnitude(s);
    for (const int64_t position : {0, 1, 7, 100, 3000, 60000}) {
      std::vector<float> x = test::random_values(static_cast<size_t>(sh.head_dim), 7);
      std::vector<float> y = x;
      cpu::rope(y.data(), 1, sh.head_dim, position, freqs.data(), RopeOrdering::NeoX, magnitude);
      std::vector<float> cosines, sines;
      ggml_yarn_reference(sh.head_dim, sh.base, s, position, cosines, sines);
      const int64_t half = sh.head_dim / 2;
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = x[static_cast<size_t>(i)], x1 = x[static_cast<size_t>(i + half)];
        const float c = cosines[static_cast<size_t>(i)], sn = sines[static_cast<size_t>(i)];
        // ggml's float angle at position p carries ~p * 1e-7 rad of error; ours is in double.
        const float tol = 2e-5f + 4e-7f * static_cast<float>(position);
        EXPECT_NEAR(y[static_cast<size_t>(i)], x0 * c - x1 * sn, tol) << position << " " << i;
        EXPECT_NEAR(y[static_cast<size_t>(i + half)], x0 * sn + x1 * c, tol)
            << position << " " << i;
      }
    }
  }
}

// ---- attention ------------------------------------------------------------------------------

// The case: a sink is one more logit in the softmax's normaliser, with no value: the output is
// the sink-free output times (sum of exp) / (sum of exp + exp(sink)); -inf is no sink.
TEST(GptOssAttention, SinkTakesMassWithoutValue) {
  const int64_t d = 16, n = 5;
  const auto q = test::random_values(d, 1);
  const auto k = test::random_values(n * d, 2);
  const auto v = test::random_values(n * d, 3);
  std::vector<float> scores(n), plain(d), with_sink(d), none(d);
  cpu::attention_head(q.data(), k.data(), v.data(), d, n, d, scores.data(), plain.data());
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  double sum = 0, max_score = -INFINITY;
  std::vector<double> s(n);
  for (int64_t t = 0; t < n; ++t) {
    double dot = 0;
    for (int64_t i = 0; i < d; ++i) dot += q[i] * k[t * d + i];
    s[t] = dot * scale;
    max_score = std::max(max_score, s[t]);
  }
  const float sink = 0.7f;
  max_score = std::max(max_score, static_cast<double>(sink));
  for (int64_t t = 0; t < n; ++t) sum += std::exp(s[t] - max_score);
  const double kept = sum / (sum + std::exp(sink - max_score));
  cpu::attention_head(q.data(), k.data(), v.data(), d, n, d, scores.data(), with_sink.data(),
                      &sink);
  for (int64_t i = 0; i < d; ++i) EXPECT_NEAR(with_sink[i], plain[i] * kept, 1e-6);
  const float no_sink = -INFINITY;
  cpu::attention_head(q.data(), k.data(), v.data(), d, n, d, scores.data(), none.data(), &no_sink);
  for (int64_t i = 0; i < d; ++i) EXPECT_FLOAT_EQ(none[i], plain[i]);
  const float huge = 80.0f;
  cpu::attention_head(q.data(), k.data(), v.data(), d, n, d, scores.data(), none.data(), &huge);
  for (int64_t i = 0; i < d; ++i) EXPECT_NEAR(none[i], 0.0f, 1e-12);
}

struct CpuModel : test::ModelRuntime {
  CpuModel(const fs::path& path, bool emulate = false) : ModelRuntime(path, options(emulate)) {}
  static RuntimeOptions options(bool emulate) {
    RuntimeOptions o = test::cpu_runtime_options(2, 64);
    o.backend.cpu_emulate_device_numerics = emulate;
    return o;
  }
};

// The case: with one sliding layer of window 8, a position's logits do not depend on tokens 8
// or more positions back (they leave the window), but do on the 7 before it; with the same
// layer attending fully, they depend on all of them.
TEST(GptOssAttention, SlidingLayerSeesOnlyItsWindow) {
  SyntheticModelSpec spec = SyntheticModelSpec::preset("tiny-gpt-oss");
  spec.n_layer = 1;  // layer 0 slides
  test::TempModel file(spec, "window");
  CpuModel m(file.path);
  ASSERT_TRUE(m.config.layer_slides(0));
  std::vector<int32_t> a(12);
  std::iota(a.begin(), a.end(), 40);
  const int64_t vocab = m.config.n_vocab;
  const std::vector<float> base = m.run(0, a, 0, true);
  auto row = [&](const std::vector<float>& l, int64_t p) {
    return std::vector<float>(l.begin() + p * vocab, l.begin() + (p + 1) * vocab);
  };
  std::vector<int32_t> b = a;
  b[2] = 300;  // out of the window of positions >= 10
  const std::vector<float> changed = m.run(1, b, 0, true);
  EXPECT_EQ(row(changed, 10), row(base, 10));
  EXPECT_EQ(row(changed, 11), row(base, 11));
  EXPECT_NE(row(changed, 9), row(base, 9)) << "position 9 still sees position 2";

  // The same file with the layer attending fully (a pattern that slides no layer).
  GgufWriter w = build_synthetic_model(spec);
  w.set("gpt-oss.attention.sliding_window_pattern", GgufValue::int_array(GgufType::BOOL, {0}));
  test::TempModel full_file(spec, "full");
  w.write(full_file.path);
  CpuModel full(full_file.path);
  ASSERT_FALSE(full.config.layer_slides(0));
  const std::vector<float> full_base = full.run(0, a, 0, true);
  const std::vector<float> full_changed = full.run(1, b, 0, true);
  EXPECT_NE(row(full_changed, 11), row(full_base, 11));
  // Before the window fills, sliding and full attention agree.
  EXPECT_EQ(row(full_base, 7), row(base, 7));
  EXPECT_NE(row(full_base, 8), row(base, 8));
}

// The case: decoding one token at a time past the window gives the prompt pass's logits (the
// window is applied the same way to cached and batched positions).
TEST(GptOssAttention, DecodeMatchesPrefillPastTheWindow) {
  test::TempModel file(SyntheticModelSpec::preset("tiny-gpt-oss"), "decode");
  CpuModel m(file.path);
  std::vector<int32_t> prompt(20);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>(7 + 13 * i % 300);
  const int64_t vocab = m.config.n_vocab;
  const std::vector<float> all = m.run(0, prompt, 0, true);
  m.run(1, {prompt.begin(), prompt.begin() + 4}, 0, false);
  for (size_t p = 4; p < prompt.size(); ++p) {
    const std::vector<float> row = m.run(1, {prompt[p]}, static_cast<int64_t>(p), false);
    for (int64_t v = 0; v < vocab; ++v) {
      ASSERT_NEAR(row[static_cast<size_t>(v)], all[p * static_cast<size_t>(vocab) + v], 1e-4)
          << "position " << p;
    }
  }
}

// The case: the engine opens a gpt-oss file with Device Auto on the CPU (CUDA refuses the
// preset's head size 32), with the CPU backend's logits; Device Cuda is a DeviceError — where a
// GPU is present, the CUDA backend's refusal — or, in a build without CUDA, an UnsupportedError.
TEST(GptOssEngine, AutoRunsOnTheCpuAndCudaRefuses) {
  SyntheticModelSpec spec = SyntheticModelSpec::preset("tiny-gpt-oss");
  test::TempModel file(spec, "gptoss-engine");
  EngineOptions options;
  options.device = DeviceKind::Auto;
  options.context_length = 64;
  options.max_sequences = 2;
  options.cpu_threads = 2;
  options.cpu_exact_numerics = true;  // as the direct backend below (cpu_runtime_options)
  std::unique_ptr<Engine> engine;
  ASSERT_NO_THROW(engine = Engine::open(file.path, options));
  EXPECT_EQ(engine->device_name().rfind("CPU", 0), 0u) << engine->device_name();
  const std::vector<int32_t> tokens = {1, 45, 300, 7, 99, 256, 12, 3, 200, 150, 17, 64};
  const auto logits = engine->logits_for(tokens);
  ASSERT_EQ(logits.size(), tokens.size());
  CpuModel direct(file.path);
  const std::vector<float> expected = direct.run(0, tokens, 0, true);
  const auto vocab = static_cast<size_t>(direct.config.n_vocab);
  for (size_t r = 0; r < tokens.size(); ++r)
    EXPECT_EQ(logits[r],
              std::vector<float>(expected.begin() + r * vocab, expected.begin() + (r + 1) * vocab));
  engine.reset();

  options.device = DeviceKind::Cuda;
  std::string message;
  try {
    Engine::open(file.path, options);
  } catch (const DeviceError& e) {
    message = e.what();
#ifndef GRANULE_HAVE_CUDA
  } catch (const UnsupportedError& e) {
    message = e.what();
#endif
  }
  EXPECT_FALSE(message.empty()) << "DeviceKind::Cuda opened gpt-oss";
#ifdef GRANULE_HAVE_CUDA
  bool gpu = true;
  try {
    probe_cuda_device();
  } catch (const DeviceError&) {
    gpu = false;
  }
  if (gpu) EXPECT_NE(message.find("head sizes"), std::string::npos) << message;
#endif
}

// ---- whole files against llama.cpp ----------------------------------------------------------

struct ModelCase {
  std::string name;
  SyntheticModelSpec spec;
  double tolerance;  // max |Δlogit| / max |logit| per position
  bool emulate_device = false;
};

// tiny-gpt-oss in F32: exact to f32 rounding. With MXFP4 experts llama.cpp's CPU rounds the
// experts' inputs through Q8_0 blocks (MXFP4's vec_dot type), so that case runs the CPU with
// the device rounding contract (int8 expert inputs too); the two int8 roundings still differ
// (f16 block scale and Divide for down in the contract), and a near-tie in the router can
// flip an expert: a looser bound, the greedy tokens identical.
// And YaRN alone on a dense Qwen2 file (factor 4 over an original context of 16, so the ramp
// spans several pairs), which llama.cpp scales as it scales gpt-oss.
std::vector<ModelCase> llama_cpp_cases() {
  SyntheticModelSpec yarn = SyntheticModelSpec::preset("tiny-qwen2");
  yarn.yarn_rope_scaling = true;
  yarn.rope_scaling_factor = 4.0f;
  yarn.rope_original_context = 16;
  yarn.rope_theta = 10000.0f;
  yarn.seed = 32;
  return {
      {"tiny-gpt-oss", SyntheticModelSpec::preset("tiny-gpt-oss"), 1e-4},
      {"tiny-gpt-oss-mxfp4", SyntheticModelSpec::preset("tiny-gpt-oss-mxfp4"), 5e-2, true},
      {"tiny-qwen2-yarn", yarn, 1e-4},
  };
}

// 24 tokens: three windows of 8, so the prompt pass already masks by the window.
const std::vector<int32_t> kPrompt = {1,   45, 300, 7,  99, 256, 12, 3,   200, 150, 17,  64,
                                      333, 2,  88,  91, 5,  260, 44, 310, 123, 9,   271, 30};
constexpr int kGreedy = 8;

class LlamaCppGolden : public ::testing::TestWithParam<ModelCase> {};
void PrintTo(const ModelCase& c, std::ostream* os) { *os << c.name; }

// The case: llama.cpp's CPU (F32 KV, flash attention off) on the same file: the teacher-forced
// logits at every prompt position within tolerance, and the 8 greedy tokens identical.
TEST_P(LlamaCppGolden, LogitsAndGreedyMatchLlamaCpp) {
  const ModelCase& c = GetParam();
  test::TempModel file(c.spec, c.name);
  test::ReferenceGolden g;
  ASSERT_NO_FATAL_FAILURE(test::load_reference_golden(c.name, file.path, kPrompt, g));
  CpuModel m(file.path, c.emulate_device);
  ASSERT_EQ(g.vocab, m.config.n_vocab);
  const auto [logits, greedy] = m.prompt_and_greedy(g.tokens, kGreedy);
  ASSERT_EQ(logits.size(), g.logits.size());
  std::vector<double> diffs = test::expect_rows_near(logits, g, c.tolerance, c.name);
  std::sort(diffs.begin(), diffs.end());
  const double worst = diffs.back(), median = diffs[diffs.size() / 2];
  std::cout << "[llama.cpp] " << c.name << ": max |logit - llama.cpp| " << worst
            << " (median over positions " << median
            << "), greedy identical: " << (greedy == g.greedy ? "yes" : "no") << "\n";
  EXPECT_EQ(greedy, g.greedy) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Synthetic, LlamaCppGolden, ::testing::ValuesIn(llama_cpp_cases()),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           for (auto& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// ---- router skew ----------------------------------------------------------------------------

// Routing counts per expert of every layer for typical hidden states: the FFN norm of token
// embeddings (each layer's router sees a normed residual of unit size), routed by the CPU's
// MoeFfn. Returns counts[layer][expert].
std::vector<std::vector<uint32_t>> routing_counts(const SyntheticModelSpec& spec, int64_t tokens) {
  test::TempModel file(spec, "skew");
  auto model = ModelFile::open(file.path);
  const ModelConfig c = ModelConfig::from_gguf(*model);
  const WeightTable w = WeightTable::from_gguf(*model, c);
  const auto d = static_cast<size_t>(c.n_embd);
  std::vector<float> x(static_cast<size_t>(tokens) * d), xn(x.size()), out(x.size());
  for (int64_t t = 0; t < tokens; ++t) {
    cpu::embedding_row(static_cast<TensorType>(w.token_embd->ggml_type), w.token_embd->data,
                       c.n_embd, t % c.n_vocab, x.data() + t * d);
  }
  cpu::ThreadPool pool(2);
  std::vector<std::vector<uint32_t>> counts;
  for (const LayerWeights& l : w.layers) {
    std::vector<float> norm(d);
    dequantize_row(static_cast<TensorType>(l.ffn_norm->ggml_type), l.ffn_norm->data, norm.data(),
                   c.n_embd);
    for (int64_t t = 0; t < tokens; ++t)
      cpu::rms_norm(x.data() + t * d, norm.data(), xn.data() + t * d, c.n_embd, c.rms_eps);
    cpu::MoeFfn ffn(c, l);
    counts.emplace_back(static_cast<size_t>(c.moe.n_expert), 0u);
    ffn.run(xn.data(), tokens, out.data(), pool, {}, counts.back().data());
  }
  return counts;
}

// Least-squares slope of log(count) over log(rank), ranks from 1, counts sorted descending.
double zipf_slope(std::vector<uint32_t> counts) {
  std::sort(counts.rbegin(), counts.rend());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const auto n = static_cast<double>(counts.size());
  for (size_t r = 0; r < counts.size(); ++r) {
    const double lx = std::log(static_cast<double>(r + 1));
    const double ly = std::log(std::max(1.0, static_cast<double>(counts[r])));
    sx += lx, sy += ly, sxx += lx * lx, sxy += lx * ly;
  }
  return (n * sxy - sx * sy) / (n * sxx - sx * sx);
}

// Share of all choices taken by the most popular tenth of the experts.
double top_tenth_share(std::vector<uint32_t> counts) {
  std::sort(counts.rbegin(), counts.rend());
  const size_t top = std::max<size_t>(1, counts.size() / 10);
  const double all = std::accumulate(counts.begin(), counts.end(), 0.0);
  return std::accumulate(counts.begin(), counts.begin() + static_cast<int64_t>(top), 0.0) / all;
}

// The case: router_skew 0 routes about uniformly; router_skew > 0 concentrates the choices on
// a few experts with popularity falling with rank like a power law, on gpt-oss-like (32
// experts, top 4, router biases) and Qwen3-MoE-like (128, top 8, no bias) routers.
TEST(RouterSkew, UniformAndZipfLikeRoutingCounts) {
  struct Shape {
    const char* name;
    SyntheticModelSpec spec;
  };
  SyntheticModelSpec oss = SyntheticModelSpec::preset("tiny-gpt-oss");
  oss.n_embd = 256;
  oss.n_expert = 32;
  oss.n_expert_used = 4;
  oss.n_ff_exp = 32;
  oss.n_layer = 2;
  SyntheticModelSpec qwen = SyntheticModelSpec::preset("tiny-qwen3moe");
  qwen.n_embd = 256;
  qwen.n_expert = 128;
  qwen.n_expert_used = 8;
  qwen.n_ff_exp = 32;
  qwen.n_layer = 2;
  constexpr int64_t kTokens = 4000;
  for (const Shape& shape : {Shape{"gpt-oss-like", oss}, Shape{"qwen3moe-like", qwen}}) {
    for (const float skew : {0.0f, 1.0f, 2.0f}) {
      SyntheticModelSpec spec = shape.spec;
      spec.n_vocab = kTokens;
      spec.router_skew = skew;
      const auto counts = routing_counts(spec, kTokens);
      const double uniform_share =
          std::max<double>(1, static_cast<double>(spec.n_expert) / 10) / spec.n_expert;
      for (size_t layer = 0; layer < counts.size(); ++layer) {
        const auto& c = counts[layer];
        const double mean = static_cast<double>(kTokens * spec.n_expert_used) / spec.n_expert;
        const auto [lo, hi] = std::minmax_element(c.begin(), c.end());
        const double share = top_tenth_share(c), slope = zipf_slope(c);
        std::cout << "[routing] " << shape.name << " skew " << skew << " layer " << layer
                  << ": max/mean " << *hi / mean << ", min/mean " << *lo / mean
                  << ", top tenth of experts " << 100 * share << "% of choices (uniform "
                  << 100 * uniform_share << "%), log-log slope " << slope << "\n";
        ASSERT_EQ(std::accumulate(c.begin(), c.end(), 0.0), kTokens * spec.n_expert_used);
        if (skew == 0.0f) {
          EXPECT_LT(*hi / mean, 1.6) << shape.name;
          EXPECT_GT(*lo / mean, 0.5) << shape.name;
          EXPECT_GT(slope, -0.35) << shape.name;
        } else {
          EXPECT_GT(share, 2.0 * uniform_share) << shape.name << " skew " << skew;
          EXPECT_LT(slope, -0.6 * skew) << shape.name << " skew " << skew;
        }
      }
      if (skew > 0.0f && counts.size() > 1) {  // each layer has its own popular experts
        const auto hot0 = std::max_element(counts[0].begin(), counts[0].end()) - counts[0].begin();
        const auto hot1 = std::max_element(counts[1].begin(), counts[1].end()) - counts[1].begin();
        EXPECT_NE(hot0, hot1) << shape.name;
      }
    }
  }
}

// ---- the writer's random-block mode (granule-write-model) ------------------------------------

// Root mean square of a tensor's decoded values.
double tensor_rms(const TensorInfo& t) {
  std::vector<float> v(static_cast<size_t>(t.elements()));
  dequantize_row(static_cast<TensorType>(t.ggml_type), t.data, v.data(), t.elements());
  double sum = 0;
  for (float x : v) {
    EXPECT_TRUE(std::isfinite(x)) << t.name;
    sum += static_cast<double>(x) * x;
  }
  return std::sqrt(sum / static_cast<double>(v.size()));
}

// The case: random_blocks writes the same tensors, types and shapes as the seeded writer, its
// large tensors decode to finite values of the same size (RMS within 5%) but other values, the
// bytes do not depend on how write() slices rows among threads (write() and to_bytes() agree),
// and the file runs: finite logits on the CPU.
TEST(RandomBlocks, ValidBlocksOfTheSeededMagnitude) {
  SyntheticModelSpec spec = SyntheticModelSpec::preset("tiny-gpt-oss-mxfp4");
  spec.n_embd = 256;
  spec.n_ff_exp = 512;
  spec.n_expert = 32;
  spec.n_vocab = 4096;
  spec.embedding_type = T::Q8_0;
  spec.output_type = T::Q6_K;
  spec.n_layer = 2;
  test::TempModel seeded(spec, "seeded");
  spec.random_blocks = true;
  test::TempModel random(spec, "random");
  EXPECT_EQ(build_synthetic_model(spec).to_bytes().size(), fs::file_size(random.path));
  {
    const std::vector<uint8_t> bytes = build_synthetic_model(spec).to_bytes();
    std::ifstream in(random.path, std::ios::binary);
    const std::vector<uint8_t> on_disk((std::istreambuf_iterator<char>(in)),
                                       std::istreambuf_iterator<char>());
    EXPECT_TRUE(bytes == on_disk) << "write() and to_bytes() differ";
  }
  auto a = ModelFile::open(seeded.path);
  auto b = ModelFile::open(random.path);
  ASSERT_EQ(a->tensors().size(), b->tensors().size());
  int large = 0;
  for (size_t i = 0; i < a->tensors().size(); ++i) {
    const TensorInfo& ta = a->tensors()[i];
    const TensorInfo& tb = b->tensors()[i];
    ASSERT_EQ(ta.name, tb.name);
    EXPECT_EQ(ta.dims, tb.dims) << ta.name;
    EXPECT_EQ(ta.ggml_type, tb.ggml_type) << ta.name;
    const bool same = std::memcmp(ta.data, tb.data, ta.size_bytes) == 0;
    if (ta.size_bytes < (64u << 10)) {
      EXPECT_TRUE(same) << ta.name << ": small tensors keep their seeded values";
      continue;
    }
    ++large;
    EXPECT_FALSE(same) << ta.name;
    const double ra = tensor_rms(ta), rb = tensor_rms(tb);
    EXPECT_NEAR(rb / ra, 1.0, 0.05) << ta.name;
  }
  EXPECT_GE(large, 3) << "the test covers large tensors (experts, embeddings, head)";
  CpuModel m(random.path);
  const std::vector<float> logits = m.run(0, {1, 2, 3, 4}, 0, false);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
}

}  // namespace
}  // namespace granule
