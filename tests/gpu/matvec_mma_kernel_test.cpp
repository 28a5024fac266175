// The int8 tensor-core products (kernels/matvec_mma.cu, both kernels: the warp-pipelined one
// an H100/H200 runs and the block-staged one of devices with less shared memory per block)
// against the split dp4a kernel (launch_matvec) on every element and against a host
// double-precision reference from the same int8 activations on a sample of rows: Q4_0, Q4_1,
// Q8_0, and Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS and MXFP4 (which the block-staged kernel
// hands to the dp4a kernel itself), the model
// shapes of SmolLM2 and an 8B model, odd row counts and short rows, batches from 1 to 512 (odd
// ones, one to eight 64-column tiles), the three-matrix launch with accumulate, the fused SwiGLU
// epilogue, and what it refuses.
// Both kernels compute the same exact sum of per-sub-block integer dot products scaled in
// f32; they differ only in summation order, so the bound is kSummationRelError of the
// row's magnitude (sum over elements of |weight term| * |activation|, with the min terms of
// Q4_0, Q4_1, Q4_K, Q5_K and Q2_K counted on their own since the kernels add them separately).
#include <cmath>
#include <cstring>
#include <random>
#include <type_traits>

#include "granule/block_formats.h"
#include "matvec_mma.cuh"
#include "mma_test_matrix.h"
#include "quantize_activations.cuh"

