// Tests of the CPU reference backend: each op against a direct double-precision evaluation,
// and whole forward passes of synthetic models against goldens from the independent numpy
// reference (tests/reference/llama_reference.py; regenerate with
// tests/reference/make_cpu_goldens.sh BUILD_DIR).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numbers>
#include <random>
#include <sstream>
#include <thread>

#include "backends/backend.h"
#include "backends/cpu/ops.h"
#include "backends/cpu/thread_pool.h"
#include "granule/error.h"
#include "granule/quant.h"
#include "granule/testkit/quantize.h"
#include "granule/testkit/synthetic_model.h"
#include "memory/kv_space.h"
#include "memory/memory_manager.h"
#include "model/rope.h"
#include "runtime/runtime.h"
#include "support/model_runtime.h"
#include "support/reference_golden.h"

namespace granule {
namespace {

namespace fs = std::filesystem;
using test::random_values;
using test::ReferenceGolden;

// ---- ops -------------------------------------------------------------------------------

TEST(CpuOps, DotMatchesDoubleSum) {
  for (int64_t n : {1, 7, 31, 32, 33, 100, 576, 1536}) {
    auto a = random_values(static_cast<size_t>(n), 1);
    auto b = random_values(static_cast<size_t>(n), 2);
    double expected = 0;
    for (int64_t i = 0; i < n; ++i) expected += static_cast<double>(a[i]) * b[i];
    EXPECT_NEAR(cpu::dot_f32(a.data(), b.data(), n), expected, 1e-5 * std::sqrt(n)) << "n=" << n;
  }
}

TEST(CpuOps, RmsNormMatchesDefinition) {
  const int64_t n = 96;
  auto x = random_values(n, 3, 4.0f);
  auto w = random_values(n, 4);
  std::vector<float> out(n);
  cpu::rms_norm(x.data(), w.data(), out.data(), n, 1e-5f);
  double ms = 0;
  for (float v : x) ms += static_cast<double>(v) * v;
  const double scale = 1.0 / std::sqrt(ms / n + 1e-5);
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(out[i], x[i] * scale * w[i], 1e-5);
}

TEST(CpuOps, RopeNormalRotatesInterleavedPairs) {
  const int64_t head_dim = 8;
  auto freqs = rope_frequencies(head_dim, 10000.0f, RopeScaling{}, nullptr);
  auto x = random_values(2 * head_dim, 5);
  auto y = x;
  const int64_t pos = 7;
  cpu::rope(y.data(), 2, head_dim, pos, freqs.data(), RopeOrdering::Normal);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = 0; i < head_dim / 2; ++i) {
      const double theta = pos * std::pow(10000.0, -2.0 * i / head_dim);
      const double x0 = x[h * head_dim + 2 * i], x1 = x[h * head_dim + 2 * i + 1];
      EXPECT_NEAR(y[h * head_dim + 2 * i], x0 * std::cos(theta) - x1 * std::sin(theta), 1e-6);
      EXPECT_NEAR(y[h * head_dim + 2 * i + 1], x0 * std::sin(theta) + x1 * std::cos(theta), 1e-6);
    }
  }
}

TEST(CpuOps, RopeNeoXRotatesSplitHalves) {
  const int64_t head_dim = 8;
  auto freqs = rope_frequencies(head_dim, 1e6f, RopeScaling{}, nullptr);
  auto x = random_values(head_dim, 6);
  auto y = x;
  const int64_t pos = 300;
  cpu::rope(y.data(), 1, head_dim, pos, freqs.data(), RopeOrdering::NeoX);
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const double theta = pos * std::pow(1e6, -2.0 * i / head_dim);
    const double x0 = x[i], x1 = x[i + head_dim / 2];
    EXPECT_NEAR(y[i], x0 * std::cos(theta) - x1 * std::sin(theta), 1e-6);
    EXPECT_NEAR(y[i + head_dim / 2], x0 * std::sin(theta) + x1 * std::cos(theta), 1e-6);
  }
}

TEST(CpuOps, RopeAtPositionZeroIsIdentity) {
  auto freqs = rope_frequencies(16, 10000.0f, RopeScaling{}, nullptr);
  auto x = random_values(32, 7);
  auto y = x;
  cpu::rope(y.data(), 2, 16, 0, freqs.data(), RopeOrdering::Normal);
  EXPECT_EQ(x, y);
}

