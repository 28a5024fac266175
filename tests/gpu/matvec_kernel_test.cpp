// The decode matrix-vector kernels against the CPU reference (cpu::matmul over
// dequantize_row) for every supported block type, odd shapes and batch sizes, including
// the multi-matrix launch, the accumulate epilogue and the fused SwiGLU epilogue.
// Expected values: cpu::matmul in f32 on the same encoded weights. Error bound: f32
// rounding, plus, for the int8-activation types (Q4_0/Q4_1/Q8_0), the exact worst case of
// rounding each activation to its block's int8 grid: sum |w_i| * amax(block of i) / 254.
// The int8-activation kernels are also held to the CPU oracle's product (the activations
// rounded through int8 blocks as launch_quantize_q8 rounds them: cpu::round_through_q8), within
// f32 summation order alone: 1e-5 of sum |w_i x_i|.
// Every quantised type (Q4_0 ... Q6_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4) runs again on the
// split layout (engine/include/granule/split_layout.h), whose kernels always read int8
// activations. The kernels run with the backend's configuration (GRANULE_* overrides included).
#include <cmath>
#include <iostream>
#include <random>
#include <tuple>

#include "backends/cpu/ops.h"
#include "gpu_test_support.h"
#include "granule/quant.h"
#include "granule/split_layout.h"
#include "granule/tensor_type.h"
#include "granule/testkit/quantize.h"
#include "kernel_test_inputs.h"
#include "matvec.cuh"
#include "model/weight_split.h"
#include "quantize_activations.cuh"
#include "rope_kv.cuh"

namespace granule {
namespace {

using gpu_test::DeviceArray;
using gpu_test::encode;
using gpu_test::Encoded;

bool reads_q8(TensorType t, bool split = false) {
  return kernels::matvec_reads_q8(static_cast<uint32_t>(t), split);
}
bool has_split(TensorType t) { return split_layout_supported(static_cast<uint32_t>(t)); }

// A one-matrix task over split-layout weights w (encoded as e) writing rows results to y.
kernels::MatvecTask split_task(const DeviceArray<uint8_t>& w, const Encoded& e, int64_t rows,
                               float* y) {
  kernels::MatvecTask t;
  t.weight = w.get();
  t.row_bytes = e.device_row_bytes;
  t.split_layout = true;
  t.n_out = static_cast<int>(rows);
  t.y = y;
  t.y_stride = rows;
  return t;
}

// A batch of activations on the device as the matvec kernels take them: x in f32 and room
// for its int8 blocks, which quantize() fills for the kernels that read those.
struct DeviceActivations {
  DeviceArray<float> x;
  DeviceArray<int8_t> qs;
  DeviceArray<float2> ds;
  kernels::MatvecInput in;
  DeviceActivations(const std::vector<float>& host, int batch, int64_t cols)
      : x(host), qs(static_cast<size_t>(batch * cols)), ds(static_cast<size_t>(batch * cols / 32)) {
    in.n_in = static_cast<int>(cols);
    in.batch = batch;
    in.x = x.get();
    in.xq = {qs.get(), ds.get()};
  }
  cudaError_t quantize(const kernels::KernelConfig& config) {
    return kernels::launch_quantize_q8(x.get(), in.batch, in.n_in, in.xq, config, nullptr);
  }
};

// Random batch-1 activations of `cols` elements, quantised (`act.in`), and the same input with a
// handed-over RMSNorm to apply (`normed`: random sums of squares per 32-element block).
struct NormedActivations {
  DeviceActivations act;
  DeviceArray<float> sums;
  kernels::MatvecInput normed;
  NormedActivations(int64_t cols, std::mt19937& rng, const kernels::KernelConfig& config)
      : act(gpu_test::random_floats(static_cast<size_t>(cols), rng), 1, cols),
        sums(random_sums(cols / 32, rng)) {
    EXPECT_EQ(act.quantize(config), cudaSuccess);
    normed = act.in;
    normed.norm_sum_squares = sums.get();
    normed.norm_eps = 1e-5f;
  }
  static std::vector<float> random_sums(int64_t n, std::mt19937& rng) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = 0.25f + std::fabs(gpu_test::random_floats(1, rng)[0]);
    return v;
  }
};

// The types with a split layout, which the batch-1 split kernels run.
constexpr TensorType kSplitTypes[] = {
    TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0,   TensorType::Q5_1,
    TensorType::Q8_0, TensorType::Q4_K, TensorType::Q5_K,   TensorType::Q6_K,
    TensorType::Q2_K, TensorType::Q3_K, TensorType::IQ4_NL, TensorType::IQ4_XS,
    TensorType::MXFP4};

// Per (column, row): the bound on |gpu - reference|.
std::vector<double> error_bounds(const Encoded& w, const std::vector<float>& x, int64_t rows,
                                 int64_t cols, int batch, bool q8) {
  std::vector<double> bounds(static_cast<size_t>(rows * batch));
  for (int b = 0; b < batch; ++b) {
    const float* xb = x.data() + b * cols;
    std::vector<double> block_amax(static_cast<size_t>(cols / 32));
    for (int64_t i = 0; i < cols; ++i)
      block_amax[i / 32] = std::max<double>(block_amax[i / 32], std::fabs(xb[i]));
    for (int64_t r = 0; r < rows; ++r) {
      double magnitude = 0, rounding = 0;
      for (int64_t i = 0; i < cols; ++i) {
        const double wi = std::fabs(w.decoded[r * cols + i]);
        magnitude += wi * std::fabs(xb[i]);
        rounding += wi * block_amax[i / 32] / 254.0;
      }
      bounds[b * rows + r] =
          1e-5 * magnitude + (q8 ? 1.01 * rounding + 1e-5 * magnitude : 0) + 1e-6;
    }
  }
  return bounds;
}

struct Case {
  TensorType type;
  int64_t rows, cols;
  int batch;
  bool split = false;
};

// One product of a random matrix against the CPU reference, launched with `config`.
void expect_matvec_matches_cpu(const Case& c, const kernels::KernelConfig& config) {
  std::mt19937 rng(
      static_cast<uint32_t>(c.rows * 131 + c.cols * 7 + c.batch + static_cast<int>(c.type)));
  const Encoded w = encode(c.type, c.rows, c.cols, rng, c.split);
  const std::vector<float> x = gpu_test::random_floats(static_cast<size_t>(c.batch * c.cols), rng);
  std::vector<float> expected(static_cast<size_t>(c.rows * c.batch));
  cpu::matmul(c.type, w.bytes.data(), c.rows, c.cols, x.data(), c.batch, expected.data(), nullptr);

  DeviceArray<uint8_t> d_w(w.device_bytes);
  DeviceArray<float> d_y(static_cast<size_t>(c.rows * c.batch));
  DeviceActivations act(x, c.batch, c.cols);
  d_y.poison();
  if (reads_q8(c.type, c.split)) CUDA_OK(act.quantize(config));
  kernels::MatvecTask task;
  task.weight = d_w.get();
  task.row_bytes = w.device_row_bytes;
  task.split_layout = c.split;
  task.n_out = static_cast<int>(c.rows);
  task.y = d_y.get();
  task.y_stride = c.rows;
  CUDA_OK(kernels::launch_matvec(static_cast<uint32_t>(c.type), &task, 1, act.in, config, nullptr));
  const std::vector<float> got = d_y.download();
  const std::vector<double> bound =
      error_bounds(w, x, c.rows, c.cols, c.batch, reads_q8(c.type, c.split));
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - expected[i]) <= bound[i])) {
      if (++bad <= 5)
        ADD_FAILURE() << "element " << i << ": gpu " << got[i] << " cpu " << expected[i]
                      << " bound " << bound[i];
    }
  }
  EXPECT_EQ(bad, 0);
  if (!reads_q8(c.type, c.split)) return;
  // Against the oracle: the same int8 activations, so only the summation order differs.
  std::vector<float> rounded = x, oracle(expected.size());
  for (int b = 0; b < c.batch; ++b)
    cpu::round_through_q8(rounded.data() + b * c.cols, c.cols, cpu::Q8Rounding::Divide);
  cpu::matmul(c.type, w.bytes.data(), c.rows, c.cols, rounded.data(), c.batch, oracle.data(),
              nullptr);
  const std::vector<double> f32_only = error_bounds(w, x, c.rows, c.cols, c.batch, false);
  double worst = 0;
  int off = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - oracle[i]);
    worst = std::max(worst, err / f32_only[i]);
    if (!(err <= f32_only[i]) && ++off <= 5)
      ADD_FAILURE() << "element " << i << ": gpu " << got[i] << " oracle " << oracle[i] << " bound "
                    << f32_only[i];
  }
  EXPECT_EQ(off, 0) << tensor_type_info(c.type).name << (c.split ? " split" : "")
                    << ": not the int8 product the oracle computes";
  std::cout << "[matvec-vs-oracle] " << tensor_type_info(c.type).name << (c.split ? " split " : " ")
            << c.rows << "x" << c.cols << " batch " << c.batch << ": worst err / f32 bound "
            << worst << "\n";
}

