// The mixture-of-experts kernels (kernels/moe.cuh) against CPU loops over the dequantised
// weights, stage by stage, each stage fed the GPU's output of the stage before (so every bound
// is the stage's own f32 summation order, not an inherited routing or rounding flip):
//   router logits   vs Σ w·x in double, within 1e-5 of Σ |w·x|;
//   gating + top-k  vs the contract's math over the GPU's logits: the same experts in the same
//                   order, weights within 1e-6 relative; routing counts = the ids' histogram
//                   over rows whose slot is >= 0;
//   gate/up         vs act(gate·x + bg, up·x + bu) in double over x rounded through int8 blocks
//                   (MultiplyByInverse, as the RMSNorm kernel rounds) for quantised experts, f32
//                   x for F32/F16/BF16, within the propagated 1e-5 bound;
//   down            vs down·round_through_q8(h, Divide) (+ bd) in double over the GPU's h;
//   combine         vs Σ_k w_k·y_k in f32, top-k order, then the residual add: to the bit;
//                   the fused per-pair down + combine launch gives the same bits.
// Small runs (1..7 rows): the fused router + top-k launch gives the two launches' bits, and the
// decode products (gate/up writing h's int8 blocks, down + combine) the per-pair launches' bits,
// also with a row routed twice to one expert.
// Every expert block type, rows 1, 3, 7, 8, 64 and 300 (the per-pair kernels up to 7, the grouped
// ones beyond), every gating kind, the clamped SwiGLU with expert biases, experts read through
// pointer tables of which half point into mapped pinned host memory, and the per-pair and
// grouped launches giving the same bits for every pair. Without a GPU: every quantised type's
// int8 chunks (moe_unpack.cuh, what the kernels' dp4a products read) against dequantize_row.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <utility>

#include "backends/cpu/moe_ffn.h"
#include "backends/cpu/ops.h"
#include "gpu_test_support.h"
#include "granule/quant.h"
#include "granule/tensor_type.h"
#include "kernel_test_inputs.h"
#include "moe.cuh"
#include "moe_test_experts.h"
#include "moe_unpack.cuh"
#include "quant_blocks.cuh"
#include "quantize_activations.cuh"

