// The CPU oracle for the GPU (BackendOptions::cpu_emulate_device_numerics): its rounding
// operators against independent definitions (the testkit's f16 encoder, the int8 kernels'
// integer formula d_w·d_a·Σ q_w·q_a), and the whole backend in that mode: it differs from the
// plain f32 reference by the magnitude int8 activations cause, it chunks a batch as the
// CUDA backend does, and the engine option reaches it; the same for qwen35moe's hybrid layers
// (Gated DeltaNet and gated attention mixers with experts), whose dense form stays refused.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "backends/backend.h"
#include "backends/cpu/ops.h"
#include "granule/block_formats.h"
#include "granule/engine.h"
#include "granule/error.h"
#include "granule/quant.h"
#include "granule/testkit/quantize.h"
#include "granule/testkit/synthetic_model.h"
#include "memory/kv_space.h"
#include "runtime/runtime.h"
#include "support/reference_golden.h"

namespace granule {
namespace {

namespace fs = std::filesystem;
using test::random_values;
using test::worst_relative;

float bits_to_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

// ---- f16 ----------------------------------------------------------------------------------

TEST(CpuOracleOps, RoundToF16MatchesTheTestkitEncoderOverTheF16Range) {
  // Every f32 exponent from f16's subnormals to its largest finite values, random mantissas
  // (the low 13 bits decide the rounding; half the samples are exact ties).
  std::mt19937 gen(1);
  int compared = 0;
  for (uint32_t exponent = 103; exponent <= 142; ++exponent) {
    for (int i = 0; i < 4000; ++i) {
      uint32_t mantissa = gen() & 0x7fffffu;
      if (i % 2) mantissa = (mantissa & ~0x1fffu) | 0x1000u;  // a tie
      const uint32_t sign = (i % 4 < 2) ? 0u : 0x80000000u;
      const float x = bits_to_float(sign | exponent << 23 | mantissa);
      if (std::fabs(x) >= 65504.0f) continue;  // overflow: checked below
      ASSERT_EQ(cpu::round_to_f16(x), fp16_to_f32(f32_to_fp16(x))) << x;
#ifdef __FLT16_MAX__  // the compiler's own conversion, where it has _Float16
      ASSERT_EQ(cpu::round_to_f16(x), static_cast<float>(static_cast<_Float16>(x))) << x;
#endif
      ++compared;
    }
  }
  EXPECT_GT(compared, 100000);
}

TEST(CpuOracleOps, RoundToF16TiesToEvenOverflowsAndSubnormals) {
  EXPECT_EQ(cpu::round_to_f16(1.0f + 0x1p-11f), 1.0f);                // tie, even below
  EXPECT_EQ(cpu::round_to_f16(1.0f + 3 * 0x1p-11f), 1.0f + 0x1p-9f);  // tie, even above
  EXPECT_EQ(cpu::round_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 1.0f + 0x1p-10f);
  EXPECT_EQ(cpu::round_to_f16(65504.0f), 65504.0f);
  EXPECT_EQ(cpu::round_to_f16(65519.0f), 65504.0f);
  EXPECT_TRUE(std::isinf(cpu::round_to_f16(65520.0f)));  // the tie rounds to even: infinity
  EXPECT_TRUE(std::isinf(cpu::round_to_f16(-1e6f)));
  EXPECT_TRUE(std::isnan(cpu::round_to_f16(NAN)));
  EXPECT_EQ(cpu::round_to_f16(0x1p-24f), 0x1p-24f);            // the smallest subnormal
  EXPECT_EQ(cpu::round_to_f16(0x1p-25f), 0.0f);                // tie to even: zero
  EXPECT_EQ(cpu::round_to_f16(3 * 0x1p-25f), 0x1p-23f);        // tie to even: two units
  EXPECT_EQ(cpu::round_to_f16(1023.5f * 0x1p-24f), 0x1p-14f);  // carries into the normals
  EXPECT_EQ(cpu::round_to_f16(-0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(cpu::round_to_f16(-0.0f)));
}

// ---- int8 blocks --------------------------------------------------------------------------

TEST(CpuOracleOps, RoundThroughQ8KeepsInt8RepresentableBlocksExactly) {
  // q·d with d a power of two and ±127 in every block: amax / 127 gives d back exactly, so
  // both rules must return every value unchanged.
  std::mt19937 gen(2);
  std::uniform_int_distribution<int> q(-127, 127);
  for (float d : {0x1p-7f, 0x1p-3f, 1.0f, 0x1p5f}) {
    std::vector<float> x(256);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(q(gen)) * d;
    for (size_t b = 0; b < x.size(); b += 32)
      x[b + (b / 32) % 32] = (b % 64 ? -127.0f : 127.0f) * d;
    std::fill(x.begin() + 224, x.end(), 0.0f);  // a block of zeros stays zeros
    for (cpu::Q8Rounding rule : {cpu::Q8Rounding::MultiplyByInverse, cpu::Q8Rounding::Divide}) {
      std::vector<float> y = x;
      cpu::round_through_q8(y.data(), static_cast<int64_t>(y.size()), rule);
      ASSERT_EQ(y, x) << "d " << d;
    }
  }
}

TEST(CpuOracleOps, RoundThroughQ8MovesEachValueAtMostHalfAStep) {
  const std::vector<float> x = random_values(32 * 200, 3, 5.0f);
  std::vector<float> y = x;
  cpu::round_through_q8(y.data(), static_cast<int64_t>(y.size()), cpu::Q8Rounding::Divide);
  double sum_sq_steps = 0;
  int changed = 0;
  for (size_t b = 0; b < x.size(); b += 32) {
    float amax = 0;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const double d = amax / 127.0;
    for (size_t i = b; i < b + 32; ++i) {
      const double q = y[i] / d;
      EXPECT_NEAR(q, std::nearbyint(q), 1e-4) << "not an int8 multiple of the block's step";
      EXPECT_LE(std::fabs(q), 127.0 + 1e-4);
      const double err = (static_cast<double>(y[i]) - x[i]) / d;
      EXPECT_LE(std::fabs(err), 0.5 + 1e-4);
      sum_sq_steps += err * err;
      changed += y[i] != x[i];
    }
  }
  // Uniform rounding error: RMS 1/sqrt(12) = 0.289 of a step.
  const double rms_steps = std::sqrt(sum_sq_steps / static_cast<double>(x.size()));
  EXPECT_NEAR(rms_steps, 0.289, 0.03);
  EXPECT_GT(changed, static_cast<int>(x.size()) * 9 / 10);
}

TEST(CpuOracleOps, TheTwoInt8RulesDifferOnSomeValues) {
  // rint(x * (1/d)) and rint(x / d) part where x/d lies within an ulp of a half: the oracle
  // follows each kernel's own rule rather than one of them.
  std::mt19937 gen(4);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  int differ = 0;
  for (int trial = 0; trial < 200000 && differ == 0; ++trial) {
    std::vector<float> a(32), b;
    for (float& v : a) v = dist(gen);
    b = a;
    cpu::round_through_q8(a.data(), 32, cpu::Q8Rounding::MultiplyByInverse);
    cpu::round_through_q8(b.data(), 32, cpu::Q8Rounding::Divide);
    differ += a != b;
  }
  EXPECT_GT(differ, 0);
}

// The int8 matvec kernels' arithmetic (matvec.cu), written out independently in double from
// the blocks: d_w·d_a·Σ q_w·q_a per 32-block, + m_w·(d_a·Σ q_a) for Q4_1.
double kernel_formula(TensorType type, const uint8_t* row, const float* a, int64_t n) {
  double total = 0;
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* x = a + b * 32;
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.0f;
    const float inverse = amax == 0 ? 0 : 1.0f / d;
    int qa[32], sum_qa = 0;
    for (int i = 0; i < 32; ++i) sum_qa += qa[i] = static_cast<int>(std::nearbyint(x[i] * inverse));
    int64_t dot = 0;
    double dw = 0, mw = 0;
    if (type == TensorType::Q8_0) {
      const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
      for (int i = 0; i < 32; ++i) dot += blk->qs[i] * qa[i];
      dw = fp16_to_f32(blk->d);
    } else if (type == TensorType::Q4_0) {
      const auto* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
      for (int i = 0; i < 16; ++i)
        dot += ((blk->qs[i] & 0xF) - 8) * qa[i] + ((blk->qs[i] >> 4) - 8) * qa[i + 16];
      dw = fp16_to_f32(blk->d);
    } else {
      const auto* blk = reinterpret_cast<const BlockQ4_1*>(row) + b;
      for (int i = 0; i < 16; ++i)
        dot += (blk->qs[i] & 0xF) * qa[i] + (blk->qs[i] >> 4) * qa[i + 16];
      dw = fp16_to_f32(blk->d);
      mw = fp16_to_f32(blk->m);
    }
    total += dw * d * static_cast<double>(dot) + mw * d * sum_qa;
  }
  return total;
}

TEST(CpuOracleOps, OracleMatmulIsTheInt8KernelsProduct) {
  const int64_t rows = 48, cols = 512;
  for (TensorType type : {TensorType::Q8_0, TensorType::Q4_0, TensorType::Q4_1}) {
    const std::vector<float> wf = random_values(static_cast<size_t>(rows * cols), 5, 0.5f);
    std::vector<uint8_t> w(row_bytes(type, cols) * rows);
    for (int64_t r = 0; r < rows; ++r)
      quantize_row(type, wf.data() + r * cols, w.data() + r * row_bytes(type, cols), cols);
    const std::vector<float> a = random_values(static_cast<size_t>(cols), 6, 3.0f);
    std::vector<float> rounded = a, y_oracle(rows), y_exact(rows);
    cpu::round_through_q8(rounded.data(), cols, cpu::Q8Rounding::MultiplyByInverse);
    cpu::matmul(type, w.data(), rows, cols, rounded.data(), 1, y_oracle.data(), nullptr);
    cpu::matmul(type, w.data(), rows, cols, a.data(), 1, y_exact.data(), nullptr);
    double worst_oracle = 0, sum_sq_exact = 0, sum_sq_ref = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const double ref = kernel_formula(type, w.data() + r * row_bytes(type, cols), a.data(), cols);
      // f32 summation over 512 products: relative 1e-5 of the terms' size is ample.
      double scale = 0;
      std::vector<float> dec(cols);
      dequantize_row(type, w.data() + r * row_bytes(type, cols), dec.data(), cols);
      for (int64_t i = 0; i < cols; ++i) scale += std::fabs(dec[i] * a[i]);
      worst_oracle = std::max(worst_oracle, std::fabs(y_oracle[r] - ref) / scale);
      sum_sq_exact += (y_exact[r] - ref) * (y_exact[r] - ref);
      sum_sq_ref += ref * ref;
    }
    EXPECT_LT(worst_oracle, 1e-5) << tensor_type_info(type).name;
    // Without the int8 rounding the product is off by the activations' rounding: each
    // element moves up to half a step of amax/127, ~0.3% of the output's RMS for these sizes.
    const double exact_relative = std::sqrt(sum_sq_exact / sum_sq_ref);
    EXPECT_GT(exact_relative, 5e-4) << tensor_type_info(type).name;
    EXPECT_LT(exact_relative, 2e-2) << tensor_type_info(type).name;
    std::cout << "[oracle] " << tensor_type_info(type).name << ": oracle vs int8 formula "
              << worst_oracle << " (of sum |w a|), f32 vs int8 formula " << exact_relative
              << " (of RMS)\n";
  }
}

TEST(CpuOracleOps, F16WeightsMatmulRoundsEachDecodedWeight) {
  const int64_t rows = 8, cols = 64;
  const std::vector<float> w = random_values(static_cast<size_t>(rows * cols), 7, 3.0f);
  const std::vector<float> x = random_values(static_cast<size_t>(cols), 8);
  std::vector<float> y(rows), y16(rows);
  cpu::matmul(TensorType::F32, w.data(), rows, cols, x.data(), 1, y16.data(), nullptr, true);
  std::vector<float> w16 = w;
  cpu::round_through_f16(w16.data(), rows * cols);
  ASSERT_NE(w16, w);
  cpu::matmul(TensorType::F32, w16.data(), rows, cols, x.data(), 1, y.data(), nullptr);
  EXPECT_EQ(y, y16);
}

// ---- the backend in oracle mode -----------------------------------------------------------

struct Rig {
  std::unique_ptr<ModelFile> file;
  ModelConfig config;
  WeightTable weights;
  Runtime runtime;

