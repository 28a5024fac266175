// The split-K f16 tensor-core product over split Q4_0 and Q8_0 (kernels/matvec_f16mma_splitk.cu)
// against a host reference that rounds where the kernel is defined to round (each weight to f16
// once, f16((q - 8) d) or f16(q d); the f16 activations exact; the sum in double), within the bound
// the one-warp f16 kernel's test holds it to (2e-5 of the row's magnitude, sum over elements of
// |w16 x|), and against that kernel (launch_matvec_f16mma) on the same inputs. Shapes of
// SmolLM2 and an 8B model, odd row counts and sub-block counts (a partial last stage, the scale
// copy reaching into the row padding), batches 1-64 (17-64 are the ones the backend sends),
// splits chosen by the launcher and forced to 1, 2 and 3, a workspace too small for any split;
// the same bits on every launch and in a replayed graph of the four 8B products (the ticket
// counters reset themselves), the three-matrix launch with accumulate, SwiGLU with f32 and f16
// results, and what the launcher refuses. A timing probe prints the 8B products beside the
// one-warp kernel.
#include <cuda_fp16.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include "granule/block_formats.h"
#include "granule/quant.h"
#include "granule/split_layout.h"
#include "matvec_f16mma.cuh"
#include "matvec_f16mma_splitk.cuh"
#include "mma_test_matrix.h"
#include "quantize_activations.cuh"