TEST(CpuOps, Llama3ScalingKeepsHighAndDividesLowFrequencies) {
  RopeScaling s;
  s.type = "llama3";
  s.factor = 8.0f;
  s.low_freq_factor = 1.0f;
  s.high_freq_factor = 4.0f;
  s.original_context = 8192;
  // Wavelength 2π/f: below 8192/4 = 2048 untouched, above 8192 divided by 8, smooth between.
  EXPECT_DOUBLE_EQ(llama3_frequency_divisor(2 * std::numbers::pi / 100.0, s), 1.0);
  EXPECT_DOUBLE_EQ(llama3_frequency_divisor(2 * std::numbers::pi / 20000.0, s), 8.0);
  // Wavelength 4096: smooth = (8192/4096 - 1) / 3 = 1/3 → divisor 1 / ((2/3)/8 + 1/3) = 2.4.
  EXPECT_NEAR(llama3_frequency_divisor(2 * std::numbers::pi / 4096.0, s), 2.4, 1e-12);

  auto plain = rope_frequencies(128, 500000.0f, RopeScaling{}, nullptr);
  auto scaled = rope_frequencies(128, 500000.0f, s, nullptr);
  EXPECT_DOUBLE_EQ(scaled.front(), plain.front());
  EXPECT_NEAR(scaled.back(), plain.back() / 8.0, 1e-18);
  // Given factors (rope_freqs.weight) win over the formula.
  std::vector<float> factors(64, 2.0f);
  auto given = rope_frequencies(128, 500000.0f, s, factors.data());
  EXPECT_NEAR(given[10], plain[10] / 2.0, 1e-15);
}

TEST(CpuOps, LinearScalingDividesEveryFrequency) {
  RopeScaling s;
  s.type = "linear";
  s.factor = 4.0f;
  auto plain = rope_frequencies(64, 10000.0f, RopeScaling{}, nullptr);
  auto scaled = rope_frequencies(64, 10000.0f, s, nullptr);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_NEAR(scaled[i], plain[i] / 4.0, 1e-15);
}

TEST(CpuOps, AttentionHeadIsSoftmaxWeightedValues) {
  const int64_t head_dim = 16, length = 9, stride = 40;  // stride > head_dim: token-major KV
  auto q = random_values(head_dim, 8);
  auto kv = random_values(static_cast<size_t>(length * stride), 9);
  const float* k = kv.data();
  const float* v = kv.data() + head_dim;
  std::vector<float> scores(length), out(head_dim);
  cpu::attention_head(q.data(), k, v, stride, length, head_dim, scores.data(), out.data());
  std::vector<double> p(length);
  double mx = -1e300, sum = 0;
  for (int64_t t = 0; t < length; ++t) {
    double s = 0;
    for (int64_t d = 0; d < head_dim; ++d) s += static_cast<double>(q[d]) * k[t * stride + d];
    p[t] = s / std::sqrt(static_cast<double>(head_dim));
    mx = std::max(mx, p[t]);
  }
  for (auto& x : p) sum += (x = std::exp(x - mx));
  for (int64_t d = 0; d < head_dim; ++d) {
    double expected = 0;
    for (int64_t t = 0; t < length; ++t) expected += p[t] / sum * v[t * stride + d];
    EXPECT_NEAR(out[d], expected, 1e-5);
  }
}

TEST(CpuOps, SwigluIsSiluTimesUp) {
  auto g = random_values(50, 10, 6.0f);
  auto u = random_values(50, 11);
  std::vector<float> out(50);
  cpu::swiglu(g.data(), u.data(), out.data(), 50);
  for (int i = 0; i < 50; ++i)
    EXPECT_NEAR(out[i], g[i] / (1 + std::exp(-double(g[i]))) * u[i], 1e-5);
}

// matmul over every block type equals decoding the rows and summing in double.
TEST(CpuOps, MatmulOverEveryBlockTypeMatchesDecodedRows) {
  const int64_t rows = 37, cols = 512, tokens = 3;
  cpu::ThreadPool pool(3);
  for (TensorType type :
       {TensorType::F32, TensorType::F16, TensorType::BF16, TensorType::Q8_0, TensorType::Q4_0,
        TensorType::Q4_1, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K}) {
    auto w = random_values(static_cast<size_t>(rows * cols), 12);
    std::vector<uint8_t> encoded(row_bytes(type, cols) * rows);
    for (int64_t r = 0; r < rows; ++r) {
      if (type == TensorType::F32) {
        std::memcpy(encoded.data() + r * row_bytes(type, cols), w.data() + r * cols, cols * 4);
      } else {
        quantize_row(type, w.data() + r * cols, encoded.data() + r * row_bytes(type, cols), cols);
      }
    }
    auto x = random_values(static_cast<size_t>(tokens * cols), 13);
    std::vector<float> y(rows * tokens);
    cpu::matmul(type, encoded.data(), rows, cols, x.data(), tokens, y.data(), &pool);
    std::vector<float> decoded(cols);
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(type, encoded.data() + r * row_bytes(type, cols), decoded.data(), cols);
      for (int64_t t = 0; t < tokens; ++t) {
        double expected = 0;
        for (int64_t c = 0; c < cols; ++c) expected += double(decoded[c]) * x[t * cols + c];
        EXPECT_NEAR(y[t * rows + r], expected, 1e-4) << tensor_type_info(type).name;
      }
    }
  }
}

