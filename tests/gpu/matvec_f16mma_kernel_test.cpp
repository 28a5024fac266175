// The f16 tensor-core products over in-register dequantised weights (kernels/matvec_f16mma.cu)
// against a host reference that rounds where the kernel is defined to round: each weight to f16
// once from f16 scales (Q4_0: f16((q - 8) d), Q4_1: f16(q d + m), Q8_0: f16(q d), IQ4_NL:
// f16(level d) with the nibble's int8 level, MXFP4 the same with d = 2^(e - 128) in f16, IQ4_XS
// f16(level f16(d sc)); the K types'
// scales f16(d sc) and f16(dmin m) rounded first: Q6_K f16((q - 32) f16(d sc)), Q4_K/Q5_K and
// Q2_K (per 16 elements) f16(q f16(d sc) - f16(dmin m)), Q3_K f16((q - 4) f16(d sc))), the f16
// activations exact, the sum in double. The host reads
// the elements from the GGUF blocks, checked against the engine's dequantisation. What is left
// is the f32 accumulation inside the mma and across warps; the bound for it is kRelError of the
// row's magnitude (sum over elements of |w16 x|), and a test shows that one weight off by one
// quantisation step lies outside it. Also against the unrounded dequantised weights with the
// f16 roundings' own bound (2^-11 relative per rounding). Shapes of SmolLM2 and an 8B model,
// odd row counts and short rows, batches 1-64, the three-matrix launch with accumulate, the 8B
// model's products with accumulate (the same bits on a second launch), the fused SwiGLU
// epilogue (also with an f16 result; at 17-64 columns the shared-activation shape), and what the
// launcher refuses, for Q4_0, Q4_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS and MXFP4.
// A timing
// probe prints the 8B products beside the int8 mma kernel (and checks that the two agree within the
// int8 activations' rounding).
#include <cuda_fp16.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <tuple>
#include <utility>

#include "granule/block_formats.h"
#include "granule/quant.h"
#include "granule/split_layout.h"
#include "matvec_f16mma.cuh"
#include "matvec_mma.cuh"
#include "mma_test_matrix.h"
#include "quantize_activations.cuh"