namespace granule {
namespace {

using gpu_test::DeviceArray;
using mma_test::Matrix;
using mma_test::Output;
using mma_test::task_for;

constexpr double kRelError = 2e-5;  // matvec_f16mma_kernel_test.cpp's bound
constexpr int kMaxBatch = 64;
const auto kQ4_0 = static_cast<uint32_t>(TensorType::Q4_0);

double round_to_f16(double v) {
  if (v == 0) return v;
  int e = 0;
  std::frexp(v, &e);
  const double quantum = std::ldexp(1.0, std::max(e - 11, -24));
  return std::nearbyint(v / quantum) * quantum;
}

// Half an f16 ulp of v (the rounding of an f16 result).
double half_f16_ulp(double v) {
  if (v == 0) return std::ldexp(1.0, -25);
  int e = 0;
  std::frexp(v, &e);
  return std::ldexp(1.0, std::max(e - 12, -25));
}

// The 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block (GGUF's packing).
std::pair<int, int> k_scale_min(const uint8_t* q, int j) {
  if (j < 4) return {q[j] & 63, q[j + 4] & 63};
  return {(q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)};
}

// Row r's weights as the kernel multiplies them: f16((q - 8) d) (Q4_0), f16(q d) (Q8_0),
// f16(q f16(d sc) - f16(dmin m)) (Q4_K, Q5_K: their scales' products rounded first), read from
// the GGUF blocks and checked against the engine's dequantisation before rounding.
std::vector<double> row_weights(const Matrix& m, int64_t r) {
  std::vector<double> w(static_cast<size_t>(m.cols));
  std::vector<float> values(static_cast<size_t>(m.cols));
  const uint8_t* row = m.gguf.data() + r * m.gguf_row_bytes;
  dequantize_row(m.type, row, values.data(), m.cols);
  for (int64_t i = 0; i < m.cols; ++i) {
    double exact = 0, kernel = 0;
    if (m.type == TensorType::Q6_K) {
      // Per 128 elements: quarter k of 32 takes the low (k < 2) or high nibbles of ql bytes
      // 32 (k % 2) + l, bits 2k of qh byte l, scale 2k + l / 16.
      const auto* b = reinterpret_cast<const BlockQ6_K*>(row) + i / 256;
      const int e = static_cast<int>(i % 256), half = e / 128, k = e % 128 / 32, l = e % 32;
      const uint8_t ql = b->ql[half * 64 + (k % 2) * 32 + l];
      const int q = (k < 2 ? ql & 0x0F : ql >> 4) | ((b->qh[half * 32 + l] >> (2 * k)) & 3) << 4;
      const double d =
          static_cast<double>(fp16_to_f32(b->d)) * b->scales[half * 8 + l / 16 + 2 * k];
      exact = (q - 32) * d;
      kernel = round_to_f16((q - 32) * round_to_f16(d));
    } else if (m.type == TensorType::Q4_K || m.type == TensorType::Q5_K) {
      // Sub-block j takes the low (j even) or high nibbles of qs bytes 32 (j / 2) + l; Q5_K's
      // fifth bit is bit j of qh byte l.
      const bool q5 = m.type == TensorType::Q5_K;
      const uint8_t* block = row + i / 256 * (q5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K));
      const auto* b4 = reinterpret_cast<const BlockQ4_K*>(block);
      const auto* b5 = reinterpret_cast<const BlockQ5_K*>(block);
      const int e = static_cast<int>(i % 256), j = e / 32, l = e % 32;
      const uint8_t byte = q5 ? b5->qs[j / 2 * 32 + l] : b4->qs[j / 2 * 32 + l];
      int q = j % 2 == 0 ? byte & 0x0F : byte >> 4;
      if (q5) q |= ((b5->qh[l] >> j) & 1) << 4;
      const auto [sc, mn] = k_scale_min(q5 ? b5->scales : b4->scales, j);
      const double d = static_cast<double>(fp16_to_f32(q5 ? b5->d : b4->d)) * sc;
      const double min = -static_cast<double>(fp16_to_f32(q5 ? b5->dmin : b4->dmin)) * mn;
      exact = q * d + min;
      kernel = round_to_f16(q * round_to_f16(d) + round_to_f16(min));
    } else if (m.type == TensorType::Q8_0) {
      const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(row)[i / 32];
      exact = b.qs[i % 32] * static_cast<double>(fp16_to_f32(b.d));
    } else {
      const BlockQ4_0& b = reinterpret_cast<const BlockQ4_0*>(row)[i / 32];
      const int k = static_cast<int>(i % 32);
      const int q = k < 16 ? b.qs[k] & 0x0F : b.qs[k - 16] >> 4;
      exact = (q - 8) * static_cast<double>(fp16_to_f32(b.d));
    }
    if (!kernels::split::is_k_type(static_cast<uint32_t>(m.type))) kernel = round_to_f16(exact);
    EXPECT_NEAR(exact, values[static_cast<size_t>(i)], 1e-6 * std::fabs(exact) + 1e-12);
    w[static_cast<size_t>(i)] = kernel;
  }
  return w;
}

// kMaxBatch rows of f16 activations (random normal; column 0's first sub-block zero).
struct Activations {
  int64_t cols;
  std::vector<double> host;
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

struct Reference {
  double value = 0, bound = 0;
};
Reference reference(const std::vector<double>& w, const double* x) {
  Reference ref;
  double magnitude = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    ref.value += w[i] * x[i];
    magnitude += std::fabs(w[i] * x[i]);
  }
  ref.bound = kRelError * magnitude + 1e-30;
  return ref;
}

// Rows to check: the first 140 (a tile and its neighbour), a stride, the last 17.
std::vector<int64_t> sampled_rows(int64_t rows) {
  std::vector<int64_t> out;
  for (int64_t r = 0; r < std::min<int64_t>(rows, 140); ++r) out.push_back(r);
  for (int64_t r = 140; r < rows; r += std::max<int64_t>(1, rows / 37)) out.push_back(r);
  for (int64_t r = std::max<int64_t>(140, rows - 17); r < rows; ++r)
    if (out.back() < r) out.push_back(r);
  return out;
}

// The workspace the backend gives the launcher, counters zeroed.
struct Workspace {
  DeviceArray<float> partials;
  DeviceArray<int> counters;
  explicit Workspace(int64_t floats = kernels::matvec_f16mma_splitk_partial_floats(),
                     int n_counters = kernels::matvec_f16mma_splitk_counters())
      : partials(static_cast<size_t>(floats)), counters(static_cast<size_t>(n_counters)) {
    cudaMemset(counters.get(), 0, counters.size() * sizeof(int));
  }
  kernels::F16MmaSplitWorkspace view() const {
    kernels::F16MmaSplitWorkspace w;
    w.partials = partials.get();
    w.partial_floats = static_cast<int64_t>(partials.size());
    w.counters = counters.get();
    w.n_counters = static_cast<int>(counters.size());
    return w;
  }
  int counters_not_zero() const {
    int not_zero = 0;
    for (const int c : counters.download()) not_zero += c != 0;
    return not_zero;
  }
};

#define REQUIRE_SPLITK()                            \
  GRANULE_REQUIRE_GPU();                            \
  if (!kernels::matvec_f16mma_splitk_fits_device()) \
  GTEST_SKIP() << "no f16 mma.sync (compute capability 8.0) on this device or build"

void expect_written_exactly(const std::vector<float>& y, int64_t rows, int batch) {
  int unwritten = 0;
  for (int64_t i = 0; i < batch * rows; ++i) unwritten += std::isnan(y[static_cast<size_t>(i)]);
  EXPECT_EQ(unwritten, 0) << "elements of the batch left unwritten (or NaN)";
  EXPECT_EQ(mma_test::written_past(y, rows, batch), 0) << "elements written past the batch";
}

struct Shape {
  TensorType type;
  int64_t rows, cols;
};
class MatvecF16MmaSplitK : public ::testing::TestWithParam<Shape> {};

// Every batch size and split choice on one matrix: sampled rows against the host reference,
// every element written, none past the batch; the same launch again gives the same bits (each
// split count adds in its own order, so across split counts only the bound holds).
TEST_P(MatvecF16MmaSplitK, MatchesHostReference) {
  REQUIRE_SPLITK();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  const Shape s = GetParam();
  const auto type = static_cast<uint32_t>(s.type);
  const Matrix w = mma_test::make_matrix(s.type, s.rows, s.cols,
                                         static_cast<uint32_t>(s.rows * 5 + s.cols), true);
  const Activations act(s.cols, static_cast<uint32_t>(s.cols + 29));
  const std::vector<int64_t> rows = sampled_rows(s.rows);
  std::vector<std::vector<double>> weights;
  for (const int64_t r : rows) weights.push_back(row_weights(w, r));
  const Workspace ws;
  for (const int batch : {1, 7, 16, 17, 24, 32, 33, 48, 64})
    for (const int max_splits : {0, 1, 2, 3}) {
      SCOPED_TRACE(std::string(tensor_type_info(s.type).name) + " " + std::to_string(s.rows) + "x" +
                   std::to_string(s.cols) + " batch " + std::to_string(batch) + " max splits " +
                   std::to_string(max_splits));
      Output out(s.rows, batch);
      const kernels::MatvecTask task = task_for(w, out.y.get());
      CUDA_OK(kernels::launch_matvec_f16mma_splitk(type, &task, 1, act.input(batch), ws.view(),
                                                   config, nullptr, max_splits));
      const std::vector<float> got = out.y.download();
      expect_written_exactly(got, s.rows, batch);
      int bad = 0;
      for (int c = 0; c < batch; ++c)
        for (size_t k = 0; k < rows.size(); ++k) {
          const Reference ref = reference(weights[k], act.column(c));
          const double v = got[static_cast<size_t>(c * s.rows + rows[k])];
          if (!(std::fabs(v - ref.value) <= ref.bound) && ++bad <= 5)
            ADD_FAILURE() << "row " << rows[k] << " column " << c << ": " << v << " reference "
                          << ref.value << " bound " << ref.bound;
        }
      EXPECT_EQ(bad, 0);
      // The same launch again: the same bits.
      Output again(s.rows, batch);
      const kernels::MatvecTask task2 = task_for(w, again.y.get());
      CUDA_OK(kernels::launch_matvec_f16mma_splitk(type, &task2, 1, act.input(batch), ws.view(),
                                                   config, nullptr, max_splits));
      EXPECT_EQ(std::memcmp(got.data(), again.y.download().data(), got.size() * sizeof(float)), 0)
          << "a second launch gave other bits";
      EXPECT_EQ(ws.counters_not_zero(), 0) << "ticket counters left set";
    }
}

// SmolLM2-135M's (576 -> 1536, 1536 -> 576, 576 -> 192) and an 8B model's (4096 -> 4096,
// 4096 -> 1024, 14336 -> 4096) products; odd rows (partial tiles), 19 and 37 sub-blocks (a
// partial last stage; the scale copy past the row's last sub-block), one and two sub-blocks
// (fewer stages than a split needs), 40,000 rows (more tiles than SM slots: no split); for Q4_0
// and Q8_0. Q4_K and Q5_K (rows of whole super-blocks; their host quantiser is slow, so at most
// 4096 x 4096): the 8B model's QKV and wo shapes, odd rows, one to nine super-blocks, 20,000
// rows.
std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (const TensorType t : {TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K})
    for (const auto& [rows, cols] :
         std::initializer_list<std::pair<int64_t, int64_t>>{{576, 1536},
                                                            {4096, 4096},
                                                            {1024, 4096},
                                                            {100, 256},
                                                            {17, 512},
                                                            {33, 768},
                                                            {1000, 2304},
                                                            {20000, 256}})
      out.push_back({t, rows, cols});
  for (const TensorType t : {TensorType::Q4_0, TensorType::Q8_0})
    for (const auto& [rows, cols] :
         std::initializer_list<std::pair<int64_t, int64_t>>{{1536, 576},
                                                            {576, 1536},
                                                            {192, 576},
                                                            {4096, 4096},
                                                            {1024, 4096},
                                                            {4096, 14336},
                                                            {100, 608},
                                                            {17, 1184},
                                                            {129, 32},
                                                            {255, 64},
                                                            {40000, 128}})
      out.push_back({t, rows, cols});
  return out;
}
INSTANTIATE_TEST_SUITE_P(Shapes, MatvecF16MmaSplitK, ::testing::ValuesIn(shapes()),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return std::string(tensor_type_info(info.param.type).name) + "_" +
                                  std::to_string(info.param.rows) + "x" +
                                  std::to_string(info.param.cols);
                         });