  Rig(const fs::path& path, bool emulate, int64_t max_tokens_per_pass = 512,
      int f16_mma_min_rows = 0) {
    file = ModelFile::open(path);
    config = ModelConfig::from_gguf(*file);
    weights = WeightTable::from_gguf(*file, config);
    RuntimeOptions options;
    options.device = DeviceKind::Cpu;
    options.context_length = 256;
    options.slots = 2;
    options.kv_pool_granules = 0;
    options.backend.cpu_threads = 2;
    options.backend.max_tokens_per_pass = max_tokens_per_pass;
    options.backend.cpu_emulate_device_numerics = emulate;
    options.backend.cpu_exact_numerics = !emulate;  // the f32 reference, not the int8 fast path
    kernels::KernelConfig kernels;
    kernels.f16_mma_min_rows = f16_mma_min_rows;
    options.backend.kernel_config = kernels;
    runtime = make_runtime(*file, config, weights, options);
  }

  std::vector<float> run(int32_t slot, std::span<const int32_t> tokens, int64_t start) {
    if (!runtime.kv->map_through(slot, start + static_cast<int64_t>(tokens.size())))
      throw std::runtime_error("KV map refused");
    std::vector<float> logits;
    const std::vector<BatchSequence> batch = {{slot, tokens, start, true}};
    runtime.backend->forward(batch, logits);
    return logits;
  }
};

fs::path write_model(const std::string& name, TensorType type) {
  SyntheticModelSpec s = SyntheticModelSpec::preset("small-256");
  s.name = name;
  s.weight_type = s.embedding_type = s.output_type = type;
  s.seed = 31;
  const fs::path path = fs::temp_directory_path() /
                        ("granule-oracle-" + name + "-" + std::to_string(::getpid()) + ".gguf");
  write_synthetic_model(s, path);
  return path;
}

std::vector<int32_t> random_tokens(int n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(3, 999);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = dist(gen);
  return t;
}

TEST(CpuOracleBackend, Int8TypesDifferFromTheF32ReferenceByTheInt8Error) {
  const fs::path path = write_model("q4_1", TensorType::Q4_1);
  Rig exact(path, false), oracle(path, true);
  EXPECT_NE(oracle.runtime.backend->name().find("CUDA rounding"), std::string::npos);
  const std::vector<int32_t> tokens = random_tokens(40, 9);
  const std::vector<float> a = exact.run(0, tokens, 0), b = oracle.run(0, tokens, 0);
  const double rel = worst_relative(a, b, 1000);
  std::cout << "[oracle] Q4_1 model, 40 rows: max |oracle - f32| / std " << rel << "\n";
  // int8 activations (~0.3% per product) through 2 layers of random weights: percent-level,
  // far above f32 noise (1e-6) and far below a broken computation (order 1).
  EXPECT_GT(rel, 1e-3);
  EXPECT_LT(rel, 0.3);
  // Deterministic: the same step again in the other slot gives the same bits.
  EXPECT_EQ(oracle.run(1, tokens, 0), b);
  fs::remove(path);
}

TEST(CpuOracleBackend, F32ModelDiffersOnlyByTheF16Kv) {
  // F32 weights read f32 activations in the matvec path: only the KV's f16 rounding remains.
  const fs::path path = write_model("f32", TensorType::F32);
  Rig exact(path, false), oracle(path, true);
  const std::vector<int32_t> tokens = random_tokens(40, 10);
  const std::vector<float> a = exact.run(0, tokens, 0), b = oracle.run(0, tokens, 0);
  const double rel = worst_relative(a, b, 1000);
  std::cout << "[oracle] F32 model, 40 rows: max |oracle - f32| / std " << rel << "\n";
  EXPECT_GT(rel, 0.0);
  EXPECT_LT(rel, 5e-3);  // f16 keeps 11 bits: 2^-12 per KV element
  // Row 0 attends only to its own V: its K/V rounding enters once; still not exact.
  fs::remove(path);
}

TEST(CpuOracleBackend, ChunksABatchAsTheCudaBackendDoes) {
  // 150 tokens with 64 tokens per pass: the GPU runs chunks of 64, 64 and 22 rows, all through
  // the int8 matvec kernels; the oracle must give exactly what three passes give.
  const fs::path path = write_model("q8_0", TensorType::Q8_0);
  Rig chunked(path, true, 64), separate(path, true, 64), one_gemm(path, true, 512);
  const std::vector<int32_t> tokens = random_tokens(150, 11);
  const std::vector<float> whole = chunked.run(0, tokens, 0);
  std::vector<float> pieces;
  for (int first = 0; first < 150; first += 64) {
    const int count = std::min(64, 150 - first);
    const std::vector<float> part =
        separate.run(0, std::span<const int32_t>(tokens).subspan(first, count), first);
    pieces.insert(pieces.end(), part.begin(), part.end());
  }
  EXPECT_EQ(whole, pieces);
  // 512 per pass: one chunk of 150 rows, the cuBLAS path (f16 operands, no int8): different.
  const std::vector<float> gemm = one_gemm.run(0, tokens, 0);
  const double rel = worst_relative(whole, gemm, 1000);
  std::cout << "[oracle] Q8_0 150 rows: int8 chunks vs one f16 GEMM chunk, max diff / std " << rel
            << "\n";
  EXPECT_GT(rel, 1e-4);
  fs::remove(path);
}

// KernelConfig::f16_mma_min_rows: runs of that many rows (up to 64) on layers of split
// Q4_0/Q4_1/Q8_0/Q2_K/Q3_K/Q4_K/Q5_K/Q6_K take f16 tensor-core products on the GPU, which round as
// the cuBLAS path does (f16 activations, each weight rounded to f16). The oracle follows: 128
// tokens in two 64-row chunks on that path are bitwise one 128-row GEMM chunk; a 16-row run (below
// 17) stays on the int8 rounding; and the f16 rounding sits nearer the f32 reference than the int8
// one.
TEST(CpuOracleBackend, F16ProductsRoundAsTheGemmPath) {
  for (const TensorType type :
       {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q8_0, TensorType::Q2_K, TensorType::Q3_K,
        TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K}) {
    const std::string name(tensor_type_info(type).name);
    const fs::path path = write_model("f16mma-" + name, type);
    Rig exact(path, false), int8(path, true, 64), f16(path, true, 64, 17),
        one_gemm(path, true, 512);
    const std::vector<int32_t> tokens = random_tokens(128, 12);
    const std::vector<float> chunks = f16.run(0, tokens, 0);
    EXPECT_EQ(chunks, one_gemm.run(0, tokens, 0)) << name << ": two f16 chunks vs one GEMM";
    const std::span<const int32_t> first16 = std::span<const int32_t>(tokens).first(16);
    EXPECT_EQ(f16.run(1, first16, 0), int8.run(1, first16, 0)) << name << ": 16 rows are int8";
    const std::span<const int32_t> first40 = std::span<const int32_t>(tokens).first(40);
    const std::vector<float> ref = exact.run(0, first40, 0), a = int8.run(0, first40, 0),
                             b = f16.run(0, first40, 0);
    const double int8_error = worst_relative(ref, a, 1000),
                 f16_error = worst_relative(ref, b, 1000);
    std::cout << "[oracle] " << name << " 40 rows, max |x - f32| / std: int8 rounding "
              << int8_error << ", f16 rounding " << f16_error << "\n";
    EXPECT_GT(f16_error, 0.0);
    EXPECT_LT(f16_error, int8_error / 2) << name;
    fs::remove(path);
  }
}

// ---- qwen35moe -----------------------------------------------------------------------------

// The tiny-qwen35moe preset (Gated DeltaNet layers 0-2 and 4, gated attention at 3, 8 experts of
// 32, top 2) with a shared expert of 64 (whole int8 blocks) and random_tokens' vocabulary:
// `layers` the mixers' and the shared expert's matrices, `experts` the routed experts', `edges`
// the embedding and the head.
// `every_expert`: each token takes all 8 experts (no routing choice for a rounding to flip).
fs::path write_hybrid_moe(const std::string& name, TensorType layers, TensorType experts,
                          TensorType edges, bool every_expert = false) {
  SyntheticModelSpec s = SyntheticModelSpec::preset("tiny-qwen35moe");
  s.name = name;
  s.n_vocab = 1000;
  s.n_ff_shexp = 64;
  if (every_expert) s.n_expert_used = s.n_expert;
  s.weight_type = layers;
  s.expert_type = experts;
  s.embedding_type = s.output_type = edges;
  const fs::path path = fs::temp_directory_path() /
                        ("granule-oracle-" + name + "-" + std::to_string(::getpid()) + ".gguf");
  write_synthetic_model(s, path);
  return path;
}

// F32 weights read f32 activations on the GPU's matvec path: the oracle of the hybrid MoE model
// differs from the exact reference by its attention layer's f16 KV only, within the dense bound
// (F32ModelDiffersOnlyByTheF16Kv), prompt and decode rows alike.
TEST(CpuOracleBackend, HybridMoeF32DiffersOnlyByTheF16Kv) {
  const fs::path path =
      write_hybrid_moe("qwen35moe-f32", TensorType::F32, TensorType::F32, TensorType::F32);
  Rig exact(path, false), oracle(path, true);
  EXPECT_NE(oracle.runtime.backend->name().find("CUDA rounding"), std::string::npos);
  const int64_t vocab = oracle.config.n_vocab;
  const std::vector<int32_t> tokens = random_tokens(40, 20);
  std::vector<float> a = exact.run(0, tokens, 0), b = oracle.run(0, tokens, 0);
  for (int i = 0; i < 8; ++i) {  // decode rows continue the recurrent state and the KV
    const std::vector<int32_t> next = {tokens[static_cast<size_t>(i)]};
    const std::vector<float> x = exact.run(0, next, 40 + i), y = oracle.run(0, next, 40 + i);
    a.insert(a.end(), x.begin(), x.end());
    b.insert(b.end(), y.begin(), y.end());
  }
  const double rel = worst_relative(a, b, vocab);
  std::cout << "[oracle] qwen35moe F32, 40 + 8 rows: max |oracle - f32| / std " << rel << "\n";
  EXPECT_GT(rel, 0.0);   // the KV's rounding reaches the logits
  EXPECT_LT(rel, 5e-3);  // f16 keeps 11 bits: 2^-12 per KV element
  fs::remove(path);
}

// Int8-reading weights: the mixers' inputs are rounded as the GPU rounds them (the RMSNorm's rule
// before Q/K/V and the DeltaNet projections, the gated norm's and the output gate's before the
// output projections). With the experts, the embedding and the head in F32 only the mixers'
// rounding moves the logits, far above the F32 file's KV rounding; Q8_0 experts and shared expert
// (MoeFfn's rounding) add theirs. Every token takes all 8 experts, so the rounding moves logits
// continuously (with top 2 a token whose second and third experts are close changes expert,
// measured up to 4 spreads on this tiny file). Measured here: mean 0.24 / 0.28, max 0.89 / 0.99 of
// the spread over 40 rows; five layers of 64-wide int8 rounding on random weights (qwen35_gpu_test
// measured the GPU's int8 path of the dense model at mean 0.21, max 0.60 at 256 wide). Mixers that
// rounded nothing would leave the F32-experts file at the KV's 1e-3 (above); a product of the
// wrong input would be order 1 or more in every row. The result is deterministic.
TEST(CpuOracleBackend, HybridMoeMixersReadInt8Inputs) {
  for (const TensorType experts : {TensorType::F32, TensorType::Q8_0}) {
    const std::string name = "qwen35moe-q8_0-" + std::string(tensor_type_info(experts).name);
    const fs::path path =
        write_hybrid_moe(name, TensorType::Q8_0, experts, TensorType::F32, /*every_expert=*/true);
    Rig exact(path, false), oracle(path, true);
    const int64_t vocab = oracle.config.n_vocab;
    const std::vector<int32_t> tokens = random_tokens(40, 21);
    const std::vector<float> a = exact.run(0, tokens, 0), b = oracle.run(0, tokens, 0);
    double worst = 0, total = 0;
    for (size_t r = 0; r < tokens.size(); ++r) {
      const auto row = [&](const std::vector<float>& v) {
        return std::vector<float>(v.begin() + static_cast<int64_t>(r) * vocab,
                                  v.begin() + static_cast<int64_t>(r + 1) * vocab);
      };
      const double rel = worst_relative(row(a), row(b), vocab);
      worst = std::max(worst, rel);
      total += rel;
    }
    const double mean = total / static_cast<double>(tokens.size());
    std::cout << "[oracle] " << name << ", 40 rows: |oracle - f32| / std mean " << mean << ", max "
              << worst << "\n";
    EXPECT_GT(mean, 3e-2) << name;
    EXPECT_LT(mean, 0.5) << name;
    EXPECT_LT(worst, 1.5) << name;
    EXPECT_EQ(oracle.run(1, tokens, 0), b) << name;
    fs::remove(path);
  }
}

// 150 tokens in passes of 64 rows: chunks of 64, 64 and 22 on the GPU's int8 matvec path, the
// recurrent state carried from one to the next; the oracle gives exactly what three steps give.
// One pass of 150 rows takes the cuBLAS path's f16 operands in the mixers: different.
TEST(CpuOracleBackend, HybridMoeChunksABatchAsTheCudaBackendDoes) {
  const fs::path path =
      write_hybrid_moe("qwen35moe-chunks", TensorType::Q8_0, TensorType::Q8_0, TensorType::Q8_0);
  Rig chunked(path, true, 64), separate(path, true, 64), one_gemm(path, true, 512);
  const int64_t vocab = chunked.config.n_vocab;
  const std::vector<int32_t> tokens = random_tokens(150, 22);
  const std::vector<float> whole = chunked.run(0, tokens, 0);
  std::vector<float> pieces;
  for (int first = 0; first < 150; first += 64) {
    const int count = std::min(64, 150 - first);
    const std::vector<float> part =
        separate.run(0, std::span<const int32_t>(tokens).subspan(first, count), first);
    pieces.insert(pieces.end(), part.begin(), part.end());
  }
  EXPECT_EQ(whole, pieces);
  const double rel = worst_relative(whole, one_gemm.run(0, tokens, 0), vocab);
  std::cout << "[oracle] qwen35moe Q8_0 150 rows: int8 chunks vs one f16 GEMM chunk, max diff / "
               "std "
            << rel << "\n";
  EXPECT_GT(rel, 1e-4);
  fs::remove(path);
}

// The dense qwen35 has no emulation (its FFN's batch-1 fusion rounds otherwise): refused in one
// line; its exact path still opens.
TEST(CpuOracleBackend, DenseHybridIsRefusedInOneLine) {
  SyntheticModelSpec s = SyntheticModelSpec::preset("tiny-qwen35");
  s.n_vocab = 1000;
  const fs::path path =
      fs::temp_directory_path() / ("granule-oracle-qwen35-" + std::to_string(::getpid()) + ".gguf");
  write_synthetic_model(s, path);
  try {
    Rig oracle(path, true);
    ADD_FAILURE() << "the oracle opened a dense qwen35 model";
  } catch (const UnsupportedError& e) {
    const std::string why = e.what();
    EXPECT_NE(why.find("rounding of qwen35 models is not defined"), std::string::npos) << why;
    EXPECT_EQ(why.find('\n'), std::string::npos);
  }
  Rig exact(path, false);
  EXPECT_EQ(exact.run(0, random_tokens(4, 23), 0).size(), static_cast<size_t>(4 * s.n_vocab));
  fs::remove(path);
}

TEST(CpuOracleBackend, EngineOptionReachesTheCpuBackend) {
  const fs::path path = write_model("engine", TensorType::Q4_0);
  EngineOptions options;
  options.device = DeviceKind::Cpu;
  options.context_length = 128;
  options.cpu_threads = 2;
  auto plain = Engine::open(path, options);
  options.cpu_emulate_device_numerics = true;
  auto oracle = Engine::open(path, options);
  EXPECT_EQ(plain->device_name().find("CUDA rounding"), std::string::npos);
  EXPECT_NE(oracle->device_name().find("CUDA rounding"), std::string::npos)
      << oracle->device_name();
  const std::vector<int32_t> tokens = random_tokens(12, 12);
  EXPECT_NE(plain->logits_for(tokens), oracle->logits_for(tokens));
  fs::remove(path);
}

}  // namespace
}  // namespace granule