namespace granule {
namespace {

using gpu_test::DeviceArray;
using mma_test::kPoisonBits;
using mma_test::Matrix;
using mma_test::Output;
using mma_test::Shape;
using mma_test::shape_name;
using mma_test::task_for;

// The mma's f32 accumulation (products of f16 values are exact in f32; each k-step adds 16 of
// them to the accumulator, rounded or truncated to f32) and the reduction of the block's warps.
// Each rounding is relative to the partial sum, which for these random-sign inputs stays far
// below the magnitude: measured errors are ~1e-7 of it. 2e-5 still separates a weight that
// is one step off (d |x| ~ 1e-3 of the magnitude at 4096 elements; PinsOneWrongNibble).
constexpr double kRelError = 2e-5;
constexpr double kF16Rel = 1.0 / 2048;  // f16 rounding of a weight: half an ulp, 2^-11
constexpr double kF16SubnormalStep = 1.0 / (1 << 24);  // absolute, below f16's normal range
constexpr int kMaxBatch = 64;

// Round to nearest even in f16, subnormals included (|v| below 65504).
double round_to_f16(double v) {
  if (v == 0) return v;
  int e = 0;
  std::frexp(v, &e);  // |v| in [2^(e-1), 2^e): 11 significant bits end at 2^(e-11)
  const double quantum = std::ldexp(1.0, std::max(e - 11, -24));
  return std::nearbyint(v / quantum) * quantum;
}

// Element i of row r of a matrix, read from its GGUF blocks: value = (q - bias) d + m exactly
// (bias 8 for Q4_0, 32 for Q6_K, 4 for Q3_K, else 0; m: Q4_1's m, Q4_K/Q5_K/Q2_K's -dmin * min,
// else 0; IQ4_NL's
// IQ4_XS's and MXFP4's q is the nibble's level in kIq4nlValues, kMxfp4Values); the
// kernel multiplies f16((q - bias) d16 + m16), where d16, m16 are d and m for the types whose
// scale is an f16 already, and f16(d * sc), -f16(dmin * min) for the K types (their scales
// rounded to f16 once too).
struct Element {
  int q;
  double d, m;
  double d16, m16;
};
int bias_of(TensorType t) {
  return t == TensorType::Q4_0 ? 8 : t == TensorType::Q6_K ? 32 : t == TensorType::Q3_K ? 4 : 0;
}
bool scales_rounded(TensorType t) {
  return t == TensorType::Q2_K || t == TensorType::Q3_K || t == TensorType::Q4_K ||
         t == TensorType::Q5_K || t == TensorType::Q6_K || t == TensorType::IQ4_XS;
}
// The largest q of a type (a neighbour of q stays inside [lowest, largest]).
int largest_q(TensorType t) {
  return t == TensorType::Q8_0 || t == TensorType::IQ4_NL || t == TensorType::IQ4_XS ||
                 t == TensorType::MXFP4
             ? 127
         : t == TensorType::Q6_K ? 63
         : t == TensorType::Q5_K ? 31
         : t == TensorType::Q3_K ? 7
         : t == TensorType::Q2_K ? 3
                                 : 15;
}
// The 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block (GGUF's packing).
std::pair<int, int> k_scale_min(const uint8_t* q, int j) {
  if (j < 4) return {q[j] & 63, q[j + 4] & 63};
  return {(q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)};
}
Element element(const Matrix& w, int64_t r, int64_t i) {
  const uint8_t* row = w.gguf.data() + r * w.gguf_row_bytes;
  switch (w.type) {
    case TensorType::Q4_0: {
      const auto* b = reinterpret_cast<const BlockQ4_0*>(row) + i / 32;
      const int k = static_cast<int>(i % 32);
      const int q = k < 16 ? b->qs[k] & 0x0F : b->qs[k - 16] >> 4;
      const double d = fp16_to_f32(b->d);
      return {q, d, 0.0, d, 0.0};
    }
    case TensorType::Q4_1: {
      const auto* b = reinterpret_cast<const BlockQ4_1*>(row) + i / 32;
      const int k = static_cast<int>(i % 32);
      const int q = k < 16 ? b->qs[k] & 0x0F : b->qs[k - 16] >> 4;
      const double d = fp16_to_f32(b->d), m = fp16_to_f32(b->m);
      return {q, d, m, d, m};
    }
    case TensorType::IQ4_NL: {
      const auto* b = reinterpret_cast<const BlockIQ4_NL*>(row) + i / 32;
      const int k = static_cast<int>(i % 32);
      const int nibble = k < 16 ? b->qs[k] & 0x0F : b->qs[k - 16] >> 4;
      const double d = fp16_to_f32(b->d);
      return {kIq4nlValues[nibble], d, 0.0, d, 0.0};
    }
    case TensorType::IQ4_XS: {
      // Sub-block j of a super-block: the levels of qs bytes 16 j + l (low nibbles, then high),
      // its scale ls - 32 (low 4 bits in scales_l, high 2 in scales_h), the kernel's f16(d sc).
      const auto* b = reinterpret_cast<const BlockIQ4_XS*>(row) + i / 256;
      const int e = static_cast<int>(i % 256), j = e / 32, k = e % 32;
      const uint8_t byte = b->qs[16 * j + k % 16];
      const int nibble = k < 16 ? byte & 0x0F : byte >> 4;
      const int ls =
          ((b->scales_l[j / 2] >> (4 * (j % 2))) & 0xF) | (((b->scales_h >> (2 * j)) & 3) << 4);
      const double d = fp16_to_f32(b->d) * (ls - 32);
      return {kIq4nlValues[nibble], d, 0.0, round_to_f16(d), 0.0};
    }
    case TensorType::MXFP4: {
      // d = 2^(e - 128) (ggml_e8m0_to_fp32_half, its subnormal e 0 and 1 included), in f16 as
      // the kernel has it.
      const auto* b = reinterpret_cast<const BlockMXFP4*>(row) + i / 32;
      const int k = static_cast<int>(i % 32);
      const int nibble = k < 16 ? b->qs[k] & 0x0F : b->qs[k - 16] >> 4;
      const double d = std::ldexp(1.0, b->e - 128);
      return {kMxfp4Values[nibble], d, 0.0, round_to_f16(d), 0.0};
    }
    case TensorType::Q8_0: {
      const auto* b = reinterpret_cast<const BlockQ8_0*>(row) + i / 32;
      const double d = fp16_to_f32(b->d);
      return {b->qs[i % 32], d, 0.0, d, 0.0};
    }
    case TensorType::Q6_K: {
      // Per 128 elements: quarter k of 32 takes the low (k < 2) or high nibbles of ql bytes
      // 32 (k % 2) + l, bits 2k of qh byte l, scale 2k + l / 16.
      const auto* b = reinterpret_cast<const BlockQ6_K*>(row) + i / 256;
      const int e = static_cast<int>(i % 256), half = e / 128, k = e % 128 / 32, l = e % 32;
      const uint8_t ql = b->ql[half * 64 + (k % 2) * 32 + l];
      const int q = (k < 2 ? ql & 0x0F : ql >> 4) | ((b->qh[half * 32 + l] >> (2 * k)) & 3) << 4;
      const double d = fp16_to_f32(b->d) * b->scales[half * 8 + l / 16 + 2 * k];
      return {q, d, 0.0, round_to_f16(d), 0.0};
    }
    case TensorType::Q2_K: {
      // Per 128 elements: quarter j of 32 takes bits 2j of qs bytes 32 (e / 128) + l, scale
      // byte 8 (e / 128) + 2j + l / 16 (sc in the low nibble, min in the high).
      const auto* b = reinterpret_cast<const BlockQ2_K*>(row) + i / 256;
      const int e = static_cast<int>(i % 256), half = e / 128, j = e % 128 / 32, l = e % 32;
      const int q = (b->qs[half * 32 + l] >> (2 * j)) & 3;
      const uint8_t sc = b->scales[half * 8 + 2 * j + l / 16];
      const double d = fp16_to_f32(b->d) * (sc & 0xF);
      const double m = -fp16_to_f32(b->dmin) * (sc >> 4);
      return {q, d, m, round_to_f16(d), round_to_f16(m)};
    }
    case TensorType::Q3_K: {
      // Per 128 elements: quarter j of 32 takes bits 2j of qs bytes 32 (e / 128) + l and bit
      // 4 (e / 128) + j of hmask byte l as bit 2 (q 0..7, value (q - 4) d sc); scale k =
      // 8 (e / 128) + 2j + l / 16 of the 12 packed bytes: low 4 bits from byte k % 8 (the high
      // nibble for k >= 8), high 2 from byte 8 + k % 4 at bit 2 (k / 4); minus 32.
      const auto* b = reinterpret_cast<const BlockQ3_K*>(row) + i / 256;
      const int e = static_cast<int>(i % 256), half = e / 128, j = e % 128 / 32, l = e % 32;
      const int third = (b->hmask[l] >> (4 * half + j)) & 1;
      const int q = ((b->qs[half * 32 + l] >> (2 * j)) & 3) | third << 2;
      const int k = half * 8 + 2 * j + l / 16;
      const int low = k < 8 ? b->scales[k] & 0xF : b->scales[k - 8] >> 4;
      const int sc = (low | ((b->scales[8 + k % 4] >> (2 * (k / 4))) & 3) << 4) - 32;
      const double d = fp16_to_f32(b->d) * sc;
      return {q, d, 0.0, round_to_f16(d), 0.0};
    }
    case TensorType::Q4_K:
    case TensorType::Q5_K: {
      // Sub-block j takes the low (j even) or high nibbles of qs bytes 32 (j / 2) + l; Q5_K's
      // fifth bit is bit j of qh byte l.
      const bool q5 = w.type == TensorType::Q5_K;
      const uint8_t* block = row + i / 256 * (q5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K));
      const auto* b4 = reinterpret_cast<const BlockQ4_K*>(block);
      const auto* b5 = reinterpret_cast<const BlockQ5_K*>(block);
      const int e = static_cast<int>(i % 256), j = e / 32, l = e % 32;
      const uint8_t byte = q5 ? b5->qs[j / 2 * 32 + l] : b4->qs[j / 2 * 32 + l];
      int q = j % 2 == 0 ? byte & 0x0F : byte >> 4;
      if (q5) q |= ((b5->qh[l] >> j) & 1) << 4;
      const auto [sc, mn] = k_scale_min(q5 ? b5->scales : b4->scales, j);
      const double d = fp16_to_f32(q5 ? b5->d : b4->d) * sc;
      const double m = -fp16_to_f32(q5 ? b5->dmin : b4->dmin) * mn;
      return {q, d, m, round_to_f16(d), round_to_f16(m)};
    }
    default:
      ADD_FAILURE() << "no element reader for " << tensor_type_info(w.type).name;
      return {0, 0.0, 0.0, 0.0, 0.0};
  }
}
// The weight the kernel multiplies (f16-rounded once from its f16 scales), and the exact one.
double exact(const Matrix& w, const Element& e) { return (e.q - bias_of(w.type)) * e.d + e.m; }
double rounded(const Matrix& w, const Element& e) {
  return round_to_f16((e.q - bias_of(w.type)) * e.d16 + e.m16);
}
// A bound on |rounded - exact|: half an f16 ulp of the weight (and of its rounded scales'
// contributions, the K types), an f16 subnormal step for each rounding.
double rounding_slack(const Matrix& w, const Element& e) {
  const double v = exact(w, e);
  if (!scales_rounded(w.type)) return kF16Rel * std::fabs(v) + kF16SubnormalStep;
  const double q = std::abs(e.q - bias_of(w.type));
  return kF16Rel * (std::fabs(v) + q * std::fabs(e.d) + std::fabs(e.m)) * (1 + 1e-3) +
         (2 + q) * kF16SubnormalStep;
}

// Matrices with sub-blocks of tiny weights (f16 subnormal products) among the rows.
Matrix make_matrix(TensorType type, int64_t rows, int64_t cols, uint32_t seed) {
  return mma_test::make_matrix(type, rows, cols, seed, true);
}

// kMaxBatch rows of f16 activations (random normal; column 0's first sub-block zero).
struct Activations {
  int64_t cols;
  std::vector<double> host;  // the exact f16 values
  DeviceArray<uint16_t> device;
  Activations(int64_t n_in, uint32_t seed)
      : cols(n_in), device(static_cast<size_t>(kMaxBatch * n_in)) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<uint16_t> bits(static_cast<size_t>(kMaxBatch * n_in));
    host.resize(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) {
      bits[i] = i < 32 ? 0 : f32_to_fp16(dist(rng));
      host[i] = fp16_to_f32(bits[i]);
    }
    device.upload(bits);
  }
  kernels::MatvecInputF16 input(int batch) const {
    kernels::MatvecInputF16 in;
    in.n_in = static_cast<int>(cols);
    in.batch = batch;
    in.x = reinterpret_cast<const __half*>(device.get());
    return in;
  }
  const double* column(int c) const { return host.data() + static_cast<size_t>(c) * cols; }
};