class MatvecKernel : public ::testing::TestWithParam<Case> {};

TEST_P(MatvecKernel, MatchesCpuMatmulOnRandomWeights) {
  GRANULE_REQUIRE_GPU();
  expect_matvec_matches_cpu(GetParam(), gpu_test::kernel_config());
}

std::vector<Case> cases() {
  std::vector<Case> out;
  const TensorType types[] = {
      TensorType::F32,  TensorType::F16,    TensorType::BF16,   TensorType::Q8_0,
      TensorType::Q4_0, TensorType::Q4_1,   TensorType::Q4_K,   TensorType::Q5_K,
      TensorType::Q6_K, TensorType::Q5_0,   TensorType::Q5_1,   TensorType::Q2_K,
      TensorType::Q3_K, TensorType::IQ4_NL, TensorType::IQ4_XS, TensorType::MXFP4};
  for (TensorType t : types) {
    out.push_back({t, 1, 256, 1});
    out.push_back({t, 37, 768, 3});
    out.push_back({t, 129, 512, 16});
    out.push_back({t, 300, 1536, 21});  // 16 + 4 + 1 column groups
    out.push_back({t, 61, 2816, 7});
  }
  // The split layout: the same shapes, plus rows long enough for several pipelined steps
  // (14336 = 448 sub-blocks), fewer sub-blocks than lanes (576 = 18), and every batch group.
  for (TensorType t : kSplitTypes) {
    for (Case c : {Case{t, 1, 256, 1}, Case{t, 37, 768, 3}, Case{t, 129, 512, 16},
                   Case{t, 300, 1536, 21}, Case{t, 61, 2816, 7}, Case{t, 70, 14336, 1},
                   Case{t, 517, 4096, 1}, Case{t, 45, 4608, 2}, Case{t, 23, 1024, 8}}) {
      c.split = true;
      out.push_back(c);
    }
    if (kernels::split::block_elements(static_cast<uint32_t>(t)) == 32)
      out.push_back({t, 99, 576, 1, true});
  }
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(tensor_type_info(c.type).name) + "_" + std::to_string(c.rows) + "x" +
         std::to_string(c.cols) + "_b" + std::to_string(c.batch) + (c.split ? "_split" : "");
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatvecKernel, ::testing::ValuesIn(cases()), case_name);