TEST(CpuOps, ThreadPoolCoversEveryIndexOnce) {
  cpu::ThreadPool pool(4);
  for (int64_t n : {1, 3, 4, 5, 1000}) {
    std::vector<int> hits(static_cast<size_t>(n), 0);
    pool.parallel_for(n, [&](int64_t b, int64_t e, int32_t) {
      for (int64_t i = b; i < e; ++i) ++hits[static_cast<size_t>(i)];
    });
    for (int h : hits) EXPECT_EQ(h, 1);
  }
}

// Held awake (the host channel's pools between a step's rounds), the workers keep covering
// every index once, jobs spaced past the brief spin and past the deadline alike, and the pool
// stops at once while held.
TEST(CpuOps, ThreadPoolHeldAwakeStillCoversEveryIndexAndStops) {
  using namespace std::chrono_literals;
  auto pool = std::make_unique<cpu::ThreadPool>(4);
  const auto start = std::chrono::steady_clock::now();
  pool->stay_awake_until(start + 60ms);
  for (auto gap : {0ms, 2ms, 20ms, 80ms}) {  // the last comes after the deadline
    std::this_thread::sleep_for(gap);
    std::vector<int> hits(1000, 0);
    pool->parallel_for(1000, [&](int64_t b, int64_t e, int32_t) {
      for (int64_t i = b; i < e; ++i) ++hits[static_cast<size_t>(i)];
    });
    for (int h : hits) ASSERT_EQ(h, 1) << "after a gap of " << gap.count() << " ms";
  }
  pool->stay_awake_until(std::chrono::steady_clock::now() + 10s);
  const auto stop = std::chrono::steady_clock::now();
  pool.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - stop, 1s) << "a held pool must stop at once";
}

// ---- whole forward passes --------------------------------------------------------------

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("granule_cpu_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// A model, its CPU backend and a KvSpace with a few slots (make_runtime, as the engine).
struct LoadedModel : test::ModelRuntime {
  MemoryManager& memory = *runtime.memory;

  explicit LoadedModel(const fs::path& path, int32_t slots = 4, int64_t context = 256)
      : ModelRuntime(path, test::cpu_runtime_options(slots, context)) {}
};

int32_t argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

// max |a - b| / max |b|: the error relative to the size of the reference logits.
double relative_error(const float* a, const float* b, size_t n) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return diff / scale;
}

struct GoldenCase {
  std::string name;
  SyntheticModelSpec spec;
};

SyntheticModelSpec wide(SyntheticModelSpec s) {  // rows of 256: the K-quants' block
  s.n_embd = 256;
  s.n_ff = 512;
  s.n_head = 4;
  s.n_head_kv = 2;
  return s;
}

std::vector<GoldenCase> golden_cases() {
  using T = TensorType;
  const auto tiny = SyntheticModelSpec::preset("tiny");
  SyntheticModelSpec llama3 =
      with_types(SyntheticModelSpec::preset("tiny-gqa"), T::Q8_0, T::Q8_0, T::Q8_0);
  llama3.llama3_rope_scaling = true;
  llama3.rope_theta = 500000.0f;
  llama3.rope_original_context = 64;  // short, so the scaled band covers this head size
  llama3.seed = 7;
  SyntheticModelSpec mistral = SyntheticModelSpec::preset("tiny");
  mistral.architecture = "mistral";
  mistral.seed = 8;
  return {
      {"tiny-f32", tiny},
      {"tiny-f16", with_types(tiny, T::F16, T::F16, T::F16)},
      {"tiny-q8_0", with_types(tiny, T::Q8_0, T::Q8_0, T::Q8_0)},
      {"tiny-q4_0", with_types(tiny, T::Q4_0, T::Q8_0, T::Q4_0)},
      {"tiny-q4_1-tied",
       [&] {
         auto s = with_types(tiny, T::Q4_1, T::Q8_0, T::Q8_0);
         s.tied_embeddings = true;
         return s;
       }()},
      {"wide-kquants", with_types(wide(tiny), T::Q4_K, T::Q6_K, T::Q5_K)},
      {"wide-bf16-q6k", with_types(wide(tiny), T::Q6_K, T::BF16, T::BF16)},
      {"gqa-q8_0", with_types(SyntheticModelSpec::preset("tiny-gqa"), T::Q8_0, T::F32, T::Q8_0)},
      {"qwen2-bias", SyntheticModelSpec::preset("tiny-qwen2")},
      {"qwen3-qknorm",
       with_types(SyntheticModelSpec::preset("tiny-qwen3"), T::Q8_0, T::F16, T::F32)},
      {"llama3-scaling", llama3},
      {"mistral", mistral},
  };
}