// Row r's weights, rounded as the kernel rounds them and exact.
struct RowWeights {
  std::vector<double> rounded, exact, slack;
};
RowWeights row_weights(const Matrix& m, int64_t r) {
  RowWeights w;
  w.rounded.resize(static_cast<size_t>(m.cols));
  w.exact.resize(static_cast<size_t>(m.cols));
  w.slack.resize(static_cast<size_t>(m.cols));
  for (int64_t i = 0; i < m.cols; ++i) {
    const Element e = element(m, r, i);
    w.rounded[static_cast<size_t>(i)] = rounded(m, e);
    w.exact[static_cast<size_t>(i)] = exact(m, e);
    w.slack[static_cast<size_t>(i)] = rounding_slack(m, e);
  }
  // The element reader agrees with the engine's dequantisation (f32: 2^-24 relative).
  std::vector<float> values(static_cast<size_t>(m.cols));
  dequantize_row(m.type, m.gguf.data() + r * m.gguf_row_bytes, values.data(), m.cols);
  int unequal = 0;
  for (int64_t i = 0; i < m.cols; ++i) {
    const double e = w.exact[static_cast<size_t>(i)], v = values[static_cast<size_t>(i)];
    if (!(std::fabs(v - e) <= 1e-6 * std::fabs(e) + 1e-12) && ++unequal <= 3)
      ADD_FAILURE() << tensor_type_info(m.type).name << " row " << r << " element " << i << ": "
                    << e << " dequantised " << v;
  }
  return w;
}

// One output's reference: the sum with the kernel's weights and its bound, and the sum with
// the exact weights and the bound against that (the f16 rounding of every weight on top).
struct Reference {
  double value = 0, bound = 0, exact = 0, exact_bound = 0;
};
Reference reference(const RowWeights& w, const double* x, int64_t cols) {
  Reference ref;
  double magnitude = 0, slack = 0;
  for (int64_t i = 0; i < cols; ++i) {
    const size_t at = static_cast<size_t>(i);
    ref.value += w.rounded[at] * x[i];
    magnitude += std::fabs(w.rounded[at] * x[i]);
    ref.exact += w.exact[at] * x[i];
    slack += w.slack[at] * std::fabs(x[i]);
  }
  ref.bound = kRelError * magnitude + 1e-30;
  ref.exact_bound = ref.bound + slack;
  return ref;
}

// silu(W_gate x) * (W_up x) from the two rows' references, and the bound of the kernel's f32
// result around it: silu' lies within [-0.1, 1.1]; 1e-5 relative for the f32 silu itself.
std::pair<double, double> swiglu_reference(const RowWeights& gate, const RowWeights& up,
                                           const double* x, int64_t cols) {
  const Reference g = reference(gate, x, cols), u = reference(up, x, cols);
  const double expected = g.value / (1.0 + std::exp(-g.value)) * u.value;
  const double bound = 1.1 * g.bound * (std::fabs(u.value) + u.bound) +
                       1.1 * (std::fabs(g.value) + g.bound) * u.bound + 1e-5 * std::fabs(expected) +
                       1e-30;
  return {expected, bound};
}

// Rows to check against the host: all of the first 70, a stride through the rest, the last
// 17 (every row for small matrices).
std::vector<int64_t> sampled_rows(int64_t rows) {
  std::vector<int64_t> out;
  for (int64_t r = 0; r < std::min<int64_t>(rows, 70); ++r) out.push_back(r);
  for (int64_t r = 70; r < rows; r += std::max<int64_t>(1, rows / 41)) out.push_back(r);
  for (int64_t r = std::max<int64_t>(70, rows - 17); r < rows; ++r)
    if (out.back() < r) out.push_back(r);
  return out;
}

// Every element of the batch written (not the NaN poison), none past it.
void expect_written_exactly(const std::vector<float>& y, int64_t rows, int batch) {
  int unwritten = 0, past = 0;
  for (int64_t i = 0; i < batch * rows; ++i) unwritten += std::isnan(y[static_cast<size_t>(i)]);
  past = mma_test::written_past(y, rows, batch);
  EXPECT_EQ(unwritten, 0) << "elements of the batch left unwritten (or NaN)";
  EXPECT_EQ(past, 0) << "elements written past the batch";
}

kernels::KernelConfig f16mma_config() {
  const kernels::KernelConfig config = gpu_test::kernel_config();
  return config;
}

#define REQUIRE_F16MMA()                     \
  GRANULE_REQUIRE_GPU();                     \
  if (!kernels::matvec_f16mma_fits_device()) \
  GTEST_SKIP() << "no f16 mma.sync (compute capability 8.0) on this device or build"

class MatvecF16Mma : public ::testing::TestWithParam<Shape> {};

// Every batch size on one matrix: sampled rows (tile edges, a stride, the last rows) against
// the host reference, every element written.
TEST_P(MatvecF16Mma, MatchesHostReference) {
  REQUIRE_F16MMA();
  const kernels::KernelConfig config = f16mma_config();
  const Shape s = GetParam();
  const uint32_t type = static_cast<uint32_t>(s.type);
  const Matrix w = make_matrix(s.type, s.rows, s.cols, static_cast<uint32_t>(s.rows * 3 + s.cols));
  const Activations act(s.cols, static_cast<uint32_t>(s.cols + 17));
  const std::vector<int64_t> rows = sampled_rows(s.rows);
  std::vector<RowWeights> weights;
  for (const int64_t r : rows) weights.push_back(row_weights(w, r));

  for (const int batch : {1, 7, 16, 17, 32, 33, 64}) {
    SCOPED_TRACE(std::string(tensor_type_info(s.type).name) + " " + std::to_string(s.rows) + "x" +
                 std::to_string(s.cols) + " batch " + std::to_string(batch));
    Output out(s.rows, batch);
    const kernels::MatvecTask task = task_for(w, out.y.get());
    CUDA_OK(kernels::launch_matvec_f16mma(type, &task, 1, act.input(batch), config, nullptr));
    const std::vector<float> got = out.y.download();
    expect_written_exactly(got, s.rows, batch);
    int bad = 0, bad_exact = 0;
    double worst = 0;  // largest error as a fraction of its bound
    for (int c = 0; c < batch; ++c)
      for (size_t k = 0; k < rows.size(); ++k) {
        const Reference ref = reference(weights[k], act.column(c), s.cols);
        const double v = got[static_cast<size_t>(c * s.rows + rows[k])];
        const double error = std::fabs(v - ref.value);
        worst = std::max(worst, error / ref.bound);
        if (!(error <= ref.bound) && ++bad <= 5)
          ADD_FAILURE() << "row " << rows[k] << " column " << c << ": " << v << " reference "
                        << ref.value << " bound " << ref.bound;
        if (!(std::fabs(v - ref.exact) <= ref.exact_bound) && ++bad_exact <= 5)
          ADD_FAILURE() << "row " << rows[k] << " column " << c << ": " << v << " exact "
                        << ref.exact << " bound " << ref.exact_bound;
      }
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(bad_exact, 0);
    RecordProperty("worst_fraction_of_bound_b" + std::to_string(batch), std::to_string(worst));
  }
}