// Batch-1 Q4_0/Q4_1 over 77 rows, which leave a partial block (GGUF layout: 2 rows per block)
// or warp, on rows of 128 and 256 sub-blocks.
TEST(MatvecKernelShapes, Batch1Q4PartialBlocksMatchCpu) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  for (TensorType type : {TensorType::Q4_0, TensorType::Q4_1}) {
    expect_matvec_matches_cpu({type, 77, 4096, 1, false}, config);
    for (const int64_t cols : {4096, 8192})
      expect_matvec_matches_cpu({type, 77, cols, 1, true}, config);
  }
}

// Q, K and V in one launch (three matrices, three row counts), and the accumulate epilogue.
TEST(MatvecKernelTasks, ThreeMatricesInOneLaunchAndAccumulate) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  std::mt19937 rng(7);
  for (const bool split : {false, true})
    for (TensorType type : {TensorType::Q4_0, TensorType::Q6_K}) {
      const int64_t cols = 512;
      const int batch = 5;
      const int64_t rows[3] = {96, 33, 33};
      const std::vector<float> x = gpu_test::random_floats(static_cast<size_t>(batch * cols), rng);
      DeviceActivations act(x, batch, cols);
      CUDA_OK(act.quantize(config));
      std::vector<Encoded> w;
      std::vector<DeviceArray<uint8_t>> d_w;
      std::vector<DeviceArray<float>> d_y;
      std::vector<std::vector<float>> start;
      kernels::MatvecTask tasks[3];
      for (int i = 0; i < 3; ++i) {
        w.push_back(encode(type, rows[i], cols, rng, split));
        d_w.emplace_back(w.back().device_bytes);
        start.push_back(gpu_test::random_floats(static_cast<size_t>(rows[i] * batch), rng));
        d_y.emplace_back(start.back());
        tasks[i].weight = d_w.back().get();
        tasks[i].row_bytes = w.back().device_row_bytes;
        tasks[i].split_layout = split;
        tasks[i].n_out = static_cast<int>(rows[i]);
        tasks[i].y = d_y.back().get();
        tasks[i].y_stride = rows[i];
        tasks[i].accumulate = i == 1;  // only K accumulates
      }
      CUDA_OK(
          kernels::launch_matvec(static_cast<uint32_t>(type), tasks, 3, act.in, config, nullptr));
      for (int i = 0; i < 3; ++i) {
        std::vector<float> expected(static_cast<size_t>(rows[i] * batch));
        cpu::matmul(type, w[i].bytes.data(), rows[i], cols, x.data(), batch, expected.data(),
                    nullptr);
        if (i == 1)
          for (size_t j = 0; j < expected.size(); ++j) expected[j] += start[i][j];
        const std::vector<double> bound =
            error_bounds(w[i], x, rows[i], cols, batch, reads_q8(type, split));
        const std::vector<float> got = d_y[i].download();
        for (size_t j = 0; j < got.size(); ++j)
          ASSERT_LE(std::fabs(got[j] - expected[j]), bound[j] + 1e-5 * std::fabs(expected[j]))
              << tensor_type_info(type).name << (split ? " split" : "") << " matrix " << i
              << " element " << j;
      }
    }
}

// Gate and up in one pass: y = silu(gate·x) * (up·x).
TEST(MatvecKernelTasks, FusedSwigluMatchesCpuSwiglu) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  std::mt19937 rng(11);
  for (const bool split : {false, true})
    for (TensorType type :
         {TensorType::Q4_1, TensorType::F16, TensorType::Q4_K, TensorType::Q4_0}) {
      if (split && !has_split(type)) continue;
      const int64_t rows = 200, cols = 768;
      const int batch = 9;
      const Encoded gate = encode(type, rows, cols, rng, split),
                    up = encode(type, rows, cols, rng, split);
      const std::vector<float> x = gpu_test::random_floats(static_cast<size_t>(batch * cols), rng);
      std::vector<float> g(static_cast<size_t>(rows * batch)), u(g.size()), expected(g.size());
      cpu::matmul(type, gate.bytes.data(), rows, cols, x.data(), batch, g.data(), nullptr);
      cpu::matmul(type, up.bytes.data(), rows, cols, x.data(), batch, u.data(), nullptr);
      cpu::swiglu(g.data(), u.data(), expected.data(), static_cast<int64_t>(g.size()));
      DeviceArray<uint8_t> d_gate(gate.device_bytes), d_up(up.device_bytes);
      DeviceArray<float> d_y(g.size());
      DeviceActivations act(x, batch, cols);
      d_y.poison();
      CUDA_OK(act.quantize(config));
      kernels::MatvecTask t;
      t.weight = d_gate.get();
      t.weight_up = d_up.get();
      t.row_bytes = gate.device_row_bytes;
      t.split_layout = split;
      t.n_out = static_cast<int>(rows);
      t.y = d_y.get();
      t.y_stride = rows;
      CUDA_OK(kernels::launch_matvec(static_cast<uint32_t>(type), &t, 1, act.in, config, nullptr));
      const std::vector<float> got = d_y.download();
      const std::vector<double> bg =
          error_bounds(gate, x, rows, cols, batch, reads_q8(type, split));
      const std::vector<double> bu = error_bounds(up, x, rows, cols, batch, reads_q8(type, split));
      for (size_t j = 0; j < got.size(); ++j) {
        // silu' is within [-0.1, 1.1]: the product's error is bounded by the factors' bounds.
        const double bound =
            1.1 * bg[j] * (std::fabs(u[j]) + bu[j]) + std::fabs(g[j]) * bu[j] * 1.1 + 1e-5;
        ASSERT_LE(std::fabs(got[j] - expected[j]), bound)
            << tensor_type_info(type).name << (split ? " split" : "") << " element " << j;
      }
    }
}