// The one-warp f16 kernel and this one on the same inputs: within twice the bound of each
// other (each is within the bound of the reference), at the batches the backend sends.
TEST(MatvecF16MmaSplitKAgainst, OneWarpKernel) {
  REQUIRE_SPLITK();
  if (!kernels::matvec_f16mma_fits_device()) GTEST_SKIP() << "no one-warp f16 kernel here";
  const kernels::KernelConfig config = gpu_test::kernel_config();
  const int64_t rows = 4096, cols = 4096;
  const Activations act(cols, 78);
  const Workspace ws;
  for (const TensorType type :
       {TensorType::Q4_0, TensorType::Q8_0, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K})
    for (const int batch : {17, 32, 64}) {
      const auto wt = static_cast<uint32_t>(type);
      const Matrix w = mma_test::make_matrix(type, rows, cols, 77, true);
      Output a(rows, batch), b(rows, batch);
      const kernels::MatvecTask ta = task_for(w, a.y.get()), tb = task_for(w, b.y.get());
      CUDA_OK(kernels::launch_matvec_f16mma_splitk(wt, &ta, 1, act.input(batch), ws.view(), config,
                                                   nullptr));
      CUDA_OK(kernels::launch_matvec_f16mma(wt, &tb, 1, act.input(batch), config, nullptr));
      const std::vector<float> ya = a.y.download(), yb = b.y.download();
      int bad = 0;
      for (int64_t r = 0; r < rows; r += 13) {
        const std::vector<double> wr = row_weights(w, r);
        for (int c = 0; c < batch; ++c) {
          const Reference ref = reference(wr, act.column(c));
          const size_t at = static_cast<size_t>(c * rows + r);
          if (!(std::fabs(static_cast<double>(ya[at]) - yb[at]) <= 2 * ref.bound) && ++bad <= 5)
            ADD_FAILURE() << "row " << r << " column " << c << ": split-K " << ya[at]
                          << " one-warp " << yb[at];
        }
      }
      EXPECT_EQ(bad, 0) << tensor_type_info(type).name << " batch " << batch;
    }
}