// rows x columns: SmolLM2-135M's (576 -> 1536, 1536 -> 576, 576 -> 192), an 8B model's
// (4096 -> 4096, 4096 -> 1024, 14336 -> 4096; 4096 -> 14336 in the SwiGLU test).
constexpr std::pair<int64_t, int64_t> kModelShapes[] = {{1536, 576},  {576, 1536},  {192, 576},
                                                        {4096, 4096}, {1024, 4096}, {4096, 14336}};

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (TensorType t : {TensorType::Q4_0, TensorType::Q4_1})
    for (const auto& [rows, cols] : kModelShapes) out.push_back({t, rows, cols});
  // Odd row counts (partial row tiles), an odd number of sub-blocks (a partial stage, the
  // scale copy reaching into the row padding), short rows of one and two sub-blocks (fewer
  // stages than warps), 37 sub-blocks (several stages per warp, the last partial).
  out.push_back({TensorType::Q4_0, 100, 608});
  out.push_back({TensorType::Q4_1, 17, 608});
  out.push_back({TensorType::Q4_0, 17, 32});
  out.push_back({TensorType::Q4_1, 100, 32});
  out.push_back({TensorType::Q4_0, 50, 64});
  out.push_back({TensorType::Q4_1, 33, 64});
  out.push_back({TensorType::Q4_0, 200, 1184});
  out.push_back({TensorType::Q4_1, 1000, 1184});
  // Block shapes (on a 132-SM device): the rows above take 32 rows per warp, in 8-warp blocks
  // up to 132 blocks and 4-warp blocks above, and 64 rows per warp where that gives >= 2 blocks
  // per SM: 40,000 rows (625 blocks), with a partial last row block.
  out.push_back({TensorType::Q4_0, 40000, 128});
  out.push_back({TensorType::Q4_1, 40000, 96});
  // Q8_0 (32 bytes per sub-block: four 16-byte copies per stage row, one ldmatrix.x4 per
  // m-tile) in the same shapes.
  for (const auto& [rows, cols] : kModelShapes) out.push_back({TensorType::Q8_0, rows, cols});
  for (const auto& [rows, cols] : std::initializer_list<std::pair<int64_t, int64_t>>{
           {100, 608}, {17, 32}, {50, 64}, {200, 1184}, {40000, 128}})
    out.push_back({TensorType::Q8_0, rows, cols});
  // IQ4_NL (Q4_0's layout, levels through the table): the model shapes, odd rows and a partial
  // stage, short rows, and the 64-rows-per-warp shape.
  // MXFP4 the same (its stage's two e bytes inside an aligned word: 19 sub-blocks put the last
  // stage's at bytes 18, 19 of the row's e).
  for (TensorType t : {TensorType::IQ4_NL, TensorType::MXFP4}) {
    for (const auto& [rows, cols] : kModelShapes) out.push_back({t, rows, cols});
    for (const auto& [rows, cols] : std::initializer_list<std::pair<int64_t, int64_t>>{
             {77, 608}, {17, 32}, {50, 64}, {40000, 128}})
      out.push_back({t, rows, cols});
  }
  // The K types (rows of whole 256-element super-blocks; their host quantiser is 5-10 times
  // slower, so the 8B shapes are cut to at most 17M weights): the 8B model's rows, odd row
  // counts, one, two and three super-blocks (a Q6_K stage's d in either half of its 4-byte
  // pair), and the 64-rows-per-warp shape (20,000 rows: 313 blocks).
  for (TensorType t : {TensorType::Q2_K, TensorType::Q3_K, TensorType::Q4_K, TensorType::Q5_K,
                       TensorType::Q6_K, TensorType::IQ4_XS})
    for (const auto& [rows, cols] :
         std::initializer_list<std::pair<int64_t, int64_t>>{{576, 1536},
                                                            {4096, 4096},
                                                            {1024, 4096},
                                                            {1024, 14336},
                                                            {100, 256},
                                                            {17, 512},
                                                            {33, 768},
                                                            {1000, 2304},
                                                            {20000, 256}})
      out.push_back({t, rows, cols});
  return out;
}

// The types past Q4_0/Q4_1, and all of them.
constexpr TensorType kNewTypes[] = {TensorType::Q8_0,   TensorType::Q2_K,   TensorType::Q3_K,
                                    TensorType::Q4_K,   TensorType::Q5_K,   TensorType::Q6_K,
                                    TensorType::IQ4_NL, TensorType::IQ4_XS, TensorType::MXFP4};
constexpr TensorType kAllTypes[] = {TensorType::Q4_0,   TensorType::Q4_1, TensorType::Q8_0,
                                    TensorType::Q2_K,   TensorType::Q3_K, TensorType::Q4_K,
                                    TensorType::Q5_K,   TensorType::Q6_K, TensorType::IQ4_NL,
                                    TensorType::IQ4_XS, TensorType::MXFP4};
// Whether rows of `cols` elements are whole blocks of the type.
bool fits(TensorType t, int64_t cols) {
  return cols % kernels::split::block_elements(static_cast<uint32_t>(t)) == 0;
}
// The K types' host quantiser is 5-10 times slower than Q4_0's: their matrices stay under
// ~17M weights (an 8B model's 4096 x 4096) in the tests below.
bool too_slow_to_quantise(TensorType t, int64_t rows, int64_t cols) {
  return kernels::split::is_k_type(static_cast<uint32_t>(t)) && rows * cols > 4096 * 4096;
}

INSTANTIATE_TEST_SUITE_P(ModelShapes, MatvecF16Mma, ::testing::ValuesIn(shapes()), shape_name);

// The bound is tight: the kernel's output lies inside it around the reference, and outside
// it around the reference of a matrix with one weight one quantisation step off (the element
// with the largest |d x| of the row, its nibble moved by one).
TEST(MatvecF16MmaBound, PinsOneWrongNibble) {
  REQUIRE_F16MMA();
  const kernels::KernelConfig config = f16mma_config();
  for (TensorType type : kAllTypes) {
    SCOPED_TRACE(tensor_type_info(type).name);
    // The longest rows of an 8B model; shorter where a type's values are larger against a step
    // (a step |d x| must stay above kRelError of the row's magnitude; the level types' step here
    // is one unit of d, up to 127 of which make a weight, as Q8_0's).
    const bool unit_steps =
        type == TensorType::Q8_0 || type == TensorType::IQ4_NL || type == TensorType::IQ4_XS;
    const int64_t rows = 64, cols = unit_steps ? 1024
                                    : type == TensorType::Q6_K || type == TensorType::Q5_K ||
                                            type == TensorType::MXFP4
                                        ? 4096
                                        : 14336;
    const int batch = 32;
    const Matrix w = make_matrix(type, rows, cols, 41);
    const Activations act(cols, 43);
    Output out(rows, batch);
    const kernels::MatvecTask task = task_for(w, out.y.get());
    CUDA_OK(kernels::launch_matvec_f16mma(static_cast<uint32_t>(type), &task, 1, act.input(batch),
                                          config, nullptr));
    const std::vector<float> got = out.y.download();
    double closest = INFINITY;  // smallest |error around the wrong reference| / bound
    for (int64_t r = 0; r < rows; r += 9) {
      const RowWeights weights = row_weights(w, r);
      for (int c = 1; c < batch; c += 5) {
        const double* x = act.column(c);
        const Reference ref = reference(weights, x, cols);
        const double v = got[static_cast<size_t>(c * rows + r)];
        ASSERT_LE(std::fabs(v - ref.value), ref.bound) << "row " << r << " column " << c;
        int64_t most = 0;
        for (int64_t i = 1; i < cols; ++i)
          if (std::fabs(element(w, r, i).d * x[i]) > std::fabs(element(w, r, most).d * x[most]))
            most = i;
        Element e = element(w, r, most);
        e.q = e.q < largest_q(type) ? e.q + 1 : e.q - 1;
        const double wrong =
            ref.value + (rounded(w, e) - weights.rounded[static_cast<size_t>(most)]) * x[most];
        EXPECT_GT(std::fabs(v - wrong), ref.bound) << "row " << r << " column " << c;
        closest = std::min(closest, std::fabs(v - wrong) / ref.bound);
      }
    }
    RecordProperty("closest_wrong_over_bound_" + std::string(tensor_type_info(type).name),
                   std::to_string(closest));
  }
}