// The batch-1 norm hand-over (the decode fusion, kernels/README.md): a product whose 32-row blocks
// also leave as int8 blocks of y·w with Σ y² per block (MatvecTask::y_q8, norm_weight,
// sum_squares), then a product reading them that applies the RMSNorm's 1/rms
// (MatvecInput::norm_sum_squares), and the gate/up product quantising its SwiGLU result. Each
// against the CPU on the GPU's own y: the int8 blocks within half a step of y·w, the sums to f32
// rounding, the products within the int8 rounding bound of their (normed) inputs.
TEST(MatvecKernelTasks, Batch1NormHandOverMatchesCpu) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  std::mt19937 rng(23);
  constexpr float kEps = 1e-5f;
  for (TensorType type : {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q8_0, TensorType::Q4_K,
                          TensorType::Q6_K, TensorType::Q2_K, TensorType::Q3_K, TensorType::IQ4_NL,
                          TensorType::IQ4_XS, TensorType::MXFP4}) {
    const std::string name(tensor_type_info(type).name);
    const int64_t rows = 256, cols = 512, next_rows = 64;  // the next product reads 256 wide
    const Encoded a = encode(type, rows, cols, rng, true);
    const std::vector<float> x = gpu_test::random_floats(static_cast<size_t>(cols), rng);
    const std::vector<float> h0 = gpu_test::random_floats(static_cast<size_t>(rows), rng);
    std::vector<float> norm_weight = gpu_test::random_floats(static_cast<size_t>(rows), rng);
    for (float& w : norm_weight) w = 0.5f + std::fabs(w);
    std::vector<float> ax(static_cast<size_t>(rows));
    cpu::matmul(type, a.bytes.data(), rows, cols, x.data(), 1, ax.data(), nullptr);

    DeviceArray<uint8_t> d_a(a.device_bytes);
    DeviceArray<float> d_y(h0), d_w(norm_weight), d_sums(static_cast<size_t>(rows / 32));
    DeviceArray<int8_t> d_qs(static_cast<size_t>(rows));
    DeviceArray<float2> d_ds(static_cast<size_t>(rows / 32));
    DeviceActivations act(x, 1, cols);
    CUDA_OK(act.quantize(config));
    kernels::MatvecTask t = split_task(d_a, a, rows, d_y.get());
    t.accumulate = true;
    t.y_q8 = {d_qs.get(), d_ds.get()};
    t.norm_weight = d_w.get();
    t.sum_squares = d_sums.get();
    CUDA_OK(kernels::launch_matvec(static_cast<uint32_t>(type), &t, 1, act.in, config, nullptr));
    const std::vector<float> y = d_y.download(), sums = d_sums.download();
    const std::vector<int8_t> qs = d_qs.download();
    const std::vector<float2> ds = d_ds.download();
    const std::vector<double> bound = error_bounds(a, x, rows, cols, 1, true);
    for (int64_t r = 0; r < rows; ++r)
      ASSERT_LE(std::fabs(y[r] - (h0[r] + ax[r])), bound[r]) << name << " row " << r;
    for (int64_t b = 0; b < rows / 32; ++b) {
      double sum_sq = 0, amax = 0;
      int sum_q = 0;
      for (int i = 0; i < 32; ++i) {
        sum_sq += static_cast<double>(y[b * 32 + i]) * y[b * 32 + i];
        amax = std::max(amax, std::fabs(static_cast<double>(y[b * 32 + i]) * norm_weight[b * 32 + i]));
        sum_q += qs[b * 32 + i];
      }
      EXPECT_NEAR(sums[b], sum_sq, 1e-5 * sum_sq + 1e-12) << name << " block " << b;
      EXPECT_NEAR(ds[b].x, amax / 127, 1e-6 * amax) << name << " block " << b;
      EXPECT_NEAR(ds[b].y, ds[b].x * sum_q, 1e-5 * std::fabs(ds[b].y) + 1e-9) << name;
      for (int i = 0; i < 32; ++i) {
        const double want = static_cast<double>(y[b * 32 + i]) * norm_weight[b * 32 + i];
        ASSERT_LE(std::fabs(qs[b * 32 + i] * ds[b].x - want), 0.501 * ds[b].x + 1e-9)
            << name << " element " << b * 32 + i;
      }
    }

    // The next product reads those blocks and applies 1/rms; and a gate/up pair that also
    // quantises its SwiGLU result.
    double mean_sq = 0;
    for (const float v : y) mean_sq += static_cast<double>(v) * v;
    const double inv_rms = 1.0 / std::sqrt(mean_sq / rows + kEps);
    std::vector<float> normed(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i)
      normed[i] = static_cast<float>(y[i] * norm_weight[i] * inv_rms);
    const Encoded gate = encode(type, next_rows, rows, rng, true),
                  up = encode(type, next_rows, rows, rng, true);
    std::vector<float> g(static_cast<size_t>(next_rows)), u(g.size()), want(g.size());
    cpu::matmul(type, gate.bytes.data(), next_rows, rows, normed.data(), 1, g.data(), nullptr);
    cpu::matmul(type, up.bytes.data(), next_rows, rows, normed.data(), 1, u.data(), nullptr);
    cpu::swiglu(g.data(), u.data(), want.data(), next_rows);
    DeviceArray<uint8_t> d_gate(gate.device_bytes), d_up(up.device_bytes);
    DeviceArray<float> d_g(g.size()), d_h(g.size());
    DeviceArray<int8_t> d_hq(g.size());
    DeviceArray<float2> d_hd(g.size() / 32);
    kernels::MatvecInput in;
    in.n_in = static_cast<int>(rows);
    in.batch = 1;
    in.xq = {d_qs.get(), d_ds.get()};
    in.norm_sum_squares = d_sums.get();
    in.norm_eps = kEps;
    const kernels::MatvecTask plain = split_task(d_gate, gate, next_rows, d_g.get());
    CUDA_OK(kernels::launch_matvec(static_cast<uint32_t>(type), &plain, 1, in, config, nullptr));
    kernels::MatvecTask swiglu = plain;
    swiglu.weight_up = d_up.get();
    swiglu.y = d_h.get();
    swiglu.y_q8 = {d_hq.get(), d_hd.get()};
    CUDA_OK(kernels::launch_matvec(static_cast<uint32_t>(type), &swiglu, 1, in, config, nullptr));
    const std::vector<float> got_g = d_g.download(), got_h = d_h.download();
    const std::vector<int8_t> hq = d_hq.download();
    const std::vector<float2> hd = d_hd.download();
    const std::vector<double> bg = error_bounds(gate, normed, next_rows, rows, 1, true);
    const std::vector<double> bu = error_bounds(up, normed, next_rows, rows, 1, true);
    for (int64_t r = 0; r < next_rows; ++r) {
      ASSERT_LE(std::fabs(got_g[r] - g[r]), 1.01 * bg[r] + 1e-5 * std::fabs(g[r]))
          << name << " normed input, row " << r;
      const double bound_h = 1.1 * bg[r] * (std::fabs(u[r]) + bu[r]) +
                             std::fabs(g[r]) * bu[r] * 1.1 + 1e-4 * std::fabs(want[r]) + 1e-5;
      ASSERT_LE(std::fabs(got_h[r] - want[r]), bound_h) << name << " SwiGLU row " << r;
      ASSERT_LE(std::fabs(hq[r] * hd[r / 32].x - got_h[r]), 0.501 * hd[r / 32].x + 1e-9)
          << name << " SwiGLU int8 element " << r;
    }
  }
}