// A workspace too small for the tiles' partials or counters: no split, still right.
TEST(MatvecF16MmaSplitKWorkspace, TooSmallMeansNoSplit) {
  REQUIRE_SPLITK();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  const int64_t rows = 1024, cols = 4096;
  const Matrix w = mma_test::make_matrix(TensorType::Q4_0, rows, cols, 5, true);
  const Activations act(cols, 6);
  const int batch = 32;
  Output full(rows, batch);
  const Workspace ws;
  const kernels::MatvecTask tf = task_for(w, full.y.get());
  CUDA_OK(kernels::launch_matvec_f16mma_splitk(kQ4_0, &tf, 1, act.input(batch), ws.view(), config,
                                               nullptr, 1));
  const std::vector<float> unsplit = full.y.download();
  for (const auto& [floats, counters] :
       std::initializer_list<std::pair<int64_t, int>>{{100, 1000}, {1 << 22, 2}, {0, 0}}) {
    const Workspace small(std::max<int64_t>(floats, 1), std::max(counters, 1));
    kernels::F16MmaSplitWorkspace view = small.view();
    if (floats == 0) view = {};
    Output out(rows, batch);
    const kernels::MatvecTask t = task_for(w, out.y.get());
    CUDA_OK(kernels::launch_matvec_f16mma_splitk(kQ4_0, &t, 1, act.input(batch), view, config,
                                                 nullptr));
    const std::vector<float> got = out.y.download();
    EXPECT_EQ(std::memcmp(got.data(), unsplit.data(), got.size() * sizeof(float)), 0)
        << floats << " floats, " << counters << " counters: not the unsplit launch's bits";
  }
}

// Q, K and V in one launch (three row counts), K accumulating into what y held.
TEST(MatvecF16MmaSplitKTasks, ThreeMatricesInOneLaunchAndAccumulate) {
  REQUIRE_SPLITK();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  std::mt19937 rng(5);
  const Workspace ws;
  for (const TensorType type :
       {TensorType::Q4_0, TensorType::Q8_0, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K})
    for (const int64_t wide : {int64_t{608}, int64_t{4096}}) {
      const int64_t cols =
          wide == 608 && kernels::split::is_k_type(static_cast<uint32_t>(type)) ? 768 : wide;
      const int64_t rows[3] = {cols == 4096 ? 4096 : 200, cols == 4096 ? 1024 : 72,
                               cols == 4096 ? 1024 : 40};
      const Activations act(cols, 23);
      std::vector<Matrix> w;
      std::vector<std::vector<std::vector<double>>> weights(3);
      std::vector<std::vector<int64_t>> sampled(3);
      for (int i = 0; i < 3; ++i) {
        w.push_back(mma_test::make_matrix(type, rows[i], cols, 100 + i, true));
        sampled[static_cast<size_t>(i)] = sampled_rows(rows[i]);
        for (const int64_t r : sampled[static_cast<size_t>(i)])
          weights[static_cast<size_t>(i)].push_back(row_weights(w.back(), r));
      }
      for (const int batch : {17, 32, 33, 64}) {
        SCOPED_TRACE(std::string(tensor_type_info(type).name) + " " + std::to_string(cols) +
                     " columns, batch " + std::to_string(batch));
        std::vector<DeviceArray<float>> y;
        std::vector<std::vector<float>> start;
        kernels::MatvecTask tasks[3];
        for (int i = 0; i < 3; ++i) {
          start.push_back(gpu_test::random_floats(static_cast<size_t>(rows[i] * batch), rng));
          y.emplace_back(start.back());
          tasks[i] = task_for(w[static_cast<size_t>(i)], y.back().get());
          tasks[i].accumulate = i == 1;
        }
        CUDA_OK(kernels::launch_matvec_f16mma_splitk(static_cast<uint32_t>(type), tasks, 3,
                                                     act.input(batch), ws.view(), config, nullptr));
        for (int i = 0; i < 3; ++i) {
          const std::vector<float> got = y[static_cast<size_t>(i)].download();
          const auto& rs = sampled[static_cast<size_t>(i)];
          for (int c = 0; c < batch; ++c)
            for (size_t k = 0; k < rs.size(); ++k) {
              const size_t at = static_cast<size_t>(c * rows[i] + rs[k]);
              const Reference ref = reference(weights[static_cast<size_t>(i)][k], act.column(c));
              const double before = start[static_cast<size_t>(i)][at];
              const double want = ref.value + (i == 1 ? before : 0.0);
              const double bound = ref.bound + (i == 1 ? 1e-6 * std::fabs(before) : 0.0);
              ASSERT_LE(std::fabs(static_cast<double>(got[at]) - want), bound)
                  << "matrix " << i << " row " << rs[k] << " column " << c;
            }
        }
      }
    }
  EXPECT_EQ(ws.counters_not_zero(), 0);
}