// Q, K and V in one launch (three row counts), K accumulating into what y held.
TEST(MatvecF16MmaTasks, ThreeMatricesInOneLaunchAndAccumulate) {
  REQUIRE_F16MMA();
  const kernels::KernelConfig config = f16mma_config();
  std::mt19937 rng(5);
  for (TensorType type : kAllTypes) {
    const int64_t cols = fits(type, 608) ? 608 : 768, rows[3] = {200, 72, 40};
    const Activations act(cols, 23);
    std::vector<Matrix> w;
    std::vector<std::vector<RowWeights>> weights(3);
    for (int i = 0; i < 3; ++i) {
      w.push_back(make_matrix(type, rows[i], cols, 100 + i));
      for (int64_t r = 0; r < rows[i]; ++r)
        weights[static_cast<size_t>(i)].push_back(row_weights(w.back(), r));
    }
    for (const int batch : {1, 5, 13, 16, 33, 64}) {
      SCOPED_TRACE(std::string(tensor_type_info(type).name) + " batch " + std::to_string(batch));
      std::vector<DeviceArray<float>> y;
      std::vector<std::vector<float>> start;
      kernels::MatvecTask tasks[3];
      for (int i = 0; i < 3; ++i) {
        start.push_back(gpu_test::random_floats(static_cast<size_t>(rows[i] * batch), rng));
        y.emplace_back(start.back());
        tasks[i] = task_for(w[static_cast<size_t>(i)], y.back().get());
        tasks[i].accumulate = i == 1;
      }
      CUDA_OK(kernels::launch_matvec_f16mma(static_cast<uint32_t>(type), tasks, 3, act.input(batch),
                                            config, nullptr));
      for (int i = 0; i < 3; ++i) {
        const std::vector<float> got = y[static_cast<size_t>(i)].download();
        for (int c = 0; c < batch; ++c)
          for (int64_t r = 0; r < rows[i]; ++r) {
            const size_t at = static_cast<size_t>(c * rows[i] + r);
            const Reference ref = reference(weights[static_cast<size_t>(i)][static_cast<size_t>(r)],
                                            act.column(c), cols);
            const double before = start[static_cast<size_t>(i)][at];
            const double want = ref.value + (i == 1 ? before : 0.0);
            const double bound = ref.bound + (i == 1 ? 1e-6 * std::fabs(before) : 0.0);
            ASSERT_LE(std::fabs(static_cast<double>(got[at]) - want), bound)
                << "matrix " << i << " row " << r << " column " << c;
          }
      }
    }
  }
}

// Gate and up in one pass, silu(gate x) * (up x), under `config`: sampled rows of each
// rows x columns matrix pair against the host reference at each batch, every element written.
void check_swiglu(const kernels::KernelConfig& config, std::initializer_list<int> batches,
                  std::initializer_list<std::pair<int64_t, int64_t>> matrices) {
  for (TensorType type : kAllTypes)
    for (const auto& [rows, cols] : matrices) {
      if (!fits(type, cols) || too_slow_to_quantise(type, rows, cols)) continue;
      const Matrix gate = make_matrix(type, rows, cols, 7), up = make_matrix(type, rows, cols, 8);
      const Activations act(cols, 29);
      const std::vector<int64_t> sampled = sampled_rows(rows);
      std::vector<RowWeights> gw, uw;
      for (const int64_t r : sampled) {
        gw.push_back(row_weights(gate, r));
        uw.push_back(row_weights(up, r));
      }
      for (const int batch : batches) {
        SCOPED_TRACE(std::string(tensor_type_info(type).name) + " " + std::to_string(rows) + "x" +
                     std::to_string(cols) + " batch " + std::to_string(batch));
        Output fused(rows, batch);
        kernels::MatvecTask task = task_for(gate, fused.y.get());
        task.weight_up = up.device.get();
        CUDA_OK(kernels::launch_matvec_f16mma(static_cast<uint32_t>(type), &task, 1,
                                              act.input(batch), config, nullptr));
        const std::vector<float> got = fused.y.download();
        expect_written_exactly(got, rows, batch);
        int bad = 0;
        for (int c = 0; c < batch; ++c)
          for (size_t k = 0; k < sampled.size(); ++k) {
            const auto [expected, bound] = swiglu_reference(gw[k], uw[k], act.column(c), cols);
            const double v = got[static_cast<size_t>(c) * static_cast<size_t>(rows) +
                                 static_cast<size_t>(sampled[k])];
            if (!(std::fabs(v - expected) <= bound) && ++bad <= 5)
              ADD_FAILURE() << "row " << sampled[k] << " column " << c << ": " << v << " expected "
                            << expected << " bound " << bound;
          }
        EXPECT_EQ(bad, 0);
      }
    }
}

// A small matrix (at 1-16 columns 32 rows per warp, 8-warp blocks), 3000 rows (32 rows per
// warp in 4-warp blocks on a 132-SM device), the 8B model's (64 rows per warp), and rows of two
// sub-blocks; at 17-64 columns all four take the shared-activation shape (rows of two
// sub-blocks: a group of warps without a stage).
TEST(MatvecF16MmaTasks, FusedSwigluMatchesReference) {
  REQUIRE_F16MMA();
  check_swiglu(f16mma_config(), {1, 7, 16, 17, 32, 33, 64},
               {{300, 1024}, {3000, 256}, {14336, 4096}, {4096, 4096}, {33, 64}, {33, 256}});
}

// Plain products in one launch, some accumulating, at 16, 17, 32, 33 and 64 columns: sampled
// rows against the host reference; a second launch from the same y gives the same bits (a fixed
// summation order).
struct ProductCase {
  const char* name;
  std::vector<std::pair<int64_t, int64_t>> matrices;  // rows x columns (n_in the same for all)
  std::vector<bool> accumulate;
};