// RoPE and the K/V write in the batch-1 Q/K/V product's epilogue (k::RowRope) against the same
// product followed by rope_kv_kernel: q and the whole KV buffer, with biases, at a position in
// the middle of a two-layer KV, for Q4_0 and Q8_0, 256 and 8,192 wide (one sub-block per lane,
// and eight), plain and over a handed-over norm: the epilogue's kernel reduces the norm's sums
// after its dot products (the late norm), the plain product's kernel before them (warps that
// stay), in the same order, so q before the rotation is the same.
TEST(MatvecKernelTasks, Batch1RopeEpilogueMatchesRopeKv) {
  GRANULE_REQUIRE_GPU();
  std::mt19937 rng(31);
  constexpr int kHeads = 4, kKv = 2, kHeadDim = 64, kLayers = 2, kTokens = 48, kLayer = 1;
  constexpr int64_t kPos = 37;
  const int64_t token_stride = int64_t{kLayers} * 2 * kKv * kHeadDim;
  std::vector<double> freqs(kHeadDim / 2);
  for (int i = 0; i < kHeadDim / 2; ++i) freqs[i] = std::pow(10000.0, -2.0 * i / kHeadDim);
  const kernels::KernelConfig config = gpu_test::kernel_config();
  for (const auto& [type, kIn, normed] : {std::tuple{TensorType::Q4_0, int64_t{256}, false},
                                          std::tuple{TensorType::Q4_0, int64_t{8192}, true},
                                          std::tuple{TensorType::Q8_0, int64_t{256}, true},
                                          std::tuple{TensorType::Q8_0, int64_t{8192}, false}}) {
    const int64_t rows[3] = {kHeads * kHeadDim, kKv * kHeadDim, kKv * kHeadDim};
    std::vector<Encoded> w;
    std::vector<DeviceArray<uint8_t>> d_w;
    std::vector<DeviceArray<float>> d_bias;
    for (int m = 0; m < 3; ++m) {
      w.push_back(encode(type, rows[m], kIn, rng, true));
      d_w.emplace_back(w.back().device_bytes);
      d_bias.emplace_back(gpu_test::random_floats(static_cast<size_t>(rows[m]), rng, 0.1f));
    }
    const NormedActivations input(kIn, rng, config);
    const kernels::MatvecInput& product_in = normed ? input.normed : input.act.in;
    const std::vector<__half> kv_init(static_cast<size_t>(kTokens * token_stride), __float2half(0.25f));
    DeviceArray<__half> kv_a(kv_init), kv_b(kv_init);
    const DeviceArray<double> d_freqs(freqs);
    const DeviceArray<int32_t> d_pos(std::vector<int32_t>{kPos}), d_slot(std::vector<int32_t>{0});
    const DeviceArray<__half*> base_a(std::vector<__half*>{kv_a.get()}),
        base_b(std::vector<__half*>{kv_b.get()});
    std::vector<DeviceArray<float>> out_a, out_b;
    for (int m = 0; m < 3; ++m) {
      out_a.emplace_back(static_cast<size_t>(rows[m]));
      out_b.emplace_back(static_cast<size_t>(rows[m]));
    }
    auto tasks_for = [&](std::vector<DeviceArray<float>>& out, bool rope) {
      std::vector<kernels::MatvecTask> t(3);
      for (int m = 0; m < 3; ++m) {
        t[m] = split_task(d_w[m], w[m], rows[m], out[m].get());
        if (rope) {
          t[m].rope_part = m + 1;
          t[m].bias = d_bias[m].get();
        }
      }
      return t;
    };
    // A: the epilogue.
    kernels::MatvecInput in = product_in;
    in.rope = {.positions = d_pos.get(),
               .slots = d_slot.get(),
               .slot_base = base_a.get(),
               .frequencies = d_freqs.get(),
               .token_stride = token_stride,
               .kv_offset = 0,
               .layer = kLayer,
               .n_kv = kKv,
               .head_dim = kHeadDim};
    std::vector<kernels::MatvecTask> ta = tasks_for(out_a, true);
    CUDA_OK(kernels::launch_matvec(static_cast<uint32_t>(type), ta.data(), 3, in, config, nullptr));
    // B: the product, then rope_kv.
    std::vector<kernels::MatvecTask> tb = tasks_for(out_b, false);
    CUDA_OK(kernels::launch_matvec(static_cast<uint32_t>(type), tb.data(), 3, product_in, config,
                                   nullptr));
    kernels::RopeKvArgs r;
    r.q = out_b[0].get();
    r.q_stride = rows[0];
    r.k = out_b[1].get();
    r.k_stride = rows[1];
    r.v = out_b[2].get();
    r.v_stride = rows[2];
    r.q_bias = d_bias[0].get();
    r.k_bias = d_bias[1].get();
    r.v_bias = d_bias[2].get();
    r.frequencies = d_freqs.get();
    r.n_head = kHeads;
    r.n_kv = kKv;
    r.head_dim = kHeadDim;
    r.rows = 1;
    r.positions = d_pos.get();
    r.slots = d_slot.get();
    r.slot_base = base_b.get();
    r.token_stride = token_stride;
    r.layer = kLayer;
    CUDA_OK(kernels::launch_rope_kv(r, config, nullptr));
    const std::vector<float> qa = out_a[0].download(), qb = out_b[0].download();
    const std::vector<__half> ka = kv_a.download(), kb = kv_b.download();
    size_t q_bits = 0, kv_bits = 0;
    for (size_t i = 0; i < qa.size(); ++i) {
      q_bits += std::memcmp(&qa[i], &qb[i], sizeof(float)) != 0;
      ASSERT_LE(std::fabs(qa[i] - qb[i]), 1e-6f * std::fabs(qb[i]) + 1e-7f) << "q element " << i;
    }
    for (size_t i = 0; i < ka.size(); ++i) {
      const float a = __half2float(ka[i]), b = __half2float(kb[i]);
      kv_bits += std::memcmp(&ka[i], &kb[i], sizeof(__half)) != 0;
      ASSERT_LE(std::fabs(a - b), 1e-3f * std::fabs(b) + 1e-7f) << "KV half " << i;
    }
    size_t written = 0;
    for (size_t i = 0; i < ka.size(); ++i) written += __half2float(ka[i]) != 0.25f;
    EXPECT_GE(written, static_cast<size_t>(2 * kKv * kHeadDim) - 4) << "the token's K and V";
    std::cout << "[rope-epilogue] " << tensor_type_info(type).name << " " << kIn << " wide"
              << (normed ? ", normed" : "") << ": q differs bitwise in " << q_bits << " of "
              << qa.size() << ", KV in " << kv_bits << " of " << ka.size() << " halves\n";
  }
}