// silu(gate x) * (up x): f32 and f16 results, sampled rows against the reference; the f16
// result is the f32 one rounded to nearest, bit for bit.
TEST(MatvecF16MmaSplitKTasks, SwiGlu) {
  REQUIRE_SPLITK();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  const Workspace ws;
  for (const TensorType type :
       {TensorType::Q4_0, TensorType::Q8_0, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K})
    for (const auto& [rows, cols] : std::initializer_list<std::pair<int64_t, int64_t>>{
             {1536, 576}, {100, 608}, {14336, 4096}, {1000, 2304}, {4096, 4096}}) {
      const bool k_type = kernels::split::is_k_type(static_cast<uint32_t>(type));
      if (k_type != (cols % 256 == 0 && rows * cols <= 4096 * 4096)) continue;
      const auto wt = static_cast<uint32_t>(type);
      const Matrix gate = mma_test::make_matrix(type, rows, cols, 17, true);
      const Matrix up = mma_test::make_matrix(type, rows, cols, 18, true);
      const Activations act(cols, 31);
      const std::vector<int64_t> sampled = sampled_rows(rows);
      std::vector<std::vector<double>> gw, uw;
      for (const int64_t r : sampled) {
        gw.push_back(row_weights(gate, r));
        uw.push_back(row_weights(up, r));
      }
      for (const int batch : {17, 32, 64}) {
        SCOPED_TRACE(std::string(tensor_type_info(type).name) + " " + std::to_string(rows) + "x" +
                     std::to_string(cols) + " batch " + std::to_string(batch));
        Output f32(rows, batch);
        kernels::MatvecTask plain = task_for(gate, f32.y.get());
        plain.weight_up = up.device.get();
        CUDA_OK(kernels::launch_matvec_f16mma_splitk(wt, &plain, 1, act.input(batch), ws.view(),
                                                     config, nullptr));
        const std::vector<float> wide = f32.y.download();
        expect_written_exactly(wide, rows, batch);
        DeviceArray<uint16_t> half_y(static_cast<size_t>((batch + 1) * rows));
        half_y.poison();
        kernels::MatvecTask task = task_for(gate, nullptr);
        task.weight_up = up.device.get();
        task.y_f16 = reinterpret_cast<__half*>(half_y.get());
        CUDA_OK(kernels::launch_matvec_f16mma_splitk(wt, &task, 1, act.input(batch), ws.view(),
                                                     config, nullptr));
        const std::vector<uint16_t> bits = half_y.download();
        int unwritten = 0, past = 0, unequal = 0, bad = 0;
        for (int64_t i = 0; i < batch * rows; ++i) {
          unwritten += bits[static_cast<size_t>(i)] == 0xFFFFu;
          unequal += bits[static_cast<size_t>(i)] != f32_to_fp16(wide[static_cast<size_t>(i)]);
        }
        for (int64_t r = 0; r < rows; ++r)
          past += bits[static_cast<size_t>(batch * rows + r)] != 0xFFFFu;
        EXPECT_EQ(unwritten, 0);
        EXPECT_EQ(past, 0);
        EXPECT_EQ(unequal, 0) << "f16 results that are not the f32 results rounded to nearest";
        for (int c = 0; c < batch; ++c)
          for (size_t k = 0; k < sampled.size(); ++k) {
            const Reference g = reference(gw[k], act.column(c)),
                            u = reference(uw[k], act.column(c));
            const double expected = g.value / (1.0 + std::exp(-g.value)) * u.value;
            const double bound = 1.1 * g.bound * (std::fabs(u.value) + u.bound) +
                                 1.1 * (std::fabs(g.value) + g.bound) * u.bound +
                                 1e-5 * std::fabs(expected) + 1e-30;
            const double v = wide[static_cast<size_t>(c * rows + sampled[k])];
            if (!(std::fabs(v - expected) <= bound) && ++bad <= 5)
              ADD_FAILURE() << "row " << sampled[k] << " column " << c << ": " << v << " expected "
                            << expected << " bound " << bound;
            const double h = fp16_to_f32(bits[static_cast<size_t>(c * rows + sampled[k])]);
            if (!(std::fabs(h - expected) <= bound + half_f16_ulp(std::fabs(expected) + bound)) &&
                ++bad <= 5)
              ADD_FAILURE() << "f16 row " << sampled[k] << " column " << c << ": " << h;
          }
        EXPECT_EQ(bad, 0);
      }
    }
  EXPECT_EQ(ws.counters_not_zero(), 0);
}