void check_case(TensorType type, const ProductCase& cc, const kernels::KernelConfig& config,
                std::mt19937& rng) {
  const int64_t cols = cc.matrices[0].second;
  const Activations act(cols, static_cast<uint32_t>(cols + 5));
  const size_t n = cc.matrices.size();
  std::vector<Matrix> w;
  std::vector<std::vector<int64_t>> sampled(n);
  std::vector<std::vector<RowWeights>> weights(n);
  for (size_t i = 0; i < n; ++i) {
    w.push_back(make_matrix(type, cc.matrices[i].first, cols, static_cast<uint32_t>(300 + i)));
    sampled[i] = sampled_rows(cc.matrices[i].first);
    for (const int64_t r : sampled[i]) weights[i].push_back(row_weights(w.back(), r));
  }
  for (const int batch : {16, 17, 32, 33, 64}) {
    SCOPED_TRACE(std::string(tensor_type_info(type).name) + " " + cc.name + " batch " +
                 std::to_string(batch));
    std::vector<std::vector<float>> start;
    std::vector<DeviceArray<float>> y;
    std::vector<kernels::MatvecTask> tasks;
    for (size_t i = 0; i < n; ++i) {
      const int64_t rows = cc.matrices[i].first;
      start.push_back(gpu_test::random_floats(static_cast<size_t>(rows * batch), rng));
      y.emplace_back(start.back());
      tasks.push_back(task_for(w[i], y.back().get()));
      tasks.back().accumulate = cc.accumulate[i];
    }
    const uint32_t t = static_cast<uint32_t>(type);
    const int count = static_cast<int>(n);
    CUDA_OK(
        kernels::launch_matvec_f16mma(t, tasks.data(), count, act.input(batch), config, nullptr));
    std::vector<std::vector<float>> first;
    for (size_t i = 0; i < n; ++i) {
      first.push_back(y[i].download());
      y[i].upload(start[i]);
    }
    CUDA_OK(
        kernels::launch_matvec_f16mma(t, tasks.data(), count, act.input(batch), config, nullptr));
    for (size_t i = 0; i < n; ++i) {
      const std::vector<float> again = y[i].download();
      EXPECT_EQ(std::memcmp(first[i].data(), again.data(), again.size() * sizeof(float)), 0)
          << "matrix " << i << ": two launches gave different bits";
      const int64_t rows = cc.matrices[i].first;
      int bad = 0;
      for (int c = 0; c < batch; ++c)
        for (size_t k = 0; k < sampled[i].size(); ++k) {
          const size_t at = static_cast<size_t>(c * rows + sampled[i][k]);
          const Reference ref = reference(weights[i][k], act.column(c), cols);
          const double before = cc.accumulate[i] ? start[i][at] : 0.0;
          const double want = ref.value + before;
          const double bound = ref.bound + 1e-6 * std::fabs(before);
          const double v = first[i][at];
          if (!(std::fabs(v - want) <= bound) && ++bad <= 5)
            ADD_FAILURE() << "matrix " << i << " row " << sampled[i][k] << " column " << c << ": "
                          << v << " want " << want << " bound " << bound;
        }
      EXPECT_EQ(bad, 0) << "matrix " << i;
    }
  }
}

// An 8B model's wo and down with accumulate on and its Q, K and V in one launch (K
// accumulating); rows that end inside a block; rows of two sub-blocks and of one (warps without
// a stage).
TEST(MatvecF16MmaTasks, ShapesOf8BAccumulateAndRepeat) {
  REQUIRE_F16MMA();
  const kernels::KernelConfig config = f16mma_config();
  std::mt19937 rng(78);
  const ProductCase cases[] = {
      {"wo", {{4096, 4096}}, {true}},
      {"down", {{4096, 14336}}, {true}},
      {"long rows", {{1024, 14336}}, {true}},  // the K types' down
      {"qkv", {{4096, 4096}, {1024, 4096}, {1024, 4096}}, {false, true, false}},
      {"odd", {{100, 608}, {17, 608}}, {false, true}},
      {"short", {{50, 64}, {33, 64}}, {true, false}},
      {"one", {{40, 32}}, {false}},
      {"one super-block", {{40, 256}, {17, 256}}, {false, true}},
  };
  for (TensorType type : kAllTypes)
    for (const ProductCase& cc : cases) {
      bool runs = fits(type, cc.matrices[0].second);
      for (const auto& [rows, cols] : cc.matrices)
        runs = runs && !too_slow_to_quantise(type, rows, cols);
      if (runs) check_case(type, cc, config, rng);
    }
}

// Half an f16 ulp of |v| (its rounding error to nearest), subnormals included.
double half_f16_ulp(double v) {
  if (v == 0) return std::ldexp(1.0, -25);
  int e = 0;
  std::frexp(v, &e);
  return std::ldexp(1.0, std::max(e - 12, -25));
}

// SwiGLU with the result in f16 (task.y_f16: the down projection's input): every element of
// the batch written, nothing past it, y untouched (null), each value within the f32 bound of
// FusedSwigluMatchesReference plus half an f16 ulp; and the same bits as the f32 result rounded.
TEST(MatvecF16MmaTasks, FusedSwigluWritesF16) {
  REQUIRE_F16MMA();
  const kernels::KernelConfig config = f16mma_config();
  for (TensorType type : kAllTypes)
    for (const auto& [rows, cols] :
         {std::pair<int64_t, int64_t>{300, 1024}, {14336, 4096}, {4096, 4096}}) {
      if (too_slow_to_quantise(type, rows, cols) ||
          (rows == 4096 && !too_slow_to_quantise(type, 14336, cols)))
        continue;  // the K types take 4096 rows instead of 14336
      const Matrix gate = make_matrix(type, rows, cols, 17), up = make_matrix(type, rows, cols, 18);
      const Activations act(cols, 31);
      const std::vector<int64_t> sampled = sampled_rows(rows);
      std::vector<RowWeights> gw, uw;
      for (const int64_t r : sampled) {
        gw.push_back(row_weights(gate, r));
        uw.push_back(row_weights(up, r));
      }
      for (const int batch : {1, 16, 17, 32, 33, 64}) {
        SCOPED_TRACE(std::string(tensor_type_info(type).name) + " " + std::to_string(rows) + "x" +
                     std::to_string(cols) + " batch " + std::to_string(batch));
        DeviceArray<uint16_t> half_y(static_cast<size_t>((batch + 1) * rows));
        half_y.poison();  // 0xFFFF: an f16 NaN
        kernels::MatvecTask task = task_for(gate, nullptr);
        task.weight_up = up.device.get();
        task.y_f16 = reinterpret_cast<__half*>(half_y.get());
        CUDA_OK(kernels::launch_matvec_f16mma(static_cast<uint32_t>(type), &task, 1,
                                              act.input(batch), config, nullptr));
        const std::vector<uint16_t> bits = half_y.download();
        // The f32 result of the same launch, to compare bits after rounding.
        Output f32(rows, batch);
        kernels::MatvecTask plain = task_for(gate, f32.y.get());
        plain.weight_up = up.device.get();
        CUDA_OK(kernels::launch_matvec_f16mma(static_cast<uint32_t>(type), &plain, 1,
                                              act.input(batch), config, nullptr));
        const std::vector<float> wide = f32.y.download();
        int unwritten = 0, past = 0, unequal = 0;
        for (int64_t i = 0; i < batch * rows; ++i) {
          const uint16_t b = bits[static_cast<size_t>(i)];
          unwritten += b == 0xFFFFu;
          unequal += b != f32_to_fp16(wide[static_cast<size_t>(i)]);
        }
        for (int64_t r = 0; r < rows; ++r)
          past += bits[static_cast<size_t>(batch * rows + r)] != 0xFFFFu;
        EXPECT_EQ(unwritten, 0) << "elements of the batch left unwritten";
        EXPECT_EQ(past, 0) << "elements written past the batch";
        EXPECT_EQ(unequal, 0) << "f16 results that are not the f32 results rounded to nearest";
        int bad = 0;
        for (int c = 0; c < batch; ++c)
          for (size_t k = 0; k < sampled.size(); ++k) {
            const auto [expected, f32_bound] = swiglu_reference(gw[k], uw[k], act.column(c), cols);
            const double bound = f32_bound + half_f16_ulp(std::fabs(expected) + f32_bound);
            const double v = fp16_to_f32(bits[static_cast<size_t>(c) * static_cast<size_t>(rows) +
                                              static_cast<size_t>(sampled[k])]);
            if (!(std::fabs(v - expected) <= bound) && ++bad <= 5)
              ADD_FAILURE() << "row " << sampled[k] << " column " << c << ": " << v << " expected "
                            << expected << " bound " << bound;
          }
        EXPECT_EQ(bad, 0);
      }
    }
}