const std::vector<int32_t> kGoldenTokens = {1, 45, 300, 7, 99, 256, 12, 3, 200, 150};
constexpr int kGoldenGreedy = 8;

class ReferenceGoldenTest : public ::testing::TestWithParam<GoldenCase> {};

// The case: teacher-forced logits at every position and 8 greedy tokens (KV-cached decode)
// match the float64 numpy reference run on the same file.
TEST_P(ReferenceGoldenTest, LogitsAndGreedyMatchNumpyReference) {
  const GoldenCase& c = GetParam();
  TempDir dir;
  fs::path model = dir.path / (c.name + ".gguf");
  write_synthetic_model(c.spec, model);
  ReferenceGolden g;
  ASSERT_NO_FATAL_FAILURE(test::load_reference_golden(c.name, model, kGoldenTokens, g));

  LoadedModel m(model);
  ASSERT_EQ(g.vocab, m.config.n_vocab);
  std::vector<float> logits = m.run(0, g.tokens, 0, true);
  ASSERT_EQ(logits.size(), g.logits.size());
  for (int64_t r = 0; r < g.rows; ++r) {
    const size_t off = static_cast<size_t>(r * g.vocab);
    EXPECT_LE(relative_error(logits.data() + off, g.logits.data() + off, g.vocab), 1e-4)
        << c.name << " position " << r;
  }

  std::vector<int32_t> greedy;
  int32_t next = argmax(logits.data() + (g.rows - 1) * g.vocab, g.vocab);
  int64_t position = static_cast<int64_t>(g.tokens.size());
  for (int i = 0; i < kGoldenGreedy; ++i) {
    greedy.push_back(next);
    auto row = m.run(0, {next}, position++, false);
    next = argmax(row.data(), g.vocab);
  }
  EXPECT_EQ(greedy, g.greedy) << c.name;
}

// How gtest shows a case (--gtest_list_tests, failure messages): its name, not its bytes.
void PrintTo(const GoldenCase& c, std::ostream* os) { *os << c.name; }