// A split-layout Q4_0 or Q8_0 matrix of random bytes with its f16 scales 0.01-0.02 (timing and
// graph).
DeviceArray<uint8_t> random_split(uint32_t type, int64_t rows, int64_t cols, std::mt19937_64& rng) {
  const int64_t n = cols / 32, stride = split_row_stride(type, cols);
  const int64_t scales = kernels::split::scales_offset(type, n);
  std::vector<uint8_t> bytes(static_cast<size_t>(rows * stride) + 16, 0);
  for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&bytes[i], &v, 8);
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      const uint16_t d = f32_to_fp16(0.01f + 0.01f * static_cast<float>((r + j) % 97) / 97.0f);
      std::memcpy(&bytes[static_cast<size_t>(r * stride + scales + 2 * j)], &d, 2);
      if (type == static_cast<uint32_t>(TensorType::Q6_K) && j % 8 == 0)  // the super-block's d
        std::memcpy(
            &bytes[static_cast<size_t>(r * stride + kernels::split::q6k_d_offset(n) + j / 8 * 2)],
            &d, 2);
      else if (kernels::split::is_k_type(type) && j % 8 == 0)  // the super-block's (d, dmin)
        for (int k = 0; k < 2; ++k)
          std::memcpy(
              &bytes[static_cast<size_t>(r * stride + kernels::split::kquant_d_offset(type, n) +
                                         j / 8 * 4 + 2 * k)],
              &d, 2);
    }
  return DeviceArray<uint8_t>(bytes);
}

// An 8B layer's four products (QKV, wo with accumulate, gate+up to f16, down with accumulate)
// on random weights of one type, each reading the previous one's output where the step does.
struct Products8B {
  static constexpr int64_t d = 4096, kv = 1024, ff = 14336;
  const uint32_t type;
  std::mt19937_64 rng{11};
  DeviceArray<uint8_t> wq = random_split(type, d, d, rng), wk = random_split(type, kv, d, rng),
                       wv = random_split(type, kv, d, rng), wo = random_split(type, d, d, rng),
                       gate = random_split(type, ff, d, rng), up = random_split(type, ff, d, rng),
                       down = random_split(type, d, ff, rng);
  DeviceArray<__half> x16{static_cast<size_t>(kMaxBatch * ff)};
  DeviceArray<__half> h16{static_cast<size_t>(kMaxBatch * ff)};
  DeviceArray<float> qkv{static_cast<size_t>(kMaxBatch * (d + 2 * kv))};
  DeviceArray<float> hidden{static_cast<size_t>(kMaxBatch * d)};
  explicit Products8B(uint32_t weight_type) : type(weight_type) {
    std::mt19937 frng(12);
    DeviceArray<float> x32(gpu_test::random_floats(static_cast<size_t>(kMaxBatch * ff), frng));
    kernels::launch_convert_f32_to_f16(x32.get(), kMaxBatch * ff, x16.get(), nullptr);
    kernels::launch_convert_f32_to_f16(x32.get(), kMaxBatch * ff, h16.get(), nullptr);
    cudaMemset(hidden.get(), 0, hidden.size() * sizeof(float));
    cudaDeviceSynchronize();  // before launches on other streams
  }
  kernels::MatvecTask task(const DeviceArray<uint8_t>& m, int64_t rows, int64_t cols,
                           float* out) const {
    kernels::MatvecTask t;
    t.weight = m.get();
    t.row_bytes = split_row_stride(type, cols);
    t.split_layout = true;
    t.n_out = static_cast<int>(rows);
    t.y = out;
    t.y_stride = rows;
    return t;
  }
  struct Product {
    const char* name;
    std::vector<kernels::MatvecTask> tasks;
    kernels::MatvecInputF16 in;
    double bytes;
  };
  std::vector<Product> products(int columns) {
    auto input = [&](const DeviceArray<__half>& x, int64_t n_in) {
      kernels::MatvecInputF16 in;
      in.n_in = static_cast<int>(n_in);
      in.batch = columns;
      in.x = x.get();
      return in;
    };
    const double per_weight =
        static_cast<double>(kernels::split::row_payload_bytes(type, d)) / static_cast<double>(d);
    kernels::MatvecTask o = task(wo, d, d, hidden.get());
    o.accumulate = true;
    kernels::MatvecTask gu = task(gate, ff, d, nullptr);
    gu.weight_up = up.get();
    gu.y_f16 = h16.get();
    gu.y_stride = ff;
    kernels::MatvecTask dn = task(down, d, ff, hidden.get());
    dn.accumulate = true;
    return {{"qkv",
             {task(wq, d, d, qkv.get()), task(wk, kv, d, qkv.get() + kMaxBatch * d),
              task(wv, kv, d, qkv.get() + kMaxBatch * (d + kv))},
             input(x16, d),
             (d + 2 * kv) * d * per_weight},
            {"wo", {o}, input(x16, d), d * d * per_weight},
            {"gate+up", {gu}, input(x16, d), 2 * ff * d * per_weight},
            {"down", {dn}, input(h16, ff), d * ff * per_weight}};
  }
};

