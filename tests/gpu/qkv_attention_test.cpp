// The fused batch-1 Q/K/V product and attention (kernels/qkv_attention.cu) against the two
// kernels it would replace, on the same inputs: the split Q/K/V product with RoPE and the K/V
// write in its epilogue (launch_matvec), then the split attention kernel (launch_attention).
// The new token's K and V (the same sums, scale, bias and rotation) must agree to f16 rounding,
// the attention output to the float rounding of a different summation order, its int8 blocks
// to half a step; KV outside the new token must stay as it was, and tokens past the length are
// NaN, so a read beyond it shows. SmolLM2's heads (9 / 3, 576 wide) and groups of 1, 2 and 4,
// with and without the handed-over norm and biases, at lengths from 1 to the kernel's limit.
#include "qkv_attention.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention.cuh"
#include "gpu_test_support.h"
#include "granule/tensor_type.h"
#include "kernel_test_inputs.h"
#include "matvec.cuh"
#include "model/weight_split.h"
#include "quantize_activations.cuh"

namespace granule {
namespace {

using gpu_test::DeviceArray;

constexpr uint16_t kPoisonHalf = 0xFFFF;  // NaN
constexpr int kHeadDim = 64, kLayers = 2, kLayer = 1;

struct FusedCase {
  TensorType type;
  int n_in, n_head, n_kv;
  bool norm, bias;
};

class QkvAttentionKernel : public ::testing::TestWithParam<FusedCase> {};

TEST_P(QkvAttentionKernel, MatchesTheProductAndAttentionKernels) {
  GRANULE_REQUIRE_GPU();
  const FusedCase c = GetParam();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  std::mt19937 rng(static_cast<uint32_t>(c.n_in * 7 + c.n_head * 3 + c.n_kv + c.norm + 2 * c.bias));
  const int64_t q_dim = static_cast<int64_t>(c.n_head) * kHeadDim;
  const int64_t kv_dim = static_cast<int64_t>(c.n_kv) * kHeadDim;
  DeviceArray<uint8_t> wq(gpu_test::encode(c.type, q_dim, c.n_in, rng, true).device_bytes);
  DeviceArray<uint8_t> wk(gpu_test::encode(c.type, kv_dim, c.n_in, rng, true).device_bytes);
  DeviceArray<uint8_t> wv(gpu_test::encode(c.type, kv_dim, c.n_in, rng, true).device_bytes);
  const int64_t stride = split_row_stride(static_cast<uint32_t>(c.type), c.n_in);
  const int limit = kernels::qkv_attention_max_tokens(static_cast<uint32_t>(c.type), c.n_in, stride,
                                                      c.n_head, c.n_kv, kHeadDim);
  ASSERT_GT(limit, 64) << "the fused kernel should take these shapes";
  const int max_tokens = std::min(limit, 384);

  // Activations and the handed-over norm's sums; biases; RoPE frequencies (theta 10,000).
  const std::vector<float> x = gpu_test::random_floats(static_cast<size_t>(c.n_in), rng);
  DeviceArray<float> d_x(x);
  DeviceArray<int8_t> d_qs(static_cast<size_t>(c.n_in));
  DeviceArray<float2> d_ds(static_cast<size_t>(c.n_in / 32));
  CUDA_OK(
      kernels::launch_quantize_q8(d_x.get(), 1, c.n_in, {d_qs.get(), d_ds.get()}, config, nullptr));
  std::vector<float> sums(static_cast<size_t>(c.n_in / 32));
  for (float& v : sums) v = 0.25f + std::fabs(gpu_test::random_floats(1, rng)[0]);
  DeviceArray<float> d_sums(sums);
  DeviceArray<float> d_bq(gpu_test::random_floats(static_cast<size_t>(q_dim), rng));
  DeviceArray<float> d_bk(gpu_test::random_floats(static_cast<size_t>(kv_dim), rng));
  DeviceArray<float> d_bv(gpu_test::random_floats(static_cast<size_t>(kv_dim), rng));
  std::vector<double> freq(kHeadDim / 2);
  for (int i = 0; i < kHeadDim / 2; ++i) freq[i] = std::pow(10000.0, -2.0 * i / kHeadDim);
  DeviceArray<double> d_freq(freq);

  const int64_t token_stride = static_cast<int64_t>(kLayers) * 2 * kv_dim;
  for (const int length : {1, 2, 35, 64, 65, 200, max_tokens}) {
    SCOPED_TRACE("length " + std::to_string(length));
    // One slot of max_tokens tokens: tokens before the new one random in both layers, the rest
    // NaN. One copy per path.
    std::vector<uint16_t> kv(static_cast<size_t>(max_tokens * token_stride), kPoisonHalf);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (int64_t i = 0; i < (length - 1) * token_stride; ++i) {
      const __half h = __float2half_rn(dist(rng));
      std::memcpy(&kv[static_cast<size_t>(i)], &h, 2);
    }
    DeviceArray<uint16_t> kv_pair(kv), kv_fused(kv);
    const std::vector<int32_t> positions = {length - 1}, slots = {0}, lengths = {length};
    DeviceArray<int32_t> d_positions(positions), d_slots(slots), d_lengths(lengths);
    std::vector<__half*> base_pair = {reinterpret_cast<__half*>(kv_pair.get())};
    std::vector<__half*> base_fused = {reinterpret_cast<__half*>(kv_fused.get())};
    DeviceArray<__half*> d_base_pair(base_pair), d_base_fused(base_fused);

    kernels::MatvecInput in;
    in.n_in = c.n_in;
    in.batch = 1;
    in.xq = {d_qs.get(), d_ds.get()};
    if (c.norm) {
      in.norm_sum_squares = d_sums.get();
      in.norm_eps = 1e-5f;
    }
    in.rope.positions = d_positions.get();
    in.rope.slots = d_slots.get();
    in.rope.frequencies = d_freq.get();
    in.rope.token_stride = token_stride;
    in.rope.layer = kLayer;
    in.rope.n_kv = c.n_kv;
    in.rope.head_dim = kHeadDim;

    // The pair: Q/K/V with RoPE in the epilogue, then attention.
    DeviceArray<float> d_q(static_cast<size_t>(q_dim)), out_pair(static_cast<size_t>(q_dim));
    DeviceArray<float> d_k(static_cast<size_t>(kv_dim)), d_v(static_cast<size_t>(kv_dim));
    DeviceArray<int8_t> q8_pair(static_cast<size_t>(q_dim));
    DeviceArray<float2> ds_pair(static_cast<size_t>(q_dim / 32));
    {
      kernels::MatvecInput pin = in;
      pin.rope.slot_base = d_base_pair.get();
      kernels::MatvecTask t[3];
      const DeviceArray<uint8_t>* w[3] = {&wq, &wk, &wv};
      const float* biases[3] = {d_bq.get(), d_bk.get(), d_bv.get()};
      for (int m = 0; m < 3; ++m) {
        t[m].weight = w[m]->get();
        t[m].row_bytes = stride;
        t[m].split_layout = true;
        t[m].n_out = static_cast<int>(m == 0 ? q_dim : kv_dim);
        t[m].y = m == 0 ? d_q.get() : m == 1 ? d_k.get() : d_v.get();  // K and V: scratch
        t[m].y_stride = t[m].n_out;
        t[m].rope_part = m + 1;
        t[m].bias = c.bias ? biases[m] : nullptr;
      }
      CUDA_OK(kernels::launch_matvec(static_cast<uint32_t>(c.type), t, 3, pin, config, nullptr));
      gpu_test::SplitAttention split(
          gpu_test::attention_args(d_q.get(), out_pair.get(), 1, c.n_head, c.n_kv, kHeadDim,
                                   d_lengths.get(), d_slots.get(), d_base_pair.get(), token_stride,
                                   kLayer),
          64, max_tokens);  // the engine's decode split size
      kernels::AttentionArgs& a = split.args;
      a.out_q8 = {q8_pair.get(), ds_pair.get()};
      CUDA_OK(kernels::launch_attention(a, config, nullptr));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }

    // The fused kernel.
    DeviceArray<float> out_fused(static_cast<size_t>(q_dim));
    DeviceArray<int8_t> q8_fused(static_cast<size_t>(q_dim));
    DeviceArray<float2> ds_fused(static_cast<size_t>(q_dim / 32));
    out_fused.poison();
    {
      kernels::QkvAttentionArgs f;
      f.wq = wq.get();
      f.wk = wk.get();
      f.wv = wv.get();
      f.row_bytes = stride;
      if (c.bias) {
        f.bq = d_bq.get();
        f.bk = d_bk.get();
        f.bv = d_bv.get();
      }
      f.in = in;
      f.rope = in.rope;
      f.rope.slot_base = d_base_fused.get();
      f.lengths = d_lengths.get();
      f.scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
      f.n_head = c.n_head;
      f.n_kv = c.n_kv;
      f.head_dim = kHeadDim;
      f.out = out_fused.get();
      f.out_q8 = {q8_fused.get(), ds_fused.get()};
      CUDA_OK(kernels::launch_qkv_attention(static_cast<uint32_t>(c.type), f, max_tokens, config,
                                            nullptr));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }

    // The KV: the same everywhere but the new token of this layer, which agrees to f16 rounding.
    const std::vector<uint16_t> a_kv = kv_pair.download(), b_kv = kv_fused.download();
    const int64_t fresh = (length - 1) * token_stride + kLayer * 2 * kv_dim;
    int differing = 0;
    for (int64_t i = 0; i < static_cast<int64_t>(a_kv.size()); ++i) {
      const bool is_new = i >= fresh && i < fresh + 2 * kv_dim;
      if (!is_new) {
        ASSERT_EQ(a_kv[i], b_kv[i]) << "KV outside the new token changed at " << i;
        continue;
      }
      __half ha, hb;
      std::memcpy(&ha, &a_kv[i], 2);
      std::memcpy(&hb, &b_kv[i], 2);
      const float fa = __half2float(ha), fb = __half2float(hb);
      ASSERT_FALSE(std::isnan(fb)) << "the new token's K/V was not written at " << i - fresh;
      ASSERT_NEAR(fb, fa, 2e-3f * (1.0f + std::fabs(fa))) << "new K/V element " << i - fresh;
      differing += a_kv[i] != b_kv[i];
    }
    const std::vector<float> want = out_pair.download(), got = out_fused.download();
    const std::vector<int8_t> qs = q8_fused.download();
    const std::vector<float2> ds = ds_fused.download();
    for (int64_t i = 0; i < q_dim; ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-4f * (1.0f + std::fabs(want[i])))
          << "output " << i << " (head " << i / kHeadDim << ")";
      ASSERT_NEAR(qs[i] * ds[i / 32].x, got[i], 0.5001f * ds[i / 32].x + 1e-7f)
          << "int8 output " << i;
    }
    std::printf(
        "[qkv-attention] %s %d/%d heads, %d wide%s%s, length %d: new K/V bits differ in "
        "%d of %lld\n",
        std::string(tensor_type_info(c.type).name).c_str(), c.n_head, c.n_kv, c.n_in,
        c.norm ? ", norm" : "", c.bias ? ", bias" : "", length, differing,
        static_cast<long long>(2 * kv_dim));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, QkvAttentionKernel,
    ::testing::Values(FusedCase{TensorType::Q4_1, 576, 9, 3, true, false},  // SmolLM2-135M
                      FusedCase{TensorType::Q4_0, 576, 9, 3, false, true},
                      FusedCase{TensorType::Q4_1, 1024, 8, 8, true, true},    // group of 1
                      FusedCase{TensorType::Q4_0, 512, 4, 2, true, false},    // group of 2
                      FusedCase{TensorType::Q4_1, 512, 16, 4, true, false}),  // group of 4
    [](const ::testing::TestParamInfo<FusedCase>& i) {
      return std::string(tensor_type_info(i.param.type).name) + "_" + std::to_string(i.param.n_in) +
             "_h" + std::to_string(i.param.n_head) + "_kv" + std::to_string(i.param.n_kv) +
             (i.param.norm ? "_norm" : "") + (i.param.bias ? "_bias" : "");
    });

// Shapes the kernel does not take are refused before anything is launched.
TEST(QkvAttentionKernelLimits, RefusesOtherShapes) {
  GRANULE_REQUIRE_GPU();
  auto limit = [](TensorType t, int n_in, int n_head, int n_kv, int hd) {
    return kernels::qkv_attention_max_tokens(static_cast<uint32_t>(t), n_in,
                                             split_row_stride(static_cast<uint32_t>(t), n_in),
                                             n_head, n_kv, hd);
  };
  EXPECT_GT(limit(TensorType::Q4_1, 576, 9, 3, 64), 256);   // SmolLM2-135M: at least 256 tokens
  EXPECT_EQ(limit(TensorType::Q8_0, 576, 9, 3, 64), 0);     // type
  EXPECT_EQ(limit(TensorType::Q4_0, 4096, 32, 8, 128), 0);  // head size, width
  EXPECT_EQ(limit(TensorType::Q4_0, 2048, 32, 4, 64), 0);   // wider than 1,024
  EXPECT_EQ(limit(TensorType::Q4_0, 896, 14, 2, 64), 0);    // a group of 7
  kernels::QkvAttentionArgs args;
  args.in.n_in = 576;
  args.in.batch = 1;
  args.row_bytes = split_row_stride(static_cast<uint32_t>(TensorType::Q4_1), 576);
  args.n_head = 9;
  args.n_kv = 3;
  args.head_dim = 64;
  const int max = limit(TensorType::Q4_1, 576, 9, 3, 64);
  EXPECT_EQ(kernels::launch_qkv_attention(static_cast<uint32_t>(TensorType::Q4_1), args, max + 1,
                                          gpu_test::kernel_config(), nullptr),
            cudaErrorInvalidValue);
  args.in.batch = 2;
  EXPECT_EQ(kernels::launch_qkv_attention(static_cast<uint32_t>(TensorType::Q4_1), args, 64,
                                          gpu_test::kernel_config(), nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace granule