namespace granule {
namespace {

namespace k = kernels;
using gpu_test::DeviceArray;
using gpu_test::encode;
using gpu_test::Encoded;

using gpu_test::ExpertMatrix;
using gpu_test::Q8Host;
using gpu_test::quantize_host;

// Runs of up to this many rows take the decode products in CudaMoe (its kPerPairMaxRows).
constexpr int kDecodeMaxRows = 7;

struct Case {
  TensorType expert_type = TensorType::Q4_K;
  TensorType down_type = TensorType::Q4_K;
  TensorType router_type = TensorType::F32;
  k::MoeGating gating = k::MoeGating::Softmax;
  k::MoeActivation act = k::MoeActivation::Swiglu;
  bool normalize = true;
  float scale = 1.0f;
  bool biases = false;
  int n_expert = 16, n_used = 4;
  int64_t n_embd = 512, n_ff = 256;
  std::vector<float> expert_scale;  // Gemma 4's per-expert output scale; empty: none
};

// The contract's routing over one row of logits: the CPU reference's own (route_token).
void route_row(const float* l, const Case& c, int32_t* ids, float* w) {
  ExpertConfig moe;
  moe.n_expert = c.n_expert;
  moe.n_expert_used = c.n_used;
  moe.gating = static_cast<ExpertGating>(static_cast<int>(c.gating));
  moe.normalize_weights = c.normalize;
  moe.weights_scale = c.scale;
  std::vector<float> row(l, l + c.n_expert);
  cpu::route_token(moe, row.data(), ids, w);
}

// The whole chain for `rows` rows of one Case, each stage checked against the CPU.
void run_case(const Case& c, int rows, uint32_t seed) {
  SCOPED_TRACE("rows " + std::to_string(rows) + ", experts " +
               tensor_type_name(static_cast<uint32_t>(c.expert_type)) + "/" +
               tensor_type_name(static_cast<uint32_t>(c.down_type)) + ", router " +
               tensor_type_name(static_cast<uint32_t>(c.router_type)) + ", gating " +
               std::to_string(static_cast<int>(c.gating)));
  std::mt19937 rng(seed);
  const k::KernelConfig config = gpu_test::kernel_config();
  const int n_expert = c.n_expert, K = c.n_used, pairs = rows * K;
  const int64_t E = c.n_embd, F = c.n_ff;
  const Encoded router = encode(c.router_type, n_expert, E, rng);
  const std::vector<float> router_bias =
      c.biases ? gpu_test::random_floats(static_cast<size_t>(n_expert), rng, 0.5f)
               : std::vector<float>{};
  ExpertMatrix gate(c.expert_type, n_expert, F, E, c.biases, rng);
  ExpertMatrix up(c.expert_type, n_expert, F, E, c.biases, rng);
  ExpertMatrix down(c.down_type, n_expert, E, F, c.biases, rng);

  // The FFN norm's output: f32 and int8 blocks (MultiplyByInverse).
  const std::vector<float> x = gpu_test::random_floats(static_cast<size_t>(rows * E), rng, 1.0f);
  const Q8Host xq = quantize_host(x, cpu::Q8Rounding::MultiplyByInverse);
  DeviceArray<float> x_d(x);
  DeviceArray<int8_t> xqs_d(xq.qs);
  DeviceArray<float2> xds_d(xq.ds);
  std::vector<int32_t> slots(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) slots[static_cast<size_t>(r)] = r % 5 == 3 ? -1 : r;  // padding
  DeviceArray<int32_t> slots_d(slots);

  // Router.
  DeviceArray<uint8_t> router_d(router.bytes);
  DeviceArray<float> router_bias_d(router_bias.empty() ? std::vector<float>{0.0f} : router_bias);
  DeviceArray<float> logits_d(static_cast<size_t>(rows * n_expert));
  logits_d.poison();
  ASSERT_EQ(k::launch_moe_router(static_cast<uint32_t>(c.router_type), router_d.get(),
                                 router.row_bytes, n_expert, static_cast<int>(E), x_d.get(), rows,
                                 router_bias.empty() ? nullptr : router_bias_d.get(),
                                 logits_d.get(), config, nullptr),
            cudaSuccess);
  const std::vector<float> logits = logits_d.download();
  for (int r = 0; r < rows; ++r)
    for (int e = 0; e < n_expert; ++e) {
      double ref = router_bias.empty() ? 0.0 : router_bias[static_cast<size_t>(e)], mag = 0.0;
      for (int64_t i = 0; i < E; ++i) {
        const double t = static_cast<double>(router.decoded[static_cast<size_t>(e * E + i)]) *
                         x[static_cast<size_t>(r * E + i)];
        ref += t;
        mag += std::fabs(t);
      }
      ASSERT_NEAR(logits[static_cast<size_t>(r * n_expert + e)], ref, 1e-5 * mag + 1e-6)
          << "router row " << r << " expert " << e;
    }

  // Gating and top-k over the GPU's logits.
  DeviceArray<float> expert_scale_d(c.expert_scale.empty() ? std::vector<float>{0.0f}
                                                           : c.expert_scale);
  k::MoeRouting routing{.n_expert = n_expert,
                        .n_used = K,
                        .gating = c.gating,
                        .normalize = c.normalize,
                        .scale = c.scale,
                        .expert_scale = c.expert_scale.empty() ? nullptr : expert_scale_d.get()};
  DeviceArray<int32_t> ids_d(static_cast<size_t>(pairs)), counts_d(static_cast<size_t>(n_expert));
  DeviceArray<float> w_d(static_cast<size_t>(pairs));
  ids_d.poison();
  w_d.poison();
  CUDA_OK(cudaMemset(counts_d.get(), 0, counts_d.size() * sizeof(int32_t)));
  ASSERT_EQ(k::launch_moe_topk(logits_d.get(), rows, routing, ids_d.get(), w_d.get(),
                               counts_d.get(), slots_d.get(), config, nullptr),
            cudaSuccess);
  const std::vector<int32_t> ids = ids_d.download(), counts = counts_d.download();
  const std::vector<float> weights = w_d.download();
  std::vector<int32_t> histogram(static_cast<size_t>(n_expert), 0);
  for (int r = 0; r < rows; ++r) {
    int32_t ref_ids[k::kMoeMaxUsed];
    float ref_w[k::kMoeMaxUsed];
    route_row(logits.data() + static_cast<size_t>(r) * n_expert, c, ref_ids, ref_w);
    // The expert's output scale folded into its weight, as the CPU oracle's emulation does.
    if (!c.expert_scale.empty())
      for (int j = 0; j < K; ++j) ref_w[j] *= c.expert_scale[static_cast<size_t>(ref_ids[j])];
    for (int j = 0; j < K; ++j) {
      const size_t p = static_cast<size_t>(r * K + j);
      ASSERT_EQ(ids[p], ref_ids[j]) << "row " << r << " choice " << j;
      ASSERT_NEAR(weights[p], ref_w[j], 2e-6 * std::fabs(ref_w[j]) + 1e-7)
          << "row " << r << " choice " << j;
      if (slots[static_cast<size_t>(r)] >= 0) ++histogram[static_cast<size_t>(ids[p])];
    }
  }
  EXPECT_EQ(counts, histogram);

  // Router, gating and top-k in one launch: the two launches' bits, the counters (one per group
  // of 8 rows) left zero for the next launch.
  {
    DeviceArray<float> logits2_d(static_cast<size_t>(rows * n_expert));
    DeviceArray<int32_t> ids2_d(static_cast<size_t>(pairs)),
        counts2_d(static_cast<size_t>(n_expert));
    DeviceArray<float> w2_d(static_cast<size_t>(pairs));
    DeviceArray<uint32_t> counter_d(
        std::vector<uint32_t>(static_cast<size_t>(k::moe_route_counters(rows)), 0u));
    logits2_d.poison();
    ids2_d.poison();
    w2_d.poison();
    CUDA_OK(cudaMemset(counts2_d.get(), 0, counts2_d.size() * sizeof(int32_t)));
    for (int launch = 0; launch < 2; ++launch) {  // twice: the counter must come back to zero
      ASSERT_EQ(k::launch_moe_route(static_cast<uint32_t>(c.router_type), router_d.get(),
                                    router.row_bytes, static_cast<int>(E), x_d.get(), rows,
                                    router_bias.empty() ? nullptr : router_bias_d.get(), routing,
                                    logits2_d.get(), ids2_d.get(), w2_d.get(), counts2_d.get(),
                                    slots_d.get(), counter_d.get(), config, nullptr),
                cudaSuccess);
      const std::vector<uint32_t> left = counter_d.download();
      EXPECT_TRUE(std::all_of(left.begin(), left.end(), [](uint32_t v) { return v == 0u; }))
          << "launch " << launch;
    }
    EXPECT_EQ(logits2_d.download(), logits) << "fused route: logits differ";
    EXPECT_EQ(ids2_d.download(), ids) << "fused route: ids differ";
    EXPECT_EQ(w2_d.download(), weights) << "fused route: weights differ";
    std::vector<int32_t> twice = counts;
    for (int32_t& v : twice) v *= 2;
    EXPECT_EQ(counts2_d.download(), twice) << "fused route: counts differ";
  }

  // Grouping (stable by expert) when the run is grouped.
  const bool grouped = rows > 1;
  const int max_tiles = k::moe_max_tiles(pairs, n_expert);
  DeviceArray<int32_t> order_d(static_cast<size_t>(pairs)), n_tiles_d(1);
  DeviceArray<k::MoeTile> tiles_d(static_cast<size_t>(max_tiles));
  const k::MoeGroups groups{order_d.get(), tiles_d.get(), n_tiles_d.get()};
  if (grouped) {
    ASSERT_EQ(k::launch_moe_group(ids_d.get(), pairs, n_expert, groups, config, nullptr),
              cudaSuccess);
    std::vector<int32_t> ref_order(static_cast<size_t>(pairs));
    std::iota(ref_order.begin(), ref_order.end(), 0);
    std::stable_sort(ref_order.begin(), ref_order.end(), [&](int a, int b) {
      return ids[static_cast<size_t>(a)] < ids[static_cast<size_t>(b)];
    });
    ASSERT_EQ(order_d.download(), ref_order);
    const std::vector<k::MoeTile> tiles = tiles_d.download();
    const int n_tiles = n_tiles_d.download()[0];
    ASSERT_LE(n_tiles, max_tiles);
    int covered = 0;
    for (int t = 0; t < n_tiles; ++t) {
      const k::MoeTile& tile = tiles[static_cast<size_t>(t)];
      ASSERT_EQ(tile.first, covered);
      ASSERT_GE(tile.count, 1);
      ASSERT_LE(tile.count, k::kMoeTilePairs);
      for (int i = 0; i < tile.count; ++i)
        ASSERT_EQ(ids[static_cast<size_t>(ref_order[static_cast<size_t>(tile.first + i)])],
                  tile.expert);
      covered += tile.count;
    }
    ASSERT_EQ(covered, pairs);
  }

  // Gate/up with the activation.
  k::MoeInput in;
  in.n_in = static_cast<int>(E);
  in.pairs = pairs;
  in.n_used = K;
  in.n_expert = n_expert;
  in.x = x_d.get();
  in.xq = {xqs_d.get(), xds_d.get()};
  in.ids = ids_d.get();
  if (grouped) in.groups = groups;
  DeviceArray<float> h_d(static_cast<size_t>(pairs * F));
  h_d.poison();
  ASSERT_EQ(k::launch_moe_gate_up(gate.view(), up.view(), c.act, static_cast<int>(F), in, h_d.get(),
                                  config, nullptr),
            cudaSuccess);
  const std::vector<float> h = h_d.download();
  const bool q8_in = k::moe_reads_q8(static_cast<uint32_t>(c.expert_type));
  const std::vector<float>& xin = q8_in ? xq.values : x;
  for (int p = 0; p < pairs; ++p) {
    const int r = p / K, e = ids[static_cast<size_t>(p)];
    for (int64_t o = 0; o < F; ++o) {
      double g = gate.bias.empty() ? 0.0 : gate.bias[static_cast<size_t>(e * F + o)];
      double u = up.bias.empty() ? 0.0 : up.bias[static_cast<size_t>(e * F + o)];
      double gm = 0.0, um = 0.0;
      for (int64_t i = 0; i < E; ++i) {
        const double xi = xin[static_cast<size_t>(r * E + i)];
        g += gate.row(e, o)[i] * xi;
        u += up.row(e, o)[i] * xi;
        gm += std::fabs(gate.row(e, o)[i] * xi);
        um += std::fabs(up.row(e, o)[i] * xi);
      }
      const double ref = gpu_test::moe_activate(c.act, g, u);
      const double bound =
          2.0 * (1e-5 * gm * (std::fabs(u) + 1.0) + 1e-5 * um * (std::fabs(g) + 1.0)) + 1e-6 +
          gpu_test::moe_activation_slack(c.act, g, u);
      ASSERT_NEAR(h[static_cast<size_t>(p * F + o)], ref, bound) << "pair " << p << " row " << o;
    }
  }

  // Down over the GPU's h, rounded through int8 (Divide) where quantised.
  const bool q8_down = k::moe_reads_q8(static_cast<uint32_t>(c.down_type));
  DeviceArray<int8_t> hqs_d(static_cast<size_t>(pairs * F));
  DeviceArray<float2> hds_d(static_cast<size_t>(pairs * F / 32));
  if (q8_down)
    ASSERT_EQ(k::launch_quantize_q8(h_d.get(), pairs, static_cast<int>(F),
                                    {hqs_d.get(), hds_d.get()}, config, nullptr),
              cudaSuccess);
  std::vector<float> hin = h;
  if (q8_down)
    cpu::round_through_q8(hin.data(), static_cast<int64_t>(hin.size()), cpu::Q8Rounding::Divide);
  k::MoeInput din = in;
  din.n_in = static_cast<int>(F);
  din.x = h_d.get();
  din.xq = {hqs_d.get(), hds_d.get()};
  DeviceArray<float> y_d(static_cast<size_t>(pairs * E));
  y_d.poison();
  ASSERT_EQ(k::launch_moe_down(down.view(), static_cast<int>(E), din, y_d.get(), config, nullptr),
            cudaSuccess);
  const std::vector<float> y = y_d.download();
  for (int p = 0; p < pairs; ++p) {
    const int e = ids[static_cast<size_t>(p)];
    for (int64_t o = 0; o < E; ++o) {
      double ref = down.bias.empty() ? 0.0 : down.bias[static_cast<size_t>(e * E + o)], mag = 0.0;
      for (int64_t i = 0; i < F; ++i) {
        const double t =
            down.row(e, o)[i] * static_cast<double>(hin[static_cast<size_t>(p * F + i)]);
        ref += t;
        mag += std::fabs(t);
      }
      ASSERT_NEAR(y[static_cast<size_t>(p * E + o)], ref, 1e-5 * mag + 1e-6)
          << "pair " << p << " row " << o;
    }
  }

  // The per-pair launch gives every pair the grouped launch's bits.
  if (grouped) {
    k::MoeInput single = in;
    single.groups = {};
    DeviceArray<float> h1(static_cast<size_t>(pairs * F)), y1(static_cast<size_t>(pairs * E));
    ASSERT_EQ(k::launch_moe_gate_up(gate.view(), up.view(), c.act, static_cast<int>(F), single,
                                    h1.get(), config, nullptr),
              cudaSuccess);
    k::MoeInput dsingle = din;
    dsingle.groups = {};
    ASSERT_EQ(
        k::launch_moe_down(down.view(), static_cast<int>(E), dsingle, y1.get(), config, nullptr),
        cudaSuccess);
    EXPECT_EQ(h1.download(), h) << "gate/up: per-pair and grouped launches differ";
    EXPECT_EQ(y1.download(), y) << "down: per-pair and grouped launches differ";
  }

  // Combine into the residual: the same f32 operations in the same order.
  const std::vector<float> residual =
      gpu_test::random_floats(static_cast<size_t>(rows * E), rng, 1.0f);
  DeviceArray<float> hidden_d(residual);
  ASSERT_EQ(k::launch_moe_combine(y_d.get(), w_d.get(), rows, K, static_cast<int>(E),
                                  hidden_d.get(), config, nullptr),
            cudaSuccess);
  const std::vector<float> hidden = hidden_d.download();
  // The fused per-pair down + combine: the same bits as the two launches.
  {
    k::MoeInput fused = din;
    fused.groups = {};
    DeviceArray<float> fused_d(residual);
    ASSERT_EQ(k::launch_moe_down_combine(down.view(), static_cast<int>(E), fused, w_d.get(),
                                         fused_d.get(), config, nullptr),
              cudaSuccess);
    EXPECT_EQ(fused_d.download(), hidden) << "fused down + combine differs from down, combine";
  }
  // The decode products (small runs, quantised experts): gate/up's h and its int8 blocks, and
  // down + combine, each to the bit of the launches above.
  if (rows <= kDecodeMaxRows) {
    k::MoeInput single = in;
    single.groups = {};
    if (q8_in) {
      DeviceArray<float> h2_d(static_cast<size_t>(pairs * F));
      DeviceArray<int8_t> hqs2_d(static_cast<size_t>(pairs * F));
      DeviceArray<float2> hds2_d(static_cast<size_t>(pairs * F / 32));
      h2_d.poison();
      ASSERT_EQ(
          k::launch_moe_gate_up_decode(gate.view(), up.view(), c.act, static_cast<int>(F), single,
                                       h2_d.get(), {hqs2_d.get(), hds2_d.get()}, config, nullptr),
          cudaSuccess);
      EXPECT_EQ(h2_d.download(), h) << "gate/up decode differs from the per-pair launch";
      if (q8_down) {
        EXPECT_EQ(hqs2_d.download(), hqs_d.download()) << "gate/up decode: int8 blocks differ";
        const std::vector<float2> a = hds2_d.download(), b = hds_d.download();
        ASSERT_EQ(a.size(), b.size());
        for (size_t i = 0; i < a.size(); ++i)
          ASSERT_TRUE(a[i].x == b[i].x && a[i].y == b[i].y) << "gate/up decode: scales " << i;
      }
    } else {
      EXPECT_EQ(k::launch_moe_gate_up_decode(gate.view(), up.view(), c.act, static_cast<int>(F),
                                             single, h_d.get(), {}, config, nullptr),
                cudaErrorInvalidValue)
          << "F32/F16/BF16 experts stay on the dp4a kernels";
    }
    k::MoeInput dsingle = din;
    dsingle.groups = {};
    DeviceArray<float> fused2_d(residual);
    if (q8_down) {
      ASSERT_EQ(k::launch_moe_down_combine_decode(down.view(), static_cast<int>(E), dsingle,
                                                  w_d.get(), fused2_d.get(), config, nullptr),
                cudaSuccess);
      EXPECT_EQ(fused2_d.download(), hidden) << "down + combine decode differs";
    } else {
      EXPECT_EQ(k::launch_moe_down_combine_decode(down.view(), static_cast<int>(E), dsingle,
                                                  w_d.get(), fused2_d.get(), config, nullptr),
                cudaErrorInvalidValue);
    }
  }
  for (int r = 0; r < rows; ++r)
    for (int64_t o = 0; o < E; ++o) {
      float acc = 0.0f;
      for (int j = 0; j < K; ++j) {
        const size_t p = static_cast<size_t>(r * K + j);
        const float t = weights[p] * y[p * static_cast<size_t>(E) + static_cast<size_t>(o)];
        acc = acc + t;
      }
      const float ref = residual[static_cast<size_t>(r * E + o)] + acc;
      ASSERT_EQ(hidden[static_cast<size_t>(r * E + o)], ref) << "row " << r << " element " << o;
    }
}

// Each chunk of 8 as the kernels unpack it (int8 q, scale, offset) from the rows as CudaMoe lays
// them out (write_expert_rows: Q4_0, Q8_0, IQ4_NL and MXFP4 split, whose rows of 13 blocks here
// end in padding; the others as stored) against the CPU's decoding of the GGUF blocks, and the
// host half conversion against the CPU's F16 decoding. Needs no GPU.
TEST(MoeUnpack, ChunksMatchDequantize) {
  std::vector<uint16_t> halves(65536);
  for (uint32_t i = 0; i < 65536; ++i) halves[i] = static_cast<uint16_t>(i);
  std::vector<float> decoded(65536);
  dequantize_row(TensorType::F16, halves.data(), decoded.data(), 65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    const float got = k::moe_unpack::half_to_float(halves[i]);
    if (std::isnan(decoded[i]))
      EXPECT_TRUE(std::isnan(got)) << i;
    else
      ASSERT_EQ(got, decoded[i]) << "half bits " << i;
  }
  std::mt19937 rng(3);
  int types = 0;
  for (const TensorType type :
       {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1, TensorType::Q8_0,
        TensorType::Q2_K, TensorType::Q3_K, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K,
        TensorType::IQ4_NL, TensorType::IQ4_XS, TensorType::MXFP4}) {
    SCOPED_TRACE(tensor_type_name(static_cast<uint32_t>(type)));
    const int64_t rows = 3, cols = split_layout_fits(static_cast<uint32_t>(type), 416) ? 416 : 512;
    const Encoded e = encode(type, rows, cols, rng);
    const std::vector<uint8_t> laid = gpu_test::expert_layout(type, e, rows, cols);
    const int64_t rb = expert_row_bytes(static_cast<uint32_t>(type), cols);
    k::dispatch_weight_type(static_cast<uint32_t>(type), [&](auto tag) {
      constexpr uint32_t TYPE = decltype(tag)::value;
      if constexpr (TYPE != k::kF32 && TYPE != k::kF16 && TYPE != k::kBF16) {
        ++types;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols / 8; ++c) {
            const k::moe_unpack::Chunk8 ch =
                k::moe_unpack::unpack8<TYPE>(laid.data() + r * rb, static_cast<int>(cols), c);
            for (int i = 0; i < 8; ++i) {
              const int q = static_cast<int8_t>(
                  static_cast<uint8_t>((i < 4 ? ch.lo : ch.hi) >> (8 * (i % 4))));
              const float want = e.decoded[static_cast<size_t>(r * cols + 8 * c + i)];
              const float got = ch.scale * static_cast<float>(q) + ch.offset;
              ASSERT_NEAR(got, want,
                          1e-6 * (std::fabs(ch.scale * q) + std::fabs(ch.offset)) + 1e-30)
                  << "row " << r << " element " << 8 * c + i;
            }
          }
      }
    });
  }
  EXPECT_EQ(types, 13);
}

// The expert layout: the split types' rows 16-byte aligned, holding what the GGUF rows hold
// (dequantize_split_row of each laid-out row equals dequantize_row of the GGUF row), and the
// other types' bytes as stored. Needs no GPU.
TEST(MoeUnpack, ExpertLayoutRoundTrips) {
  std::mt19937 rng(5);
  for (const TensorType type :
       {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q8_0, TensorType::Q4_K, TensorType::Q6_K,
        TensorType::IQ4_NL, TensorType::IQ4_XS, TensorType::MXFP4}) {
    const auto t = static_cast<uint32_t>(type);
    SCOPED_TRACE(tensor_type_name(t));
    EXPECT_EQ(expert_rows_split(t), k::moe_unpack::split_rows(t));
    for (const int64_t cols : {256, 2880, 4096}) {
      if (cols % k::block_elems(t) != 0) continue;
      const int64_t rows = 5;
      const Encoded e = encode(type, rows, cols, rng);
      const std::vector<uint8_t> laid = gpu_test::expert_layout(type, e, rows, cols);
      const int64_t rb = expert_row_bytes(t, cols);
      if (!expert_rows_split(t)) {
        EXPECT_EQ(rb, e.row_bytes);
        EXPECT_EQ(0, std::memcmp(laid.data(), e.bytes.data(), static_cast<size_t>(rows * rb)));
        continue;
      }
      EXPECT_EQ(rb % 16, 0) << cols;
      EXPECT_GE(rb, e.row_bytes) << cols;
      EXPECT_LT(rb, e.row_bytes + 16) << cols;
      std::vector<float> got(static_cast<size_t>(cols));
      for (int64_t r = 0; r < rows; ++r) {
        dequantize_split_row(t, laid.data() + r * rb, cols, got.data());
        for (int64_t i = 0; i < cols; ++i)
          ASSERT_EQ(got[static_cast<size_t>(i)], e.decoded[static_cast<size_t>(r * cols + i)])
              << "cols " << cols << " row " << r << " element " << i;
      }
    }
  }
}

const int kRows[] = {1, 3, 7, 8, 64, 300};

class MoeExpertTypes : public ::testing::TestWithParam<TensorType> {};

TEST_P(MoeExpertTypes, EveryStageMatchesTheCpu) {
  GRANULE_REQUIRE_GPU();
  Case c;
  c.expert_type = c.down_type = GetParam();
  for (const int rows : kRows) {
    run_case(c, rows, 1234u + static_cast<uint32_t>(rows));
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, MoeExpertTypes,
                         ::testing::Values(TensorType::F32, TensorType::F16, TensorType::BF16,
                                           TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0,
                                           TensorType::Q5_1, TensorType::Q8_0, TensorType::Q2_K,
                                           TensorType::Q3_K, TensorType::Q4_K, TensorType::Q5_K,
                                           TensorType::Q6_K, TensorType::IQ4_NL, TensorType::IQ4_XS,
                                           TensorType::MXFP4),
                         [](const ::testing::TestParamInfo<TensorType>& info) {
                           std::string name = tensor_type_name(static_cast<uint32_t>(info.param));
                           std::transform(name.begin(), name.end(), name.begin(), ::tolower);
                           return name;
                         });

TEST(MoeKernels, GatingKinds) {
  GRANULE_REQUIRE_GPU();
  for (const k::MoeGating gating :
       {k::MoeGating::Softmax, k::MoeGating::Sigmoid, k::MoeGating::SoftmaxOfTopK}) {
    Case c;
    c.gating = gating;
    c.normalize = gating != k::MoeGating::SoftmaxOfTopK;
    c.scale = gating == k::MoeGating::Sigmoid ? 2.5f : 1.0f;
    for (const int rows : kRows) {
      run_case(c, rows, 77u + static_cast<uint32_t>(rows));
      if (HasFatalFailure()) return;
    }
  }
}

// gpt-oss's expert block: MXFP4 experts, router bias, expert biases, the clamped SwiGLU,
// softmax over the top 4 of 32.
TEST(MoeKernels, GptOssExperts) {
  GRANULE_REQUIRE_GPU();
  Case c;
  c.expert_type = c.down_type = TensorType::MXFP4;
  c.gating = k::MoeGating::SoftmaxOfTopK;
  c.normalize = false;
  c.act = k::MoeActivation::SwigluClamped;
  c.biases = true;
  c.n_expert = 32;
  c.n_embd = 384;
  c.n_ff = 384;
  for (const int rows : kRows) {
    run_case(c, rows, 9u + static_cast<uint32_t>(rows));
    if (HasFatalFailure()) return;
  }
}

// Gemma 4's experts (26B-A4B: GeGLU, softmax over all experts with the top k renormalised, each
// expert's output scale folded into its weight), quantised and float experts, top 8 of 32: every
// stage against the CPU, every path (per-pair, grouped, decode) to the same bits.
TEST(MoeKernels, GemmaGegluExperts) {
  GRANULE_REQUIRE_GPU();
  for (const auto& [gate_up, down] : {std::pair{TensorType::Q4_K, TensorType::Q8_0},
                                      std::pair{TensorType::Q8_0, TensorType::Q5_K},
                                      std::pair{TensorType::F16, TensorType::F32}}) {
    Case c;
    c.expert_type = gate_up;
    c.down_type = down;
    c.act = k::MoeActivation::Geglu;
    c.n_expert = 32;
    c.n_used = 8;
    c.n_ff = 352;  // as 26B-A4B's 704, not a multiple of 256
    if (down == TensorType::Q5_K) c.n_ff = 512;
    std::mt19937 rng(31);
    std::uniform_real_distribution<float> scale(0.5f, 2.0f);
    for (int e = 0; e < c.n_expert; ++e) c.expert_scale.push_back(scale(rng));
    for (const int rows : kRows) {
      run_case(c, rows, 41u + static_cast<uint32_t>(rows));
      if (HasFatalFailure()) return;
    }
  }
}

// Mixed expert types (a Q4_K_M-like layer: gate/up Q4_K, down Q6_K), routers of each type the
// models carry, top-8 of 128.
TEST(MoeKernels, MixedTypesAndRouters) {
  GRANULE_REQUIRE_GPU();
  for (const TensorType router :
       {TensorType::F32, TensorType::F16, TensorType::BF16, TensorType::Q8_0}) {
    Case c;
    c.expert_type = TensorType::Q4_K;
    c.down_type = TensorType::Q6_K;
    c.router_type = router;
    c.n_expert = 128;
    c.n_used = 8;
    for (const int rows : {1, 7, 64}) {
      run_case(c, rows, 5u + static_cast<uint32_t>(rows));
      if (HasFatalFailure()) return;
    }
  }
}

// The decode products on runs of 1..7 rows where a row chooses one expert twice (the router
// never does, the kernels must not care) and every pair may sit in host memory: the same bits as
// the per-pair dp4a launches (gate/up, quantize_q8, fused down + combine), for layers like the
// models' (Q4_K/Q6_K top-8; gpt-oss's MXFP4 with biases and the clamped SwiGLU over its n_in of
// 2880, whose 360 chunks end inside a warp's pass; Q8_0/Q5_K, Q4_0 and IQ4_NL/Q8_0 top-2), on
// fewer experts, and the widths of qwen3-30b-a3b (2048/768) and gpt-oss-20b (2880/2880) at one
// row; each L2 prefetch variant of the decode launches (none, by 32 and by 128 bytes) gives the
// product's bits.
TEST(MoeKernels, DecodeProductsTakeAnyIds) {
  GRANULE_REQUIRE_GPU();
  struct Shape {
    TensorType gate_type, down_type;
    k::MoeActivation act;
    bool biases;
    int n_expert, n_used;
    int64_t n_embd, n_ff;
    int max_rows = kDecodeMaxRows;
  };
  const Shape shapes[] = {
      // Mixtral-like Q4_0 and IQ4_NL experts in the split layout, rows of 13 blocks (padded).
      {TensorType::Q4_0, TensorType::Q4_0, k::MoeActivation::Swiglu, false, 8, 2, 416, 416},
      {TensorType::IQ4_NL, TensorType::Q8_0, k::MoeActivation::Swiglu, false, 8, 2, 416, 416},
      {TensorType::Q4_K, TensorType::Q6_K, k::MoeActivation::Swiglu, false, 16, 8, 512, 768},
      {TensorType::MXFP4, TensorType::MXFP4, k::MoeActivation::SwigluClamped, true, 8, 4, 2880,
       416},
      {TensorType::Q8_0, TensorType::Q5_K, k::MoeActivation::Swiglu, false, 8, 2, 768, 512},
      {TensorType::Q4_K, TensorType::Q8_0, k::MoeActivation::Geglu, false, 16, 8, 512, 352},
      {TensorType::Q4_K, TensorType::Q6_K, k::MoeActivation::Swiglu, false, 12, 8, 2048, 768, 1},
      {TensorType::MXFP4, TensorType::MXFP4, k::MoeActivation::SwigluClamped, true, 5, 4, 2880,
       2880, 1}};
  const k::KernelConfig config = gpu_test::kernel_config();
  for (const Shape& sh : shapes) {
    SCOPED_TRACE(tensor_type_name(static_cast<uint32_t>(sh.gate_type)));
    std::mt19937 rng(99);
    const int64_t E = sh.n_embd, F = sh.n_ff;
    ExpertMatrix gate(sh.gate_type, sh.n_expert, F, E, sh.biases, rng);
    ExpertMatrix up(sh.gate_type, sh.n_expert, F, E, sh.biases, rng);
    ExpertMatrix down(sh.down_type, sh.n_expert, E, F, sh.biases, rng);
    for (int rows = 1; rows <= sh.max_rows; ++rows) {
      SCOPED_TRACE("rows " + std::to_string(rows));
      const int K = sh.n_used, pairs = rows * K;
      std::vector<int32_t> ids(static_cast<size_t>(pairs));
      for (int p = 0; p < pairs; ++p)
        ids[static_cast<size_t>(p)] = static_cast<int32_t>(rng() % sh.n_expert);
      ids[1] = ids[0];  // row 0 routed twice to one expert
      const std::vector<float> w = gpu_test::random_floats(static_cast<size_t>(pairs), rng, 1.0f);
      const std::vector<float> x =
          gpu_test::random_floats(static_cast<size_t>(rows * E), rng, 1.0f);
      const Q8Host xq = quantize_host(x, cpu::Q8Rounding::MultiplyByInverse);
      DeviceArray<int32_t> ids_d(ids);
      DeviceArray<float> w_d(w), x_d(x);
      DeviceArray<int8_t> xqs_d(xq.qs);
      DeviceArray<float2> xds_d(xq.ds);
      k::MoeInput in;
      in.n_in = static_cast<int>(E);
      in.pairs = pairs;
      in.n_used = K;
      in.n_expert = sh.n_expert;
      in.x = x_d.get();
      in.xq = {xqs_d.get(), xds_d.get()};
      in.ids = ids_d.get();
      // The per-pair dp4a launches.
      DeviceArray<float> h_d(static_cast<size_t>(pairs * F));
      DeviceArray<int8_t> hqs_d(static_cast<size_t>(pairs * F));
      DeviceArray<float2> hds_d(static_cast<size_t>(pairs * F / 32));
      ASSERT_EQ(k::launch_moe_gate_up(gate.view(), up.view(), sh.act, static_cast<int>(F), in,
                                      h_d.get(), config, nullptr),
                cudaSuccess);
      ASSERT_EQ(k::launch_quantize_q8(h_d.get(), pairs, static_cast<int>(F),
                                      {hqs_d.get(), hds_d.get()}, config, nullptr),
                cudaSuccess);
      k::MoeInput din = in;
      din.n_in = static_cast<int>(F);
      din.x = h_d.get();
      din.xq = {hqs_d.get(), hds_d.get()};
      const std::vector<float> residual =
          gpu_test::random_floats(static_cast<size_t>(rows * E), rng, 1.0f);
      DeviceArray<float> hidden_d(residual);
      ASSERT_EQ(k::launch_moe_down_combine(down.view(), static_cast<int>(E), din, w_d.get(),
                                           hidden_d.get(), config, nullptr),
                cudaSuccess);
      // The decode launches.
      DeviceArray<float> h2_d(static_cast<size_t>(pairs * F));
      DeviceArray<int8_t> hqs2_d(static_cast<size_t>(pairs * F));
      DeviceArray<float2> hds2_d(static_cast<size_t>(pairs * F / 32));
      h2_d.poison();
      ASSERT_EQ(
          k::launch_moe_gate_up_decode(gate.view(), up.view(), sh.act, static_cast<int>(F), in,
                                       h2_d.get(), {hqs2_d.get(), hds2_d.get()}, config, nullptr),
          cudaSuccess);
      k::MoeInput din2 = din;
      din2.x = h2_d.get();
      din2.xq = {hqs2_d.get(), hds2_d.get()};
      DeviceArray<float> hidden2_d(residual);
      ASSERT_EQ(k::launch_moe_down_combine_decode(down.view(), static_cast<int>(E), din2, w_d.get(),
                                                  hidden2_d.get(), config, nullptr),
                cudaSuccess);
      const std::vector<float> h = h_d.download();
      ASSERT_EQ(h2_d.download(), h);
      ASSERT_EQ(hqs2_d.download(), hqs_d.download());
      const std::vector<float2> a = hds2_d.download(), b = hds_d.download();
      for (size_t i = 0; i < a.size(); ++i)
        ASSERT_TRUE(a[i].x == b[i].x && a[i].y == b[i].y) << "scales " << i;
      const std::vector<float> hidden = hidden_d.download();
      ASSERT_EQ(hidden2_d.download(), hidden);
      for (const int stride : {0, 128}) {
        SCOPED_TRACE("L2 prefetch stride " + std::to_string(stride));
        h2_d.poison();
        ASSERT_EQ(k::launch_moe_gate_up_decode(gate.view(), up.view(), sh.act, static_cast<int>(F),
                                               in, h2_d.get(), {hqs2_d.get(), hds2_d.get()}, config,
                                               nullptr, stride),
                  cudaSuccess);
        DeviceArray<float> hidden3_d(residual);
        ASSERT_EQ(
            k::launch_moe_down_combine_decode(down.view(), static_cast<int>(E), din2, w_d.get(),
                                              hidden3_d.get(), config, nullptr, stride),
            cudaSuccess);
        ASSERT_EQ(h2_d.download(), h);
        ASSERT_EQ(hqs2_d.download(), hqs_d.download());
        ASSERT_EQ(hidden3_d.download(), hidden);
      }
      // And not only self-consistent: row 0's first output against the CPU over the GPU's h.
      double ref = 0.0, mag = 0.0;
      std::vector<float> hin(h.begin(), h.begin() + K * F);
      cpu::round_through_q8(hin.data(), static_cast<int64_t>(hin.size()), cpu::Q8Rounding::Divide);
      for (int j = 0; j < K; ++j) {
        const int e = ids[static_cast<size_t>(j)];
        double y = down.bias_of(e, 0);
        for (int64_t i = 0; i < F; ++i) {
          const double t =
              down.row(e, 0)[i] * static_cast<double>(hin[static_cast<size_t>(j * F + i)]);
          y += t;
          mag += std::fabs(t * w[static_cast<size_t>(j)]);
        }
        ref += w[static_cast<size_t>(j)] * y;
      }
      EXPECT_NEAR(hidden[0], residual[0] + ref, 1e-5 * mag + 1e-5);
    }
  }
}

// The top-k on both of its paths (gate values in registers up to 256 experts, in shared memory
// past them), each gating, with ties (logits drawn from a few values, -0 beside +0) and k up to
// 8: the CPU reference's choices and weights.
TEST(MoeKernels, TopkOnBothPaths) {
  GRANULE_REQUIRE_GPU();
  const k::KernelConfig config = gpu_test::kernel_config();
  for (const int n_expert : {32, 96, 128, 256, 300}) {
    for (const k::MoeGating gating :
         {k::MoeGating::Softmax, k::MoeGating::Sigmoid, k::MoeGating::SoftmaxOfTopK}) {
      SCOPED_TRACE("experts " + std::to_string(n_expert) + ", gating " +
                   std::to_string(static_cast<int>(gating)));
      Case c;
      c.n_expert = n_expert;
      c.n_used = n_expert >= 128 ? 8 : 4;
      c.gating = gating;
      c.normalize = gating != k::MoeGating::SoftmaxOfTopK;
      constexpr int kRows = 9;
      std::mt19937 rng(static_cast<uint32_t>(n_expert) * 7u + static_cast<uint32_t>(gating));
      std::vector<float> logits(static_cast<size_t>(kRows * n_expert));
      for (size_t i = 0; i < logits.size(); ++i) {
        // Rows 0-2 from five values (many ties), the rest spread out; zeros of both signs.
        const int row = static_cast<int>(i) / n_expert;
        logits[i] = row < 3 ? 0.5f * static_cast<float>(static_cast<int>(rng() % 5) - 2)
                            : gpu_test::random_floats(1, rng, 3.0f)[0];
        if (logits[i] == 0.0f && rng() % 2) logits[i] = -0.0f;
      }
      const int pairs = kRows * c.n_used;
      DeviceArray<float> logits_d(logits), w_d(static_cast<size_t>(pairs));
      DeviceArray<int32_t> ids_d(static_cast<size_t>(pairs));
      ids_d.poison();
      w_d.poison();
      const k::MoeRouting routing{.n_expert = n_expert,
                                  .n_used = c.n_used,
                                  .gating = gating,
                                  .normalize = c.normalize,
                                  .scale = c.scale};
      ASSERT_EQ(k::launch_moe_topk(logits_d.get(), kRows, routing, ids_d.get(), w_d.get(), nullptr,
                                   nullptr, config, nullptr),
                cudaSuccess);
      const std::vector<int32_t> ids = ids_d.download();
      const std::vector<float> weights = w_d.download();
      for (int r = 0; r < kRows; ++r) {
        int32_t ref_ids[k::kMoeMaxUsed];
        float ref_w[k::kMoeMaxUsed];
        route_row(logits.data() + static_cast<size_t>(r) * n_expert, c, ref_ids, ref_w);
        for (int j = 0; j < c.n_used; ++j) {
          const size_t p = static_cast<size_t>(r * c.n_used + j);
          ASSERT_EQ(ids[p], ref_ids[j]) << "row " << r << " choice " << j;
          ASSERT_NEAR(weights[p], ref_w[j], 2e-6 * std::fabs(ref_w[j]) + 1e-7)
              << "row " << r << " choice " << j;
        }
      }
    }
  }
}

TEST(MoeKernels, RefusesWhatTheyDoNotCover) {
  GRANULE_REQUIRE_GPU();
  const k::KernelConfig config = gpu_test::kernel_config();
  k::MoeRouting too_many{.n_expert = k::kMoeMaxExperts + 1, .n_used = 2};
  EXPECT_EQ(
      k::launch_moe_topk(nullptr, 1, too_many, nullptr, nullptr, nullptr, nullptr, config, nullptr),
      cudaErrorInvalidValue);
  k::MoeRouting k_over_n{.n_expert = 4, .n_used = 5};
  EXPECT_EQ(
      k::launch_moe_topk(nullptr, 1, k_over_n, nullptr, nullptr, nullptr, nullptr, config, nullptr),
      cudaErrorInvalidValue);
  k::MoeMatrix bad{.table = nullptr, .type = 99, .row_bytes = 0, .bias = nullptr};
  k::MoeInput in;
  in.n_in = 64;
  in.pairs = 1;
  in.n_used = 1;
  EXPECT_EQ(k::launch_moe_down(bad, 32, in, nullptr, config, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace granule