namespace granule {
namespace {

using gpu_test::DeviceArray;
using mma_test::make_matrix;
using mma_test::Matrix;
using mma_test::Output;
using mma_test::Shape;
using mma_test::shape_name;
using mma_test::task_for;

// A kernel of launch_matvec_mma: the device's (the warp-pipelined one on an H100/H200) or the
// block-staged one. Each test runs every case with each.
struct Variant {
  kernels::MmaKernel kernel;
  std::string name() const {
    return kernel == kernels::MmaKernel::kDevice ? "device kernel" : "block-staged kernel";
  }
};
constexpr Variant kVariants[] = {{kernels::MmaKernel::kBlockStaged}, {kernels::MmaKernel::kDevice}};

// Fails the test where the device would run the block-staged kernel for kDevice although it is
// an H100/H200 (compute capability 9.0: ~227 KB of shared memory per block, what the
// warp-pipelined kernel needs).
void expect_device_kernel() {
  int device = 0, major = 0;
  CUDA_OK(cudaGetDevice(&device));
  CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major == 9) EXPECT_EQ(kernels::matvec_mma_device_kernel(), 2);
}

// f32 rounding of a sum of at most ~500 sub-block terms, each a few roundings: worst case
// (n + 3) * 2^-24 of the magnitude, 3e-5 for 448 sub-blocks; 1e-4 leaves room and is still
// far below what a wrong nibble, scale or column shows (~1e-2 of the magnitude).
constexpr double kSummationRelError = 1e-4;
constexpr int kMaxBatch = 512;
// Every type the tensor-core products take.
constexpr TensorType kMmaTypes[] = {TensorType::Q4_0,   TensorType::Q4_1, TensorType::Q8_0,
                                    TensorType::Q4_K,   TensorType::Q5_K, TensorType::Q6_K,
                                    TensorType::Q2_K,   TensorType::Q3_K, TensorType::IQ4_NL,
                                    TensorType::IQ4_XS, TensorType::MXFP4};

// Q4_K/Q5_K's 6-bit scale and min of sub-block j (0..7) from the block's 12 packed bytes (as
// GGUF packs them; written out here apart from the repacker the kernels' rows come from).
void k_scale_min(const uint8_t* q, int j, int& scale, int& min) {
  if (j < 4) {
    scale = q[j] & 63;
    min = q[j + 4] & 63;
  } else {
    scale = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// One Q4_K/Q5_K block: element l of sub-block s is nibble s % 2 of qs[32 (s / 2) + l] (Q5_K:
// with bit s of qh[l] as its fifth bit); value d sc q - dmin m, the min term on its own.
template <class Block>
void decode_k_block(const Block& b, double* value, double* term) {
  const double d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
  for (int s = 0; s < 8; ++s) {
    int sc = 0, mn = 0;
    k_scale_min(b.scales, s, sc, mn);
    for (int l = 0; l < 32; ++l) {
      int q = (b.qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0xF;
      if constexpr (std::is_same_v<Block, BlockQ5_K>) q |= ((b.qh[l] >> s) & 1) << 4;
      value[32 * s + l] = d * sc * q - dmin * mn;
      term[32 * s + l] = std::fabs(d) * sc * q + std::fabs(dmin) * mn;
    }
  }
}

// Row r's elements as exact doubles, and per element the magnitude the kernels' f32 sum
// rounds against: |d q| + |min term| (Q4_0: q unsigned with a -8 d min term).
void decode_row(const Matrix& m, int64_t r, std::vector<double>& value, std::vector<double>& term) {
  const uint8_t* row = m.gguf.data() + r * m.gguf_row_bytes;
  value.resize(static_cast<size_t>(m.cols));
  term.resize(static_cast<size_t>(m.cols));
  if (m.type == TensorType::Q2_K) {  // d * sc * q - dmin * m: the min term on its own
    for (int64_t k = 0; k < m.cols / 256; ++k) {
      const auto* b = reinterpret_cast<const BlockQ2_K*>(row) + k;
      const double d = fp16_to_f32(b->d), dmin = fp16_to_f32(b->dmin);
      for (int e = 0; e < 256; ++e) {  // quant.cpp's order: halves of 128, passes of 32
        const int half = e / 128, pass = (e % 128) / 32, l = e % 32;
        const uint8_t sc = b->scales[8 * half + 2 * pass + l / 16];
        const int q = (b->qs[32 * half + l] >> (2 * pass)) & 3;
        const size_t at = static_cast<size_t>(k * 256 + e);
        value[at] = d * (sc & 0xF) * q - dmin * (sc >> 4);
        term[at] = std::fabs(d) * (sc & 0xF) * q + std::fabs(dmin) * (sc >> 4);
      }
    }
    return;
  }
  if (m.type == TensorType::Q4_K || m.type == TensorType::Q5_K) {
    for (int64_t k = 0; k < m.cols / 256; ++k) {
      double* v = value.data() + k * 256;
      double* t = term.data() + k * 256;
      if (m.type == TensorType::Q4_K)
        decode_k_block(reinterpret_cast<const BlockQ4_K*>(row)[k], v, t);
      else
        decode_k_block(reinterpret_cast<const BlockQ5_K*>(row)[k], v, t);
    }
    return;
  }
  // d * scale * (q - 32), d * scale * q, d * level: no min term.
  if (m.type == TensorType::Q6_K || m.type == TensorType::Q3_K || m.type == TensorType::IQ4_NL ||
      m.type == TensorType::IQ4_XS || m.type == TensorType::MXFP4) {
    std::vector<float> f32(static_cast<size_t>(m.cols));
    dequantize_row(m.type, row, f32.data(), m.cols);
    for (size_t i = 0; i < f32.size(); ++i) {
      value[i] = f32[i];
      term[i] = std::fabs(value[i]);
    }
    return;
  }
  for (int64_t j = 0; j < m.cols / 32; ++j) {
    for (int i = 0; i < 32; ++i) {
      const size_t at = static_cast<size_t>(j * 32 + i);
      if (m.type == TensorType::Q8_0) {
        const auto* b = reinterpret_cast<const BlockQ8_0*>(row) + j;
        value[at] = static_cast<double>(fp16_to_f32(b->d)) * b->qs[i];
        term[at] = std::fabs(value[at]);
      } else if (m.type == TensorType::Q4_0) {
        const auto* b = reinterpret_cast<const BlockQ4_0*>(row) + j;
        const int q = i < 16 ? b->qs[i] & 0x0F : b->qs[i - 16] >> 4;
        const double d = fp16_to_f32(b->d);
        value[at] = d * (q - 8);
        term[at] = std::fabs(d) * (q + 8);
      } else {
        const auto* b = reinterpret_cast<const BlockQ4_1*>(row) + j;
        const int q = i < 16 ? b->qs[i] & 0x0F : b->qs[i - 16] >> 4;
        const double d = fp16_to_f32(b->d), mn = fp16_to_f32(b->m);
        value[at] = d * q + mn;
        term[at] = std::fabs(d) * q + std::fabs(mn);
      }
    }
  }
}

// kMaxBatch rows of activations quantised on the device (launch_quantize_q8, the format
// every product reads) and their int8 blocks on the host.
struct Activations {
  int64_t cols;
  DeviceArray<float> x;
  DeviceArray<int8_t> qs;
  DeviceArray<float2> ds;
  std::vector<int8_t> host_qs;
  std::vector<float2> host_ds;
  Activations(int64_t n_in, uint32_t seed, const kernels::KernelConfig& config)
      : cols(n_in),
        x(static_cast<size_t>(kMaxBatch * n_in)),
        qs(static_cast<size_t>(kMaxBatch * n_in)),
        ds(static_cast<size_t>(kMaxBatch * n_in / 32)) {
    std::mt19937 rng(seed);
    std::vector<float> host = gpu_test::random_floats(static_cast<size_t>(kMaxBatch * n_in), rng);
    for (size_t i = 0; i < 64; ++i) host[i] = 0.0f;  // row 0's first two blocks: d = 0
    x.upload(host);
    if (kernels::launch_quantize_q8(x.get(), kMaxBatch, static_cast<int>(n_in),
                                    {qs.get(), ds.get()}, config, nullptr) != cudaSuccess)
      throw std::runtime_error("launch_quantize_q8 failed");
    host_qs = qs.download();
    host_ds = ds.download();
  }
  kernels::MatvecInput input(int batch) const {
    kernels::MatvecInput in;
    in.n_in = static_cast<int>(cols);
    in.batch = batch;
    in.x = x.get();
    in.xq = {qs.get(), ds.get()};
    return in;
  }
  // Per column c and sub-block j: sum over the block of |d * q|.
  std::vector<double> block_magnitudes(int batch) const {
    const int64_t n = cols / 32;
    std::vector<double> out(static_cast<size_t>(batch * n));
    for (int c = 0; c < batch; ++c)
      for (int64_t j = 0; j < n; ++j) {
        int sum = 0;
        for (int i = 0; i < 32; ++i)
          sum += std::abs(host_qs[static_cast<size_t>(c * cols + j * 32 + i)]);
        out[static_cast<size_t>(c * n + j)] =
            std::fabs(host_ds[static_cast<size_t>(c * n + j)].x) * sum;
      }
    return out;
  }
};

// Per row and sub-block, the largest element term: with block_magnitudes, an upper bound of
// every (row, column) magnitude at rows x sub-blocks x columns cost.
std::vector<double> row_block_terms(const Matrix& m) {
  const int64_t n = m.cols / 32;
  std::vector<double> out(static_cast<size_t>(m.rows * n));
  std::vector<double> value, term;
  for (int64_t r = 0; r < m.rows; ++r) {
    decode_row(m, r, value, term);
    for (int64_t j = 0; j < n; ++j) {
      double most = 0;
      for (int i = 0; i < 32; ++i) most = std::max(most, term[static_cast<size_t>(j * 32 + i)]);
      out[static_cast<size_t>(r * n + j)] = most;
    }
  }
  return out;
}

double magnitude_bound(const std::vector<double>& terms, const std::vector<double>& blocks,
                       int64_t n, int64_t r, int c) {
  double sum = 0;
  for (int64_t j = 0; j < n; ++j)
    sum += terms[static_cast<size_t>(r * n + j)] * blocks[static_cast<size_t>(c * n + j)];
  return sum;
}

void expect_guard_column_untouched(const std::vector<float>& y, int64_t rows, int batch,
                                   const char* kernel) {
  const int written = mma_test::written_past(y, rows, batch);
  EXPECT_EQ(written, 0) << kernel << " wrote " << written << " elements past the batch";
}

class MatvecMma : public ::testing::TestWithParam<Shape> {};

// Every batch size on one matrix: all elements against the dp4a kernel, sampled rows
// (tile edges, a stride, the last rows) against the host reference.
TEST_P(MatvecMma, MatchesDp4aKernelAndHostReference) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  if (!kernels::matvec_mma_fits_device()) GTEST_SKIP() << "no int8 mma on this device or build";
  expect_device_kernel();
  const Shape s = GetParam();
  const uint32_t type = static_cast<uint32_t>(s.type);
  const Matrix w = make_matrix(s.type, s.rows, s.cols, static_cast<uint32_t>(s.rows * 3 + s.cols));
  const Activations act(s.cols, static_cast<uint32_t>(s.cols + 17), config);
  const std::vector<double> terms = row_block_terms(w);
  const int64_t n = s.cols / 32;

  std::vector<int64_t> sampled;
  for (int64_t r = 0; r < std::min<int64_t>(s.rows, 70); ++r) sampled.push_back(r);
  for (int64_t r = 70; r < s.rows; r += std::max<int64_t>(1, s.rows / 41)) sampled.push_back(r);
  for (int64_t r = std::max<int64_t>(70, s.rows - 17); r < s.rows; ++r) sampled.push_back(r);
  std::vector<std::vector<double>> values(sampled.size()), value_terms(sampled.size());
  for (size_t k = 0; k < sampled.size(); ++k) decode_row(w, sampled[k], values[k], value_terms[k]);

  for (const int batch : {1, 4, 7, 8, 13, 16, 32, 33, 64, 100, 512}) {
    const kernels::MatvecInput in = act.input(batch);
    Output dp4a(s.rows, batch);
    const kernels::MatvecTask dp4a_task = task_for(w, dp4a.y.get());
    CUDA_OK(kernels::launch_matvec(type, &dp4a_task, 1, in, config, nullptr));
    const std::vector<float> want = dp4a.y.download();
    const std::vector<double> blocks = act.block_magnitudes(batch);
    std::vector<double> bounds(static_cast<size_t>(batch * s.rows));  // against dp4a
    for (int c = 0; c < batch; ++c)
      for (int64_t r = 0; r < s.rows; ++r)
        bounds[static_cast<size_t>(c * s.rows + r)] =
            2 * kSummationRelError * magnitude_bound(terms, blocks, n, r, c) + 1e-30;
    std::vector<double> reference(sampled.size() * static_cast<size_t>(batch)),
        reference_bound(reference.size());
    for (int c = 0; c < batch; ++c) {
      const int8_t* qa = act.host_qs.data() + static_cast<size_t>(c) * s.cols;
      const float2* da = act.host_ds.data() + static_cast<size_t>(c) * n;
      for (size_t k = 0; k < sampled.size(); ++k) {
        double sum = 0, magnitude = 0;
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0, mag = 0;
          for (int i = 0; i < 32; ++i) {
            const size_t e = static_cast<size_t>(j * 32 + i);
            dot += values[k][e] * qa[e];
            mag += value_terms[k][e] * std::abs(qa[e]);
          }
          sum += static_cast<double>(da[j].x) * dot;
          magnitude += std::fabs(static_cast<double>(da[j].x)) * mag;
        }
        reference[static_cast<size_t>(c) * sampled.size() + k] = sum;
        reference_bound[static_cast<size_t>(c) * sampled.size() + k] =
            kSummationRelError * magnitude + 1e-30;
      }
    }

    for (const Variant variant : kVariants) {
      SCOPED_TRACE(std::string(tensor_type_info(s.type).name) + " " + std::to_string(s.rows) + "x" +
                   std::to_string(s.cols) + " batch " + std::to_string(batch) + " " +
                   variant.name());
      Output mma(s.rows, batch);
      const kernels::MatvecTask mma_task = task_for(w, mma.y.get());
      CUDA_OK(kernels::launch_matvec_mma(type, &mma_task, 1, in, config, nullptr, variant.kernel));
      const std::vector<float> got = mma.y.download();
      expect_guard_column_untouched(got, s.rows, batch, "mma");

      int bad = 0;
      double worst = 0;  // largest |mma - dp4a| as a fraction of its bound
      for (int c = 0; c < batch; ++c)
        for (int64_t r = 0; r < s.rows; ++r) {
          const size_t at = static_cast<size_t>(c * s.rows + r);
          const double error = std::fabs(static_cast<double>(got[at]) - want[at]);
          worst = std::max(worst, error / bounds[at]);
          if (!(error <= bounds[at]) && ++bad <= 5)
            ADD_FAILURE() << "row " << r << " column " << c << ": mma " << got[at] << " dp4a "
                          << want[at] << " bound " << bounds[at];
        }
      EXPECT_EQ(bad, 0);

      int bad_reference = 0;
      for (int c = 0; c < batch; ++c)
        for (size_t k = 0; k < sampled.size(); ++k) {
          const size_t at = static_cast<size_t>(c) * sampled.size() + k;
          const double v = got[static_cast<size_t>(c * s.rows + sampled[k])];
          if (!(std::fabs(v - reference[at]) <= reference_bound[at]) && ++bad_reference <= 5)
            ADD_FAILURE() << "row " << sampled[k] << " column " << c << ": mma " << v
                          << " reference " << reference[at] << " bound " << reference_bound[at];
        }
      EXPECT_EQ(bad_reference, 0);
      RecordProperty(std::string("worst_fraction_of_bound_") +
                         (variant.kernel == kernels::MmaKernel::kDevice ? "device" : "staged") +
                         "_b" + std::to_string(batch),
                     std::to_string(worst));
    }
  }
}

// rows x columns: SmolLM2-135M's attention and feed-forward matrices, an 8B model's.
constexpr std::pair<int64_t, int64_t> kModelShapes[] = {{576, 576},   {1536, 576},   {576, 1536},
                                                        {4096, 4096}, {14336, 4096}, {4096, 14336}};

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (TensorType t : {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q8_0})
    for (const auto& [rows, cols] : kModelShapes) out.push_back({t, rows, cols});
  // Odd shapes: a partial row tile, a partial pipeline stage (19 sub-blocks), one sub-block;
  // short rows of 2, 3 and 5 sub-blocks (fewer stages than warps); 37 sub-blocks (several
  // stages per warp, the last one partial) on rows that end inside a 16-row tile.
  out.push_back({TensorType::Q4_0, 77, 608});
  out.push_back({TensorType::Q4_1, 33, 32});
  out.push_back({TensorType::Q8_0, 129, 608});
  out.push_back({TensorType::Q8_0, 50, 64});
  out.push_back({TensorType::Q4_0, 300, 96});
  out.push_back({TensorType::Q4_1, 16, 160});
  out.push_back({TensorType::Q4_0, 200, 1184});
  out.push_back({TensorType::Q8_0, 1000, 1184});
  // Q6_K (the block-staged kernel hands it to the dp4a kernel): an 8B model's attention shape,
  // one super-block per row, 5 and 56 super-blocks on row counts off the tiles.
  out.push_back({TensorType::Q6_K, 4096, 4096});
  out.push_back({TensorType::Q6_K, 333, 256});
  out.push_back({TensorType::Q6_K, 1000, 1280});
  out.push_back({TensorType::Q6_K, 150, 14336});
  // The issue-41 types: an 8B model's shapes and short, odd ones.
  for (TensorType t : {TensorType::Q2_K, TensorType::Q3_K, TensorType::IQ4_NL, TensorType::IQ4_XS,
                       TensorType::MXFP4}) {
    out.push_back({t, 4096, 4096});
    out.push_back({t, 1000, 1280});
    out.push_back({t, 150, 14336});
  }
  out.push_back({TensorType::IQ4_NL, 77, 608});  // 19 sub-blocks: a partial stage
  out.push_back({TensorType::MXFP4, 129, 608});
  out.push_back({TensorType::MXFP4, 33, 96});  // 3 sub-blocks: scale bytes past n
  out.push_back({TensorType::IQ4_XS, 333, 256});
  out.push_back({TensorType::Q2_K, 333, 256});
  out.push_back({TensorType::Q3_K, 77, 2816});
  out.push_back({TensorType::MXFP4, 300, 2880});  // gpt-oss's width: 90 sub-blocks
  // Q4_K and Q5_K (a Q4_K_M file's layers; the block-staged kernel hands them to the dp4a
  // kernel): an 8B model's three shapes, one super-block per row, 5 and 11 super-blocks on row
  // counts off the tiles, and the 56 super-blocks of its down projection on few rows.
  for (TensorType t : {TensorType::Q4_K, TensorType::Q5_K}) {
    out.push_back({t, 4096, 4096});
    out.push_back({t, 14336, 4096});
    out.push_back({t, 4096, 14336});
    out.push_back({t, 333, 256});
    out.push_back({t, 1000, 1280});
    out.push_back({t, 77, 2816});
    out.push_back({t, 150, 14336});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(ModelShapes, MatvecMma, ::testing::ValuesIn(shapes()), shape_name);

// Q, K and V in one launch (three row counts), K accumulating into what y held.
TEST(MatvecMmaTasks, ThreeMatricesInOneLaunchAndAccumulate) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  if (!kernels::matvec_mma_fits_device()) GTEST_SKIP() << "no int8 mma on this device or build";
  std::mt19937 rng(5);
  for (TensorType type : kMmaTypes) {
    const int64_t cols = tensor_type_info(type).block_elems == 256 ? 768 : 608,
                  rows[3] = {200, 72, 40};
    const Activations act(cols, 23, config);
    std::vector<Matrix> w;
    for (int i = 0; i < 3; ++i) w.push_back(make_matrix(type, rows[i], cols, 100 + i));
    for (const auto& [batch, variant] :
         {std::pair{5, kVariants[0]}, std::pair{64, kVariants[0]}, std::pair{77, kVariants[0]},
          std::pair{5, kVariants[1]}, std::pair{13, kVariants[1]}, std::pair{33, kVariants[1]},
          std::pair{64, kVariants[1]}, std::pair{77, kVariants[1]}}) {
      SCOPED_TRACE(std::string(tensor_type_info(type).name) + " batch " + std::to_string(batch) +
                   " " + variant.name());
      const std::vector<double> blocks = act.block_magnitudes(batch);
      std::vector<DeviceArray<float>> y_mma, y_dp4a;
      std::vector<std::vector<float>> start;
      kernels::MatvecTask mma_tasks[3], dp4a_tasks[3];
      for (int i = 0; i < 3; ++i) {
        start.push_back(gpu_test::random_floats(static_cast<size_t>(rows[i] * batch), rng));
        y_mma.emplace_back(start.back());
        y_dp4a.emplace_back(start.back());
        mma_tasks[i] = task_for(w[i], y_mma.back().get());
        dp4a_tasks[i] = task_for(w[i], y_dp4a.back().get());
        mma_tasks[i].accumulate = dp4a_tasks[i].accumulate = i == 1;
      }
      const uint32_t t = static_cast<uint32_t>(type);
      CUDA_OK(kernels::launch_matvec_mma(t, mma_tasks, 3, act.input(batch), config, nullptr,
                                         variant.kernel));
      CUDA_OK(kernels::launch_matvec(t, dp4a_tasks, 3, act.input(batch), config, nullptr));
      for (int i = 0; i < 3; ++i) {
        const std::vector<double> terms = row_block_terms(w[i]);
        const std::vector<float> got = y_mma[i].download(), want = y_dp4a[i].download();
        for (int c = 0; c < batch; ++c)
          for (int64_t r = 0; r < rows[i]; ++r) {
            const size_t at = static_cast<size_t>(c * rows[i] + r);
            const double bound =
                2 * kSummationRelError * magnitude_bound(terms, blocks, cols / 32, r, c) +
                1e-6 * std::fabs(start[static_cast<size_t>(i)][at]) + 1e-30;
            ASSERT_LE(std::fabs(static_cast<double>(got[at]) - want[at]), bound)
                << "matrix " << i << " row " << r << " column " << c;
          }
      }
    }
  }
}

// Gate and up in one pass: silu(gate x) * (up x), against the dp4a kernel's two products.
TEST(MatvecMmaTasks, FusedSwigluMatchesSeparateProducts) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  if (!kernels::matvec_mma_fits_device()) GTEST_SKIP() << "no int8 mma on this device or build";
  for (TensorType type : kMmaTypes) {
    const int64_t rows = 300, cols = 1024;
    const Matrix gate = make_matrix(type, rows, cols, 7), up = make_matrix(type, rows, cols, 8);
    const std::vector<double> gate_terms = row_block_terms(gate), up_terms = row_block_terms(up);
    const Activations act(cols, 29, config);
    const uint32_t t = static_cast<uint32_t>(type);
    for (const auto& [batch, variant] :
         {std::pair{4, kVariants[0]}, std::pair{33, kVariants[0]}, std::pair{100, kVariants[0]},
          std::pair{4, kVariants[1]}, std::pair{8, kVariants[1]}, std::pair{13, kVariants[1]},
          std::pair{16, kVariants[1]}, std::pair{32, kVariants[1]}, std::pair{33, kVariants[1]},
          std::pair{64, kVariants[1]}, std::pair{100, kVariants[1]}}) {
      SCOPED_TRACE(std::string(tensor_type_info(type).name) + " batch " + std::to_string(batch) +
                   " " + variant.name());
      const std::vector<double> blocks = act.block_magnitudes(batch);
      Output fused(rows, batch), g(rows, batch), u(rows, batch);
      kernels::MatvecTask task = task_for(gate, fused.y.get());
      task.weight_up = up.device.get();
      const kernels::MatvecTask gt = task_for(gate, g.y.get()), ut = task_for(up, u.y.get());
      CUDA_OK(kernels::launch_matvec_mma(t, &task, 1, act.input(batch), config, nullptr,
                                         variant.kernel));
      CUDA_OK(kernels::launch_matvec(t, &gt, 1, act.input(batch), config, nullptr));
      CUDA_OK(kernels::launch_matvec(t, &ut, 1, act.input(batch), config, nullptr));
      const std::vector<float> got = fused.y.download(), gv = g.y.download(), uv = u.y.download();
      expect_guard_column_untouched(got, rows, batch, "fused mma");
      for (int c = 0; c < batch; ++c)
        for (int64_t r = 0; r < rows; ++r) {
          const size_t at = static_cast<size_t>(c * rows + r);
          const double bg =
              2 * kSummationRelError * magnitude_bound(gate_terms, blocks, cols / 32, r, c);
          const double bu =
              2 * kSummationRelError * magnitude_bound(up_terms, blocks, cols / 32, r, c);
          const double gd = gv[at], ud = uv[at];
          const double expected = gd / (1.0 + std::exp(-gd)) * ud;
          // silu' lies within [-0.1, 1.1]; 1e-5 relative for the f32 silu itself.
          const double bound = 1.1 * bg * (std::fabs(ud) + bu) + 1.1 * (std::fabs(gd) + bg) * bu +
                               1e-5 * std::fabs(expected) + 1e-30;
          ASSERT_LE(std::fabs(got[at] - expected), bound) << "row " << r << " column " << c;
        }
    }
  }
}

// The fixed-order reduction: a second launch of the same product gives the same bits, plain and
// SwiGLU, at the decode batches the tensor cores take (8-64 columns: one, two, four and eight
// n-tiles), on the device's kernel.
TEST(MatvecMmaTasks, SecondLaunchGivesTheSameBits) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  if (!kernels::matvec_mma_fits_device()) GTEST_SKIP() << "no int8 mma on this device or build";
  const int64_t rows = 1000, cols = 4096;
  const Activations act(cols, 31, config);
  for (TensorType type : kMmaTypes) {
    const Matrix gate = make_matrix(type, rows, cols, 9), up = make_matrix(type, rows, cols, 10);
    const uint32_t t = static_cast<uint32_t>(type);
    for (const int batch : {8, 16, 32, 64})
      for (const bool swiglu : {false, true}) {
        SCOPED_TRACE(std::string(tensor_type_info(type).name) + " batch " + std::to_string(batch) +
                     (swiglu ? " SwiGLU" : ""));
        std::vector<float> first;
        for (int launch = 0; launch < 2; ++launch) {
          Output y(rows, batch);
          kernels::MatvecTask task = task_for(gate, y.y.get());
          if (swiglu) task.weight_up = up.device.get();
          CUDA_OK(kernels::launch_matvec_mma(t, &task, 1, act.input(batch), config, nullptr));
          const std::vector<float> got = y.y.download();
          if (launch == 0) {
            first = got;
            continue;
          }
          EXPECT_EQ(std::memcmp(first.data(), got.data(), got.size() * sizeof(float)), 0);
        }
      }
  }
}