// The four products in a captured graph (programmatic dependent launch as the backend runs
// them), replayed three times, against the same launches made eagerly: the same bits (the
// counters reset themselves between launches and replays).
TEST(MatvecF16MmaSplitKGraph, ReplaysGiveEagerBits) {
  REQUIRE_SPLITK();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  Products8B p(kQ4_0);
  const Workspace ws;
  const int columns = 32;
  auto run = [&](cudaStream_t stream) {
    for (const auto& product : p.products(columns)) {
      const cudaError_t status = kernels::launch_matvec_f16mma_splitk(
          kQ4_0, product.tasks.data(), static_cast<int>(product.tasks.size()), product.in,
          ws.view(), config, stream);
      if (status != cudaSuccess) return status;
    }
    return cudaSuccess;
  };
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<std::vector<float>> eager;
  for (int i = 0; i < 3; ++i) {
    CUDA_OK(run(stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    eager.push_back(p.hidden.download());
  }
  CUDA_OK(cudaMemsetAsync(p.hidden.get(), 0, p.hidden.size() * sizeof(float), stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  CUDA_OK(run(stream));
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 3; ++i) {
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    const std::vector<float> replayed = p.hidden.download();
    EXPECT_EQ(std::memcmp(replayed.data(), eager[static_cast<size_t>(i)].data(),
                          replayed.size() * sizeof(float)),
              0)
        << "replay " << i << " differs from eager launch " << i;
  }
  EXPECT_EQ(ws.counters_not_zero(), 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(MatvecF16MmaSplitKTasks, RefusesWhatItCannotRun) {
  EXPECT_TRUE(kernels::matvec_f16mma_splitk_supports(kQ4_0, true));
  EXPECT_FALSE(kernels::matvec_f16mma_splitk_supports(kQ4_0, false));
  for (const auto type : {TensorType::Q8_0, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K})
    EXPECT_TRUE(kernels::matvec_f16mma_splitk_supports(static_cast<uint32_t>(type), true));
  for (const auto type : {TensorType::Q4_1, TensorType::Q2_K, TensorType::IQ4_NL, TensorType::F16})
    EXPECT_FALSE(kernels::matvec_f16mma_splitk_supports(static_cast<uint32_t>(type), true));
  REQUIRE_SPLITK();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  const Workspace ws;
  const Matrix w = mma_test::make_matrix(TensorType::Q4_0, 16, 64, 3);
  const Activations act(64, 4);
  Output y(16, 8);
  kernels::MatvecTask t = task_for(w, y.y.get());
  auto launch = [&](const kernels::MatvecTask* tasks, int n, const kernels::MatvecInputF16& in,
                    uint32_t type = kQ4_0, int max_splits = 0) {
    return kernels::launch_matvec_f16mma_splitk(type, tasks, n, in, ws.view(), config, nullptr,
                                                max_splits);
  };
  EXPECT_EQ(launch(&t, 1, act.input(8), static_cast<uint32_t>(TensorType::Q4_1)),
            cudaErrorInvalidValue);
  EXPECT_EQ(launch(&t, 1, act.input(65)), cudaErrorInvalidValue);  // more than 64 columns
  EXPECT_EQ(launch(&t, 1, act.input(8), kQ4_0, -1), cudaErrorInvalidValue);
  t.split_layout = false;
  EXPECT_EQ(launch(&t, 1, act.input(8)), cudaErrorInvalidValue);
  t.split_layout = true;
  kernels::MatvecInputF16 odd = act.input(8);
  odd.n_in = 48;
  EXPECT_EQ(launch(&t, 1, odd), cudaErrorInvalidValue);
  for (const TensorType k_type :
       {TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K}) {  // not whole super-blocks
    const Matrix k = mma_test::make_matrix(k_type, 16, 256, 3);
    const kernels::MatvecTask kt = task_for(k, y.y.get());
    EXPECT_EQ(launch(&kt, 1, act.input(8), static_cast<uint32_t>(k_type)), cudaErrorInvalidValue)
        << tensor_type_info(k_type).name;
  }
  kernels::MatvecInputF16 misaligned = act.input(8);
  misaligned.x += 1;
  EXPECT_EQ(launch(&t, 1, misaligned), cudaErrorInvalidValue);
  kernels::MatvecInputF16 long_rows = act.input(8);
  long_rows.n_in = 128;
  EXPECT_EQ(launch(&t, 1, long_rows), cudaErrorInvalidValue);
  DeviceArray<__half> half_out(16 * 8);
  kernels::MatvecTask to_f16 = t;
  to_f16.y_f16 = half_out.get();
  to_f16.accumulate = true;
  EXPECT_EQ(launch(&to_f16, 1, act.input(8)), cudaErrorInvalidValue);
  kernels::MatvecTask mixed[2] = {t, t};
  mixed[1].weight_up = w.device.get();
  EXPECT_EQ(launch(mixed, 2, act.input(8)), cudaErrorInvalidValue);
  EXPECT_EQ(launch(&t, 0, act.input(8)), cudaErrorInvalidValue);
  EXPECT_EQ(launch(&t, 1, act.input(0)), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  int written = 0;
  for (const float v : y.y.download()) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    written += bits != mma_test::kPoisonBits;
  }
  EXPECT_EQ(written, 0) << "a refused launch wrote y";
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

// The four 8B products at 17-64 columns, split-K beside the one-warp f16 kernel: a probe to
// read on the device (every launch must succeed; both outputs agree within 1e-4 rms).
TEST(MatvecF16MmaSplitKTiming, ShapesOf8B) {
  REQUIRE_SPLITK();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  const bool one_warp = kernels::matvec_f16mma_fits_device();
  const Workspace ws;
  for (const TensorType weight_type :
       {TensorType::Q4_0, TensorType::Q8_0, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K}) {
    const uint32_t wt = static_cast<uint32_t>(weight_type);
    const char* type_name = tensor_type_info(weight_type).name.data();
    Products8B p(wt);
    double total_split = 0, total_one = 0;
    for (const int columns : {17, 24, 32, 48, 64}) {
      total_split = total_one = 0;
      for (const auto& product : p.products(columns)) {
        // Plain outputs (no accumulate) so both kernels' results compare.
        std::vector<kernels::MatvecTask> tasks = product.tasks;
        for (auto& t : tasks) t.accumulate = false;
        const int n = static_cast<int>(tasks.size());
        const double split_us = time_launches([&] {
          return kernels::launch_matvec_f16mma_splitk(wt, tasks.data(), n, product.in, ws.view(),
                                                      config, nullptr);
        });
        ASSERT_GT(split_us, 0) << product.name << " split-K launch failed";
        const std::vector<float> split_y =
            tasks[0].y_f16 ? std::vector<float>{} : p.hidden.download();
        double one_us = 0;
        if (one_warp) {
          one_us = time_launches([&] {
            return kernels::launch_matvec_f16mma(wt, tasks.data(), n, product.in, config, nullptr);
          });
          ASSERT_GT(one_us, 0) << product.name << " one-warp launch failed";
          if (tasks[0].y == p.hidden.get()) {
            const std::vector<float> one_y = p.hidden.download();
            double difference = 0, norm = 0;
            for (size_t i = 0; i < static_cast<size_t>(columns * Products8B::d); ++i) {
              difference += (static_cast<double>(split_y[i]) - one_y[i]) * (split_y[i] - one_y[i]);
              norm += static_cast<double>(one_y[i]) * one_y[i];
            }
            EXPECT_LT(std::sqrt(difference / norm), 1e-4) << product.name << " " << columns;
          }
        }
        total_split += split_us;
        total_one += one_us;
        std::printf(
            "[f16mma-splitk-timing] %s %-7s %2d columns: split-K %8.2f us (%.2f TB/s of weights), "
            "one-warp %8.2f us (%.2f TB/s)\n",
            type_name, product.name, columns, split_us, product.bytes / (split_us * 1e-6) / 1e12,
            one_us, one_us > 0 ? product.bytes / (one_us * 1e-6) / 1e12 : 0.0);
        ::testing::Test::RecordProperty(std::string(type_name) + "_" + product.name + "_" +
                                            std::to_string(columns) + "_splitk_us",
                                        std::to_string(split_us));
      }
      std::printf(
          "[f16mma-splitk-timing] %s layer   %2d columns: split-K %8.2f us, one-warp %8.2f us\n",
          type_name, columns, total_split, total_one);
    }
  }
  EXPECT_EQ(ws.counters_not_zero(), 0);
}

}  // namespace
}  // namespace granule