// A batch-1 product with int8 results (MatvecTask::y_q8) over the first `rows` rows of w,
// starting from y0: the SwiGLU product with `up` over the handed-over norm (`normed`), or the
// residual add handing the next norm over (norm_weight, the sums) over `plain`. Its y, sums,
// int8 blocks and scales.
struct Int8Results {
  std::vector<float> y, sums;
  std::vector<int8_t> qs;
  std::vector<float2> ds;
};
Int8Results run_int8_product(TensorType type, const kernels::KernelConfig& config, bool swiglu,
                             const DeviceArray<uint8_t>& d_w, const Encoded& w,
                             const DeviceArray<uint8_t>& d_up, const float* norm_weight,
                             int64_t rows, const std::vector<float>& y0,
                             const kernels::MatvecInput& plain, const kernels::MatvecInput& normed) {
  DeviceArray<float> y(std::vector<float>(y0.begin(), y0.begin() + rows));
  DeviceArray<float> sums(static_cast<size_t>(rows / 32));
  DeviceArray<int8_t> qs(static_cast<size_t>(rows));
  DeviceArray<float2> ds(static_cast<size_t>(rows / 32));
  kernels::MatvecTask t = split_task(d_w, w, rows, y.get());
  t.y_q8 = {qs.get(), ds.get()};
  if (swiglu) {
    t.weight_up = d_up.get();
  } else {
    t.accumulate = true;
    t.norm_weight = norm_weight;
    t.sum_squares = sums.get();
  }
  EXPECT_EQ(kernels::launch_matvec(static_cast<uint32_t>(type), &t, 1, swiglu ? normed : plain,
                                   config, nullptr),
            cudaSuccess);
  return {y.download(), swiglu ? std::vector<float>{} : sums.download(), qs.download(),
          ds.download()};
}

void expect_same_int8_results(const Int8Results& a, const Int8Results& b, const std::string& what) {
  EXPECT_EQ(a.y, b.y) << what << ": y";
  EXPECT_EQ(a.sums, b.sums) << what << ": sums";
  EXPECT_EQ(a.qs, b.qs) << what << ": int8 blocks";
  ASSERT_EQ(a.ds.size(), b.ds.size());
  for (size_t i = 0; i < a.ds.size(); ++i)
    ASSERT_TRUE(a.ds[i].x == b.ds[i].x && a.ds[i].y == b.ds[i].y)
        << what << ": scales of block " << i;
}

// The rows [0, rows) of an Int8Results of more rows.
Int8Results first_rows(Int8Results r, int64_t rows) {
  r.y.resize(static_cast<size_t>(rows));
  if (!r.sums.empty()) r.sums.resize(static_cast<size_t>(rows / 32));
  r.qs.resize(static_cast<size_t>(rows));
  r.ds.resize(static_cast<size_t>(rows / 32));
  return r;
}