INSTANTIATE_TEST_SUITE_P(Synthetic, ReferenceGoldenTest, ::testing::ValuesIn(golden_cases()),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           for (auto& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// The case: several sequences prefilled and decoded in one batch give exactly the logits
// each gives alone (no cross-talk between slots, batch-invariant arithmetic).
TEST(CpuBackend, BatchedSequencesEqualEachAlone) {
  TempDir dir;
  fs::path model = dir.path / "gqa.gguf";
  write_synthetic_model(with_types(SyntheticModelSpec::preset("tiny-gqa"), TensorType::Q4_1,
                                   TensorType::Q8_0, TensorType::Q8_0),
                        model);
  const std::vector<std::vector<int32_t>> prompts = {
      {5, 9, 200, 17}, {300, 4}, {8, 8, 8, 60, 61, 62, 63}};

  LoadedModel alone(model);
  std::vector<std::vector<float>> alone_rows;  // per sequence: prefill row, then 3 decodes
  std::vector<std::vector<int32_t>> decode_inputs(prompts.size());
  for (size_t s = 0; s < prompts.size(); ++s) {
    auto row = alone.run(static_cast<int32_t>(s), prompts[s], 0, false);
    alone_rows.push_back(row);
    int64_t pos = static_cast<int64_t>(prompts[s].size());
    for (int i = 0; i < 3; ++i) {
      int32_t next = argmax(row.data(), alone.config.n_vocab);
      decode_inputs[s].push_back(next);
      row = alone.run(static_cast<int32_t>(s), {next}, pos++, false);
      alone_rows.back().insert(alone_rows.back().end(), row.begin(), row.end());
    }
  }

  LoadedModel batched(model);
  // Slots in a different order than above, to show a slot's contents are its own.
  const std::vector<int32_t> slots = {2, 0, 1};
  std::vector<BatchSequence> batch;
  for (size_t s = 0; s < prompts.size(); ++s) {
    ASSERT_TRUE(batched.kv->map_through(slots[s], static_cast<int64_t>(prompts[s].size()) + 3));
    batch.push_back({slots[s], prompts[s], 0, false});
  }
  std::vector<float> logits;
  ASSERT_EQ(batched.backend->forward(batch, logits), 3);
  const auto V = static_cast<size_t>(batched.config.n_vocab);
  std::vector<std::vector<int32_t>> step_tokens(3, std::vector<int32_t>(1));
  for (int step = 0; step <= 3; ++step) {
    for (size_t s = 0; s < prompts.size(); ++s) {
      const float* expected = alone_rows[s].data() + step * V;
      EXPECT_TRUE(std::equal(expected, expected + V, logits.data() + s * V))
          << "sequence " << s << " step " << step;
    }
    if (step == 3) break;
    batch.clear();
    for (size_t s = 0; s < prompts.size(); ++s) {
      step_tokens[s][0] = decode_inputs[s][static_cast<size_t>(step)];
      batch.push_back(
          {slots[s], step_tokens[s], static_cast<int64_t>(prompts[s].size()) + step, false});
    }
    batched.backend->forward(batch, logits);
  }
}

// The case: a prompt fed in chunks (KV from earlier chunks) gives the same logits as at once.
TEST(CpuBackend, ChunkedPrefillEqualsWholePrompt) {
  TempDir dir;
  fs::path model = dir.path / "tiny.gguf";
  write_synthetic_model(SyntheticModelSpec::preset("tiny-qwen2"), model);
  LoadedModel m(model);
  const std::vector<int32_t> prompt = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46};
  auto whole = m.run(0, prompt, 0, true);
  std::vector<float> chunked;
  for (size_t start = 0; start < prompt.size(); start += 4) {
    std::vector<int32_t> part(prompt.begin() + start,
                              prompt.begin() + std::min(start + 4, prompt.size()));
    auto rows = m.run(1, part, static_cast<int64_t>(start), true);
    chunked.insert(chunked.end(), rows.begin(), rows.end());
  }
  ASSERT_EQ(whole.size(), chunked.size());
  EXPECT_LE(relative_error(chunked.data(), whole.data(), whole.size()), 1e-6);
}

TEST(CpuBackend, RejectsTokenOutsideVocabulary) {
  TempDir dir;
  fs::path model = dir.path / "tiny.gguf";
  write_synthetic_model(SyntheticModelSpec::preset("tiny"), model);
  LoadedModel m(model);
  ASSERT_TRUE(m.kv->map_through(0, 1));
  std::vector<int32_t> bad = {static_cast<int32_t>(m.config.n_vocab)};
  BatchSequence seq{0, bad, 0, false};
  std::vector<float> logits;
  EXPECT_THROW(m.backend->forward(std::span<const BatchSequence>(&seq, 1), logits), UsageError);
}

TEST(CpuBackend, RejectsPositionsPastTheContextAndUnknownSlots) {
  TempDir dir;
  fs::path model = dir.path / "tiny.gguf";
  write_synthetic_model(SyntheticModelSpec::preset("tiny"), model);
  LoadedModel m(model, /*slots=*/2, /*context=*/8);
  std::vector<int32_t> tokens = {1, 2, 3};
  std::vector<float> logits;
  BatchSequence past{0, tokens, 6, false};  // positions 6..8 of a context of 8
  EXPECT_THROW(m.backend->forward(std::span<const BatchSequence>(&past, 1), logits), CapacityError);
  BatchSequence no_slot{2, tokens, 0, false};
  EXPECT_THROW(m.backend->forward(std::span<const BatchSequence>(&no_slot, 1), logits), UsageError);
}

TEST(CpuBackend, ChargesWeightsAndReportsKvBytes) {
  TempDir dir;
  fs::path model = dir.path / "tiny.gguf";
  write_synthetic_model(SyntheticModelSpec::preset("tiny-gqa"), model);
  LoadedModel m(model);
  EXPECT_EQ(m.memory.bytes(MemoryCategory::WeightsResident), m.weights.total_bytes());
  // 3 layers × K and V × 2 kv heads × 16 dims × 4 bytes.
  EXPECT_EQ(m.backend->kv_bytes_per_token(), 3 * 2 * 2 * 16 * 4);
  EXPECT_FALSE(m.backend->is_gpu());
}

}  // namespace
}  // namespace granule