TEST(MatvecF16MmaTasks, RefusesWhatItCannotRun) {
  const auto q4_0 = static_cast<uint32_t>(TensorType::Q4_0);
  for (const TensorType type : kAllTypes) {
    EXPECT_TRUE(kernels::matvec_f16mma_supports(static_cast<uint32_t>(type), true))
        << tensor_type_info(type).name;
    EXPECT_FALSE(kernels::matvec_f16mma_supports(static_cast<uint32_t>(type), false))
        << tensor_type_info(type).name;
  }
  for (const auto type : {TensorType::Q5_0, TensorType::Q5_1, TensorType::F16})
    EXPECT_FALSE(kernels::matvec_f16mma_supports(static_cast<uint32_t>(type), true))
        << tensor_type_info(type).name;
  REQUIRE_F16MMA();
  const kernels::KernelConfig config = f16mma_config();
  const Matrix w = make_matrix(TensorType::Q4_0, 16, 64, 3);
  const Activations act(64, 4);
  Output y(16, 8);
  kernels::MatvecTask t = task_for(w, y.y.get());
  for (const auto type : {TensorType::Q5_0, TensorType::Q5_1, TensorType::F16})
    EXPECT_EQ(kernels::launch_matvec_f16mma(static_cast<uint32_t>(type), &t, 1, act.input(8),
                                            config, nullptr),
              cudaErrorInvalidValue)
        << tensor_type_info(type).name;
  for (const TensorType type : kNewTypes) {  // rows of 64: not whole super-blocks (K types)
    if (fits(type, 64)) continue;
    const Matrix k = make_matrix(type, 16, 256, 3);
    kernels::MatvecTask kt = task_for(k, y.y.get());
    kernels::MatvecInputF16 part = act.input(8);  // 64 of the 256 elements
    EXPECT_EQ(
        kernels::launch_matvec_f16mma(static_cast<uint32_t>(type), &kt, 1, part, config, nullptr),
        cudaErrorInvalidValue)
        << tensor_type_info(type).name;
  }
  t.split_layout = false;  // GGUF blocks
  EXPECT_EQ(kernels::launch_matvec_f16mma(q4_0, &t, 1, act.input(8), config, nullptr),
            cudaErrorInvalidValue);
  t.split_layout = true;
  kernels::MatvecInputF16 odd = act.input(8);
  odd.n_in = 48;  // not whole sub-blocks
  EXPECT_EQ(kernels::launch_matvec_f16mma(q4_0, &t, 1, odd, config, nullptr),
            cudaErrorInvalidValue);
  kernels::MatvecInputF16 misaligned = act.input(8);
  misaligned.x += 1;  // rows not 16-byte aligned
  EXPECT_EQ(kernels::launch_matvec_f16mma(q4_0, &t, 1, misaligned, config, nullptr),
            cudaErrorInvalidValue);
  kernels::MatvecInputF16 long_rows = act.input(8);
  long_rows.n_in = 128;  // longer than the matrix's rows
  EXPECT_EQ(kernels::launch_matvec_f16mma(q4_0, &t, 1, long_rows, config, nullptr),
            cudaErrorInvalidValue);
  DeviceArray<__half> half_out(16 * 8);
  kernels::MatvecTask to_f16 = t;
  to_f16.y_f16 = half_out.get();
  to_f16.accumulate = true;  // an f16 result cannot accumulate
  EXPECT_EQ(kernels::launch_matvec_f16mma(q4_0, &to_f16, 1, act.input(8), config, nullptr),
            cudaErrorInvalidValue);
  kernels::MatvecTask mixed[2] = {t, t};
  mixed[1].weight_up = w.device.get();  // SwiGLU and a plain product in one launch
  EXPECT_EQ(kernels::launch_matvec_f16mma(q4_0, mixed, 2, act.input(8), config, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::launch_matvec_f16mma(q4_0, &t, 0, act.input(8), config, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::launch_matvec_f16mma(q4_0, &t, 1, act.input(0), config, nullptr), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // a refusal leaves no error behind
  const std::vector<float> untouched = y.y.download();
  int written = 0;
  for (const float v : untouched) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    written += bits != kPoisonBits;
  }
  EXPECT_EQ(written, 0) << "a refused launch wrote y";
}

// A split-layout matrix of random bytes with its f16 scales set to 0.01-0.02 (Q4_1's m, Q4_K/
// Q5_K/Q2_K's dmin too; IQ4_XS's and Q3_K's int8 scales in -32..31, MXFP4's e bytes
// 2^-10..2^-3): timing only. (Q2_K's scale bytes stay random: both nibbles are in range.)
DeviceArray<uint8_t> random_split(TensorType type, int64_t rows, int64_t cols,
                                  std::mt19937_64& rng) {
  namespace split = kernels::split;
  const uint32_t t = static_cast<uint32_t>(type);
  const int64_t n = cols / 32, stride = split_row_stride(t, cols);
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * stride) + 16, 0);
  for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&bytes[i], &v, 8);
  }
  // (offset of the first f16, f16 values per row, bytes between them)
  const auto [offset, count, step] =
      type == TensorType::Q4_1 ? std::tuple<int64_t, int64_t, int64_t>{16 * n, 2 * n, 2}
      : type == TensorType::Q6_K
          ? std::tuple<int64_t, int64_t, int64_t>{split::q6k_d_offset(n), n / 8, 2}
      : type == TensorType::Q4_K || type == TensorType::Q5_K
          ? std::tuple<int64_t, int64_t, int64_t>{split::kquant_d_offset(t, n), n / 4, 2}
      : type == TensorType::Q2_K
          ? std::tuple<int64_t, int64_t, int64_t>{split::q2k_d_offset(n), n / 4, 2}
      : type == TensorType::Q3_K
          ? std::tuple<int64_t, int64_t, int64_t>{split::q3k_d_offset(n), n / 8, 2}
      : type == TensorType::IQ4_XS
          ? std::tuple<int64_t, int64_t, int64_t>{split::iq4xs_d_offset(n), n / 8, 2}
          : std::tuple<int64_t, int64_t, int64_t>{split::scales_offset(t, n), n, 2};
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = &bytes[static_cast<size_t>(r * stride)];
    if (type == TensorType::MXFP4) {  // one e byte per sub-block: 2^-10 .. 2^-3, no f16
      for (int64_t j = 0; j < n; ++j)
        row[split::scales_offset(t, n) + j] = static_cast<uint8_t>(118 + (r + j) % 8);
      continue;
    }
    if (type == TensorType::IQ4_XS || type == TensorType::Q3_K)  // int8 scales (-32..31): one
      // per sub-block (IQ4_XS), one per 16 elements (Q3_K)
      for (int64_t j = 0; j < (type == TensorType::Q3_K ? 2 * n : n); ++j)
        row[split::scales_offset(t, n) + j] =
            static_cast<uint8_t>(static_cast<int8_t>(static_cast<int>((r + 3 * j) % 64) - 32));
    for (int64_t j = 0; j < count; ++j) {
      const uint16_t d = f32_to_fp16(0.01f + 0.01f * static_cast<float>((r + j) % 97) / 97.0f);
      std::memcpy(&row[offset + j * step], &d, 2);
    }
  }
  return DeviceArray<uint8_t>(bytes);
}