// Runs `tasks` (y of n_out rows each) over the batch-1 input x, and again with x as the last
// column of a three-column launch, whose column groups are 2 + 1: the group of one takes the
// block kernel (split_matvec_kernel), which batch 1 takes only for RoPE or int8 results. A
// lane adds its sub-blocks in the same order in both, so every result must be the same to the
// bit. y0: each task's starting y (the residual the accumulating ones add to).
void expect_batch1_matches_block_kernel(TensorType type, std::vector<kernels::MatvecTask> tasks,
                                        const std::vector<std::vector<float>>& y0,
                                        const std::vector<float>& x, std::mt19937& rng,
                                        const kernels::KernelConfig& config,
                                        const std::string& what) {
  const int64_t cols = static_cast<int64_t>(x.size());
  std::vector<float> x3 = gpu_test::random_floats(static_cast<size_t>(2 * cols), rng);
  x3.insert(x3.end(), x.begin(), x.end());
  DeviceActivations one(x, 1, cols), three(x3, 3, cols);
  CUDA_OK(one.quantize(config));
  CUDA_OK(three.quantize(config));
  std::vector<DeviceArray<float>> y1, y3;
  for (size_t m = 0; m < tasks.size(); ++m) {
    std::vector<float> tail(2 * y0[m].size(), 0.0f);
    tail.insert(tail.end(), y0[m].begin(), y0[m].end());
    y1.emplace_back(y0[m]);
    y3.emplace_back(tail);
  }
  const int n = static_cast<int>(tasks.size());
  for (int m = 0; m < n; ++m) tasks[m].y = y1[m].get();
  CUDA_OK(kernels::launch_matvec(static_cast<uint32_t>(type), tasks.data(), n, one.in, config,
                                 nullptr));
  for (int m = 0; m < n; ++m) tasks[m].y = y3[m].get();
  CUDA_OK(kernels::launch_matvec(static_cast<uint32_t>(type), tasks.data(), n, three.in, config,
                                 nullptr));
  for (int m = 0; m < n; ++m) {
    const std::vector<float> batch3 = y3[m].download();
    EXPECT_EQ(
        y1[m].download(),
        std::vector<float>(batch3.end() - static_cast<std::ptrdiff_t>(y0[m].size()), batch3.end()))
        << what << ", task " << m;
  }
}

// A batch-1 product over a handed-over norm is the plain product times rsqrt(Σ sums / n +
// eps): `rows` rows of a Q4_0 matrix `cols` wide, random sums.
void expect_norm_scale(int64_t cols, int64_t rows, std::mt19937& rng,
                       const kernels::KernelConfig& config) {
  const NormedActivations input(cols, rng, config);
  double total = 0;
  for (const float v : input.sums.download()) total += v;
  const double want_scale = 1.0 / std::sqrt(total / cols + 1e-5);
  const Encoded w = encode(TensorType::Q4_0, rows, cols, rng, true);
  DeviceArray<uint8_t> d_w(w.device_bytes);
  DeviceArray<float> plain_y(static_cast<size_t>(rows)), normed_y(static_cast<size_t>(rows));
  kernels::MatvecTask t = split_task(d_w, w, rows, plain_y.get());
  CUDA_OK(kernels::launch_matvec(static_cast<uint32_t>(TensorType::Q4_0), &t, 1, input.act.in,
                                 config, nullptr));
  t.y = normed_y.get();
  CUDA_OK(kernels::launch_matvec(static_cast<uint32_t>(TensorType::Q4_0), &t, 1, input.normed,
                                 config, nullptr));
  const std::vector<float> p = plain_y.download(), q = normed_y.download();
  for (int64_t r = 0; r < rows; ++r)
    ASSERT_NEAR(q[r], p[r] * want_scale, 2e-5 * std::fabs(p[r] * want_scale) + 1e-12)
        << cols << " wide, row " << r;
}

// Batch 1 of plain split products in warps that stay: 2,560 wide (80 sub-blocks) in
// split_rows_kernel, rows at most two 32-lane steps wide (576 to 2,048) in
// split_rows_short_kernel (D rows' weights in flight per warp, the lane's activations read
// once). More rows than the grid has warps, so each warp walks several rows (or rounds of D
// rows, the last one partial). Three tasks end to end, the residual add and the SwiGLU product
// must give the block kernel's sums to the bit; the product over a handed-over norm is the
// plain one times the norm's 1/rms.
TEST(MatvecKernelTasks, Batch1StayingWarpsMatchTheBlockKernelBitwise) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  std::mt19937 rng(29);
  for (const int64_t cols : {2560, 576, 1024, 1536, 2048}) {
    const std::vector<float> x = gpu_test::random_floats(static_cast<size_t>(cols), rng);
    for (TensorType type : kSplitTypes) {
      if (!has_split(type) || cols % tensor_type_info(type).block_elems != 0) continue;
      // The testkit's Q2_K/Q3_K/IQ4_NL/IQ4_XS encoders search scales (1-2 M values/s): two
      // widths and 12,288 rows, still more than the grid's warps, keep them to seconds.
      const bool slow_encoder = type == TensorType::Q2_K || type == TensorType::Q3_K ||
                                type == TensorType::IQ4_NL || type == TensorType::IQ4_XS;
      if (slow_encoder && (cols == 1536 || cols == 2048)) continue;
      const int64_t rows[3] = {slow_encoder ? 12288 : cols > 2048 ? 16384 : 49152, 1000, 77};
      const std::string name =
          std::string(tensor_type_info(type).name) + " " + std::to_string(cols) + " wide";
      std::vector<Encoded> w;
      std::vector<DeviceArray<uint8_t>> d_w;
      for (int64_t r : rows) {
        w.push_back(encode(type, r, cols, rng, true));
        d_w.emplace_back(w.back().device_bytes);
      }
      std::vector<kernels::MatvecTask> plain;
      std::vector<std::vector<float>> zeros;
      for (int m = 0; m < 3; ++m) {
        plain.push_back(split_task(d_w[m], w[m], rows[m], nullptr));
        zeros.emplace_back(static_cast<size_t>(rows[m]), 0.0f);
      }
      expect_batch1_matches_block_kernel(type, plain, zeros, x, rng, config, name + " plain");
      kernels::MatvecTask residual = plain[0];
      residual.accumulate = true;
      const std::vector<float> h0 = gpu_test::random_floats(static_cast<size_t>(rows[0]), rng);
      expect_batch1_matches_block_kernel(type, {residual}, {h0}, x, rng, config,
                                         name + " residual add");
      kernels::MatvecTask swiglu = plain[1];
      swiglu.weight_up = d_w[0].get();  // the first task's first rows as the up matrix
      expect_batch1_matches_block_kernel(type, {swiglu}, {zeros[1]}, x, rng, config,
                                         name + " SwiGLU");
    }
    expect_norm_scale(cols, 1000, rng, config);
  }
  expect_norm_scale(8192, 64, rng, config);  // 256 sums, 8 per lane
}