TEST(MatvecMmaTasks, RefusesWhatItCannotRun) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  EXPECT_TRUE(kernels::matvec_mma_supports(static_cast<uint32_t>(TensorType::Q4_0), true));
  EXPECT_FALSE(kernels::matvec_mma_supports(static_cast<uint32_t>(TensorType::Q4_0), false));
  EXPECT_TRUE(kernels::matvec_mma_supports(static_cast<uint32_t>(TensorType::Q6_K), true));
  EXPECT_FALSE(kernels::matvec_mma_supports(static_cast<uint32_t>(TensorType::Q6_K), false));
  EXPECT_FALSE(kernels::matvec_mma_supports(static_cast<uint32_t>(TensorType::Q5_0), true));
  for (TensorType t : {TensorType::Q4_K, TensorType::Q5_K, TensorType::Q2_K, TensorType::Q3_K,
                       TensorType::IQ4_NL, TensorType::IQ4_XS, TensorType::MXFP4}) {
    EXPECT_TRUE(kernels::matvec_mma_supports(static_cast<uint32_t>(t), true));
    EXPECT_FALSE(kernels::matvec_mma_supports(static_cast<uint32_t>(t), false));
  }
  EXPECT_FALSE(kernels::matvec_mma_supports(static_cast<uint32_t>(TensorType::Q5_1), true));
  if (!kernels::matvec_mma_fits_device()) GTEST_SKIP() << "no int8 mma on this device or build";
  expect_device_kernel();
  const Matrix w = make_matrix(TensorType::Q4_0, 16, 64, 3);
  const Activations act(64, 4, config);
  for (const Variant variant : kVariants) {
    SCOPED_TRACE(variant.name());
    Output y(16, 8);
    kernels::MatvecTask t = task_for(w, y.y.get());
    const uint32_t q4_0 = static_cast<uint32_t>(TensorType::Q4_0);
    t.split_layout = false;  // GGUF blocks
    EXPECT_EQ(
        kernels::launch_matvec_mma(q4_0, &t, 1, act.input(8), config, nullptr, variant.kernel),
        cudaErrorInvalidValue);
    t.split_layout = true;
    EXPECT_EQ(kernels::launch_matvec_mma(static_cast<uint32_t>(TensorType::Q5_0), &t, 1,
                                         act.input(8), config, nullptr, variant.kernel),
              cudaErrorInvalidValue);
    for (TensorType k : {TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K})
      EXPECT_EQ(kernels::launch_matvec_mma(static_cast<uint32_t>(k), &t, 1, act.input(8), config,
                                           nullptr, variant.kernel),
                cudaErrorInvalidValue);  // 64 columns: not whole super-blocks
    kernels::MatvecInput odd = act.input(8);
    odd.n_in = 48;  // not whole sub-blocks
    EXPECT_EQ(kernels::launch_matvec_mma(q4_0, &t, 1, odd, config, nullptr, variant.kernel),
              cudaErrorInvalidValue);
    EXPECT_EQ(
        kernels::launch_matvec_mma(q4_0, &t, 1, act.input(0), config, nullptr, variant.kernel),
        cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // a refusal leaves no error behind
  }
}

}  // namespace
}  // namespace granule