// Microseconds per launch over 50 launches (after 3 warm-up launches).
template <typename Launch>
double time_launches(Launch&& launch) {
  for (int i = 0; i < 3; ++i)
    if (launch() != cudaSuccess) return -1;
  cudaEvent_t begin, end;
  cudaEventCreate(&begin);
  cudaEventCreate(&end);
  const int launches = 50;
  cudaEventRecord(begin, nullptr);
  cudaError_t status = cudaSuccess;
  for (int i = 0; i < launches && status == cudaSuccess; ++i) status = launch();
  cudaEventRecord(end, nullptr);
  cudaEventSynchronize(end);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, begin, end);
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  return status == cudaSuccess ? 1e3 * ms / launches : -1;
}

// The four products of an 8B Q4_0 decode step (QKV, wo, gate+up, down) at 8-64 columns, f16
// mma beside the int8 mma kernel (launch_matvec_mma under the same config, on the same
// weights, with int8 activations): a probe to read on the device; it checks that every launch
// succeeds and that both kernels' outputs agree within the int8 activations' rounding.
void time_shapes_of_8b(TensorType type) {
  SCOPED_TRACE(tensor_type_info(type).name);
  const kernels::KernelConfig config = f16mma_config();
  const auto wt = static_cast<uint32_t>(type);
  const bool int8 = kernels::matvec_mma_fits_device() && kernels::matvec_mma_supports(wt, true);
  const std::string type_name(tensor_type_info(type).name);
  std::mt19937_64 rng(11);
  const int64_t d = 4096, kv = 1024, ff = 14336;
  const DeviceArray<uint8_t> wq = random_split(type, d, d, rng),
                             wk = random_split(type, kv, d, rng),
                             wv = random_split(type, kv, d, rng),
                             wo = random_split(type, d, d, rng),
                             gate = random_split(type, ff, d, rng),
                             up = random_split(type, ff, d, rng),
                             down = random_split(type, d, ff, rng);
  std::mt19937 frng(12);
  DeviceArray<float> x32(gpu_test::random_floats(static_cast<size_t>(kMaxBatch * ff), frng));
  DeviceArray<__half> x16(static_cast<size_t>(kMaxBatch * ff));
  CUDA_OK(kernels::launch_convert_f32_to_f16(x32.get(), kMaxBatch * ff, x16.get(), nullptr));
  DeviceArray<int8_t> qs(static_cast<size_t>(kMaxBatch * ff));
  DeviceArray<float2> ds(static_cast<size_t>(kMaxBatch * ff / 32));
  DeviceArray<float> y(static_cast<size_t>(kMaxBatch * ff));
  auto task = [&](const DeviceArray<uint8_t>& m, int64_t rows, int64_t cols, float* out) {
    kernels::MatvecTask t;
    t.weight = m.get();
    t.row_bytes = split_row_stride(wt, cols);
    t.split_layout = true;
    t.n_out = static_cast<int>(rows);
    t.y = out;
    t.y_stride = rows;
    return t;
  };
  struct Product {
    const char* name;
    int64_t cols;  // n_in
    std::vector<kernels::MatvecTask> tasks;
    double bytes;
  };
  const double bytes_per_weight =  // bytes per weight
      static_cast<double>(kernels::split::row_payload_bytes(wt, d)) / static_cast<double>(d);
  kernels::MatvecTask gate_up = task(gate, ff, d, y.get());
  gate_up.weight_up = up.get();
  const std::vector<Product> products = {
      {"qkv",
       d,
       {task(wq, d, d, y.get()), task(wk, kv, d, y.get() + kMaxBatch * d),
        task(wv, kv, d, y.get() + kMaxBatch * (d + kv))},
       (d + 2 * kv) * d * bytes_per_weight},
      {"wo", d, {task(wo, d, d, y.get())}, d * d * bytes_per_weight},
      {"gate+up", d, {gate_up}, 2 * ff * d * bytes_per_weight},
      {"down", ff, {task(down, d, ff, y.get())}, d * ff * bytes_per_weight}};
  // Microseconds per f16 launch of product p at `columns` columns under config c.
  auto time_f16 = [&](const Product& p, int columns, const kernels::KernelConfig& c) {
    kernels::MatvecInputF16 in16;
    in16.n_in = static_cast<int>(p.cols);
    in16.batch = columns;
    in16.x = x16.get();
    const int n_tasks = static_cast<int>(p.tasks.size());
    return time_launches([&] {
      return kernels::launch_matvec_f16mma(wt, p.tasks.data(), n_tasks, in16, c, nullptr);
    });
  };
  for (const int columns : {8, 16, 32, 64}) {
    for (const Product& p : products) {
      CUDA_OK(cudaMemset(y.get(), 0, y.size() * sizeof(float)));
      const double f16_us = time_f16(p, columns, config);
      ASSERT_GT(f16_us, 0) << p.name << " f16 mma launch failed";
      const std::vector<float> f16_y = y.download();
      double int8_us = 0;
      if (int8) {
        CUDA_OK(cudaMemset(y.get(), 0, y.size() * sizeof(float)));
        CUDA_OK(kernels::launch_quantize_q8(x32.get(), columns, static_cast<int>(p.cols),
                                            {qs.get(), ds.get()}, config, nullptr));
        kernels::MatvecInput in8;
        in8.n_in = static_cast<int>(p.cols);
        in8.batch = columns;
        in8.x = x32.get();
        in8.xq = {qs.get(), ds.get()};
        int8_us = time_launches([&] {
          return kernels::launch_matvec_mma(wt, p.tasks.data(), static_cast<int>(p.tasks.size()),
                                            in8, config, nullptr);
        });
        ASSERT_GT(int8_us, 0) << p.name << " int8 mma launch failed";
        // The same products: they differ by the int8 activations' rounding (~0.6 % of each
        // output's spread), not by more.
        const std::vector<float> int8_y = y.download();
        double difference = 0, norm = 0;
        for (size_t i = 0; i < f16_y.size(); ++i) {
          difference += (static_cast<double>(f16_y[i]) - int8_y[i]) * (f16_y[i] - int8_y[i]);
          norm += static_cast<double>(f16_y[i]) * f16_y[i];
        }
        EXPECT_LT(std::sqrt(difference / norm), 3e-2) << p.name << " " << columns << " columns";
      }
      std::printf(
          "[f16mma-timing] %-4s %-7s %2d columns: f16 mma %8.2f us (%.2f TB/s of weights), int8 "
          "mma %8.2f us\n",
          type_name.c_str(), p.name, columns, f16_us, p.bytes / (f16_us * 1e-6) / 1e12, int8_us);
      ::testing::Test::RecordProperty(
          type_name + "_" + p.name + "_" + std::to_string(columns) + "_f16_us",
          std::to_string(f16_us));
      ::testing::Test::RecordProperty(
          type_name + "_" + p.name + "_" + std::to_string(columns) + "_int8_us",
          std::to_string(int8_us));
    }
  }
  CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace

// The four products of an 8B decode step of each type (random weights with sane scales), f16
// mma beside the int8 mma kernel.
TEST(MatvecF16MmaTiming, ShapesOf8B) {
  REQUIRE_F16MMA();
  for (const TensorType type : kAllTypes)
    if (type != TensorType::Q4_1) time_shapes_of_8b(type);
}  // namespace
}  // namespace granule