// Batch-1 products with int8 results (the fusion's hand-overs) over more 32-row blocks than
// the SMs hold 32-warp blocks take blocks of 8 warps that each own a 32-row block (Q4_0 and
// Q4_1; matvec_owns_row_blocks): their first 1,024 rows must be the 32-warp blocks' own
// results of a 1,024-row launch to the bit. The SwiGLU product quantised over a handed-over
// norm (whose 1/rms the 32-warp blocks reduce after their dot products and the owner blocks
// before, in the same order), and the residual add handing the next norm over; 256 to 4,096
// wide.
TEST(MatvecKernelTasks, Batch1OwnerBlocksMatchThe32WarpBlocksBitwise) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  int device = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  constexpr int64_t kFew = 1024;  // 32 blocks: fewer than any such device's SMs
  const int64_t many = 32 * static_cast<int64_t>(sms + 4);
  std::mt19937 rng(37);
  for (const int64_t cols : {256, 576, 4096}) {
    NormedActivations input(cols, rng, config);
    for (TensorType type : {TensorType::Q4_0, TensorType::Q4_1}) {
      ASSERT_TRUE(kernels::matvec_owns_row_blocks(static_cast<uint32_t>(type)));
      const std::string name =
          std::string(tensor_type_info(type).name) + " " + std::to_string(cols) + " wide";
      const Encoded w = encode(type, many, cols, rng, true),
                    up = encode(type, many, cols, rng, true);
      DeviceArray<uint8_t> d_w(w.device_bytes), d_up(up.device_bytes);
      DeviceArray<float> d_norm_weight(gpu_test::random_floats(static_cast<size_t>(many), rng));
      const std::vector<float> h0 = gpu_test::random_floats(static_cast<size_t>(many), rng);
      for (const bool swiglu : {true, false}) {
        auto product = [&](int64_t rows) {
          return run_int8_product(type, config, swiglu, d_w, w, d_up, d_norm_weight.get(), rows, h0,
                                  input.act.in, input.normed);
        };
        expect_same_int8_results(product(kFew), first_rows(product(many), kFew),
                                 name + (swiglu ? " quantised SwiGLU" : " hand-over"));
      }
    }
  }
}

// Launches the hand-over cannot serve are refused: more than one column, rows that do not
// fill whole 32-row blocks, a norm weight without int8 results, GGUF-layout weights.
TEST(MatvecKernelTasks, Batch1NormHandOverRefusesOtherShapes) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  DeviceArray<uint8_t> w(std::vector<uint8_t>(64 * 1024, 0));
  DeviceArray<float> y(std::vector<float>(256, 0.0f)), sums(std::vector<float>(8, 1.0f));
  DeviceArray<int8_t> qs(std::vector<int8_t>(512, 0));
  DeviceArray<float2> ds(std::vector<float2>(16, float2{0, 0}));
  kernels::MatvecTask t;
  t.weight = w.get();
  t.row_bytes = split_row_stride(static_cast<uint32_t>(TensorType::Q4_0), 256);
  t.split_layout = true;
  t.n_out = 64;
  t.y = y.get();
  t.y_stride = 64;
  t.y_q8 = {qs.get(), ds.get()};
  kernels::MatvecInput in;
  in.n_in = 256;
  in.batch = 2;
  in.xq = {qs.get(), ds.get()};
  const auto q4_0 = static_cast<uint32_t>(TensorType::Q4_0);
  EXPECT_EQ(kernels::launch_matvec(q4_0, &t, 1, in, config, nullptr), cudaErrorInvalidValue);
  in.batch = 1;
  t.n_out = 40;
  EXPECT_EQ(kernels::launch_matvec(q4_0, &t, 1, in, config, nullptr), cudaErrorInvalidValue);
  t.n_out = 64;
  t.y_q8 = {};
  t.norm_weight = y.get();
  EXPECT_EQ(kernels::launch_matvec(q4_0, &t, 1, in, config, nullptr), cudaErrorInvalidValue);
  t.norm_weight = nullptr;
  t.split_layout = false;
  in.norm_sum_squares = sums.get();
  EXPECT_EQ(kernels::launch_matvec(q4_0, &t, 1, in, config, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(MatvecKernelTasks, RejectsUnsupportedTypeAndShape) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  kernels::MatvecTask t;
  t.n_out = 4;
  kernels::MatvecInput in;
  in.n_in = 64;
  in.batch = 1;
  EXPECT_EQ(kernels::launch_matvec(16 /* IQ2_XXS */, &t, 1, in, config, nullptr),
            cudaErrorInvalidValue);
  in.n_in = 48;  // not a multiple of 32
  EXPECT_EQ(
      kernels::launch_matvec(static_cast<uint32_t>(TensorType::F32), &t, 1, in, config, nullptr),
      cudaErrorInvalidValue);
  in.n_in = 256;
  t.split_layout = true;  // no split layout for BF16
  EXPECT_EQ(
      kernels::launch_matvec(static_cast<uint32_t>(TensorType::BF16), &t, 1, in, config, nullptr),
      cudaErrorInvalidValue);
}

}  // namespace
}  // namespace granule
