// The grouped expert products on int8 tensor cores (kernels/moe_mma.cu) against the CPU and
// against the grouped dp4a products (kernels/moe.cu) on the same inputs, for every type they
// cover:
//   gate/up  vs act(gate·x + bg, up·x + bu) in double over x rounded through int8 blocks, and vs
//            the dp4a launch, both within the bound moe_kernels_test.cpp holds the dp4a
//            products to (1e-5 of Σ|w·x| per matrix, propagated through the activation);
//   down     vs down·round_through_q8(h, Divide) (+ bd) in double, and vs the dp4a launch;
//   per-pair invariance: tiles of 8 and of 32 pairs give the same bits, and so does a run of
//            only the first rows (its own grouping) for each of its pairs; the dp4a kernels
//            too give the same bits with tiles of 32 (taken in runs of 8) as with tiles of 8;
//   tiled    the tiled kernels (kernels/moe_gemm.cu) with tiles of 8 and 32 pairs: the bits
//            of the tensor-core products above, gate/up (with and without h's int8 blocks) and
//            down;
// with routing that is uneven (a skewed choice, one expert routed no pair; one expert with every
// pair; 128 experts with one pair each; a shared expert's one-expert table), runs of 8 to 600
// pairs, and experts read through pointer tables of which the odd ones point into mapped pinned
// host memory (the tiled kernels: device memory, and mapped host memory in a test of its own, the
// file's last). Without a GPU: every type's fragments (moe_mma_frag.cuh: the int8 words each lane
// of an mma quad builds, and their scales) against dequantize_row.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>

#include "backends/cpu/moe_ffn.h"
#include "backends/cpu/ops.h"
#include "gpu_test_support.h"
#include "granule/quant.h"
#include "granule/tensor_type.h"
#include "kernel_test_inputs.h"
#include "moe.cuh"
#include "moe_gemm_stage.h"
#include "moe_mma_frag.cuh"
#include "moe_test_experts.h"
#include "quantize_activations.cuh"

namespace granule {
namespace {

namespace k = kernels;
using gpu_test::DeviceArray;
using gpu_test::encode;
using gpu_test::Encoded;

constexpr TensorType kMmaTypes[] = {TensorType::Q4_0,   TensorType::Q4_1,   TensorType::Q8_0,
                                    TensorType::Q4_K,   TensorType::Q5_K,   TensorType::Q6_K,
                                    TensorType::IQ4_NL, TensorType::IQ4_XS, TensorType::MXFP4};

// f(std::integral_constant<uint32_t, TYPE>{}) for the mma type `type`.
template <class F>
void dispatch_mma_type(TensorType type, F&& f) {
  auto one = [&](auto tag) {
    if (static_cast<uint32_t>(type) == decltype(tag)::value) f(tag);
  };
  one(std::integral_constant<uint32_t, 2>{});
  one(std::integral_constant<uint32_t, 3>{});
  one(std::integral_constant<uint32_t, 8>{});
  one(std::integral_constant<uint32_t, 12>{});
  one(std::integral_constant<uint32_t, 13>{});
  one(std::integral_constant<uint32_t, 14>{});
  one(std::integral_constant<uint32_t, 20>{});
  one(std::integral_constant<uint32_t, 23>{});
  one(std::integral_constant<uint32_t, 39>{});
}

bool k_quant(TensorType type) {
  return type == TensorType::Q4_K || type == TensorType::Q5_K || type == TensorType::Q6_K ||
         type == TensorType::IQ4_XS;
}

// `rows` random rows of `cols` elements of `type` as CudaMoe lays them out (Q4_0, Q8_0, IQ4_NL and
// MXFP4 split), row_bytes apart with 16 bytes of slack after them, and the CPU's decoding of them.
struct LaidRows {
  std::vector<uint8_t> bytes;
  int64_t row_bytes;
  int n_sub;  // 32-element sub-blocks a row
  std::vector<float> decoded;
};
LaidRows laid_rows(TensorType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  Encoded e = encode(type, rows, cols, rng);
  return {gpu_test::expert_layout(type, e, rows, cols),
          expert_row_bytes(static_cast<uint32_t>(type), cols), static_cast<int>(cols / 32),
          std::move(e.decoded)};
}

// Every lane's words and scales of every sub-block, from the rows as CudaMoe lays them out,
// against the CPU's decoding. Needs no GPU.
TEST(MoeMmaFragments, MatchDequantize) {
  std::mt19937 rng(11);
  int types = 0;
  for (const TensorType type : kMmaTypes) {
    SCOPED_TRACE(tensor_type_name(static_cast<uint32_t>(type)));
    // 32-element types: 13 blocks, so the last chunk of 4 is partial.
    const int64_t rows = 3, cols = k_quant(type) ? 512 : 416;
    const LaidRows laid = laid_rows(type, rows, cols, rng);
    dispatch_mma_type(type, [&](auto tag) {
      constexpr uint32_t TYPE = decltype(tag)::value;
      using F = k::moe_mma::Frag<TYPE>;
      ++types;
      for (int64_t r = 0; r < rows; ++r)
        for (int first = 0; first < laid.n_sub; first += F::kSubs)
          for (int t = 0; t < 4; ++t) {
            typename F::Raw raw;
            F::load(raw, laid.bytes.data() + r * laid.row_bytes, first, laid.n_sub, t);
            for (int j = 0; j < F::kSubs && first + j < laid.n_sub; ++j) {
              const k::moe_mma::Sub s = F::sub(raw, j);
              for (int hi = 0; hi < 2; ++hi)
                for (int b = 0; b < 4; ++b) {
                  const int q =
                      static_cast<int8_t>(static_cast<uint8_t>((hi ? s.hi : s.lo) >> (8 * b)));
                  const int element = k::moe_mma::element_of<TYPE>(t, hi, b);
                  float got;
                  double size;
                  if constexpr (F::kSplit16) {
                    const int scale = element < 16 ? s.s_lo : s.s_hi;
                    got = s.d * static_cast<float>(scale * q);
                    size = std::fabs(got);
                  } else {
                    got = s.d * static_cast<float>(q) + s.m;
                    size = std::fabs(s.d * q) + std::fabs(s.m);
                  }
                  const float want =
                      laid.decoded[static_cast<size_t>(r * cols + (first + j) * 32 + element)];
                  ASSERT_NEAR(got, want, 1e-6 * size + 1e-30)
                      << "row " << r << " sub-block " << first + j << " lane " << t << " element "
                      << element;
                }
            }
          }
    });
  }
  EXPECT_EQ(types, 9);
}

// The tiled kernels' staging (moe_gemm_stage.h) on the host: every chunk of every row, copied
// segment by segment into a 16-byte aligned slot as the kernels' cp.async copy it, gives each
// lane the sub-blocks (words and scales) the row gives it in memory. Rows start at every
// alignment the rows of a matrix take (Q6_K's 210-byte blocks: 2-byte). Needs no GPU.
TEST(MoeMmaFragments, StagedChunksReadAsTheRow) {
  std::mt19937 rng(12);
  int types = 0;
  for (const TensorType type : kMmaTypes) {
    SCOPED_TRACE(tensor_type_name(static_cast<uint32_t>(type)));
    const int64_t rows = 5, cols = k_quant(type) ? 768 : 416;
    // The laid-out rows at a 16-byte aligned base, with 32 bytes readable past the last (the
    // slack).
    const LaidRows laid = laid_rows(type, rows, cols, rng);
    std::vector<uint8_t> memory(laid.bytes.size() + 64, 0);
    uint8_t* base = memory.data() + (16 - reinterpret_cast<uintptr_t>(memory.data()) % 16) % 16;
    std::memcpy(base, laid.bytes.data(), laid.bytes.size());
    dispatch_mma_type(type, [&](auto tag) {
      constexpr uint32_t TYPE = decltype(tag)::value;
      using F = k::moe_mma::Frag<TYPE>;
      using S = k::moe_gemm::Staged<TYPE>;
      ++types;
      alignas(16) uint8_t slot[S::kSlotBytes];
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* row = base + r * laid.row_bytes;
        for (int first = 0; first < laid.n_sub; first += F::kSubs) {
          const int subs = std::min(F::kSubs, laid.n_sub - first);
          std::memset(slot, 0xA5, sizeof slot);
          for (int seg = 0; seg < S::kSegments; ++seg) {
            const k::moe_gemm::Copy c = S::segment(row, first, subs, laid.n_sub, seg);
            if (c.bytes == 0) continue;
            ASSERT_EQ(reinterpret_cast<uintptr_t>(c.src) % c.bytes, 0u) << "unaligned source";
            ASSERT_EQ(c.to % c.bytes, 0) << "unaligned slot offset";
            ASSERT_LE(c.to + c.bytes, S::kSlotBytes);
            ASSERT_GE(c.src, base);
            ASSERT_LE(c.src + c.bytes, base + laid.bytes.size() + 32);
            std::memcpy(slot + c.to, c.src, static_cast<size_t>(c.bytes));
          }
          const uint8_t* mini = slot + S::mini_row(row, first);
          for (int t = 0; t < 4; ++t) {
            typename F::Raw staged, direct;
            F::load(staged, mini, 0, subs, t);
            F::load(direct, row, first, laid.n_sub, t);
            for (int j = 0; j < subs; ++j) {
              const k::moe_mma::Sub a = F::sub(staged, j), b = F::sub(direct, j);
              ASSERT_TRUE(a.lo == b.lo && a.hi == b.hi && a.s_lo == b.s_lo && a.s_hi == b.s_hi &&
                          std::memcmp(&a.d, &b.d, sizeof a.d) == 0 &&
                          std::memcmp(&a.m, &b.m, sizeof a.m) == 0)
                  << "row " << r << " sub-block " << first + j << " lane " << t;
            }
          }
        }
      }
    });
  }
  EXPECT_EQ(types, 9);
}

using gpu_test::ExpertMatrix;
using gpu_test::Q8Host;
using gpu_test::quantize_host;

// Top-k choices per row, skewed (expert e chosen with weight 1 / (e + 1)), distinct within a
// row, and never expert `unused`.
std::vector<int32_t> skewed_ids(int rows, int n_expert, int n_used, int unused, std::mt19937& rng) {
  std::vector<int32_t> ids;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int r = 0; r < rows; ++r) {
    std::set<int> taken{unused};
    while (static_cast<int>(taken.size()) < n_used + 1) {
      double total = 0.0;
      for (int e = 0; e < n_expert; ++e)
        if (!taken.count(e)) total += 1.0 / (e + 1);
      double pick = u(rng) * total;
      int chosen = -1;
      for (int e = 0; e < n_expert && chosen < 0; ++e) {
        if (taken.count(e)) continue;
        pick -= 1.0 / (e + 1);
        if (pick <= 0.0) chosen = e;
      }
      if (chosen < 0)  // rounding at the end of the range: the last free expert
        for (int e = n_expert - 1; e >= 0 && chosen < 0; --e)
          if (!taken.count(e)) chosen = e;
      taken.insert(chosen);
      ids.push_back(chosen);
    }
  }
  return ids;
}

struct Groups {
  DeviceArray<int32_t> order, n_tiles;
  DeviceArray<k::MoeTile> tiles;
  k::MoeGroups view;
  Groups(const DeviceArray<int32_t>& ids, int pairs, int n_expert, int tile_pairs)
      : order(static_cast<size_t>(pairs)),
        n_tiles(1),
        tiles(static_cast<size_t>(k::moe_max_tiles(pairs, n_expert, tile_pairs))) {
    view = {order.get(), tiles.get(), n_tiles.get(), tile_pairs};
    if (k::launch_moe_group(ids.get(), pairs, n_expert, view, gpu_test::kernel_config(), nullptr) !=
        cudaSuccess)
      throw std::runtime_error("launch_moe_group failed");
  }
};

// How the rows choose their experts: skewed (skewed_ids, one expert never), every row the same
// expert (n_used 1: one expert with every pair, in many tiles), or the pairs spread so that each
// expert gets one (rows · n_used == n_expert).
enum class Routing { Skewed, OneExpert, OnePairEach };

struct MmaCase {
  TensorType gate_up = TensorType::Q4_K, down = TensorType::Q4_K;
  k::MoeActivation act = k::MoeActivation::Swiglu;
  bool biases = false;
  int n_expert = 16, n_used = 8;
  int64_t n_embd = 512, n_ff = 256;
  Routing routing = Routing::Skewed;
  // The tiled kernels read the odd experts from mapped pinned host memory (cp.async from there),
  // as the other kernels always do here; else every expert from the device.
  bool gemm_host = false;
};

std::vector<int32_t> case_ids(const MmaCase& c, int rows, std::mt19937& rng) {
  if (c.routing == Routing::OneExpert)  // expert 5, or the only one
    return std::vector<int32_t>(static_cast<size_t>(rows), std::min(5, c.n_expert - 1));
  if (c.routing == Routing::OnePairEach) {
    std::vector<int32_t> ids(static_cast<size_t>(c.n_expert));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    return ids;
  }
  return skewed_ids(rows, c.n_expert, c.n_used, 3, rng);
}

void run_mma_case(const MmaCase& c, int rows, uint32_t seed) {
  SCOPED_TRACE("rows " + std::to_string(rows) + ", experts " +
               tensor_type_name(static_cast<uint32_t>(c.gate_up)) + "/" +
               tensor_type_name(static_cast<uint32_t>(c.down)));
  std::mt19937 rng(seed);
  const k::KernelConfig config = gpu_test::kernel_config();
  const int n_expert = c.n_expert, K = c.n_used, pairs = rows * K;
  const int64_t E = c.n_embd, F = c.n_ff;
  ExpertMatrix gate(c.gate_up, n_expert, F, E, c.biases, rng);
  ExpertMatrix up(c.gate_up, n_expert, F, E, c.biases, rng);
  ExpertMatrix down(c.down, n_expert, E, F, c.biases, rng);
  const std::vector<int32_t> ids = case_ids(c, rows, rng);
  if (static_cast<int>(ids.size()) != pairs) throw std::runtime_error("routing of another size");
  DeviceArray<int32_t> ids_d(ids);

  const std::vector<float> x = gpu_test::random_floats(static_cast<size_t>(rows * E), rng, 1.0f);
  const Q8Host xq = quantize_host(x, cpu::Q8Rounding::MultiplyByInverse);
  DeviceArray<float> x_d(x);
  DeviceArray<int8_t> xqs_d(xq.qs);
  DeviceArray<float2> xds_d(xq.ds);
  auto input = [&](const k::MoeGroups& groups, int n_pairs) {
    k::MoeInput in;
    in.n_in = static_cast<int>(E);
    in.pairs = n_pairs;
    in.n_used = K;
    in.n_expert = n_expert;
    in.x = x_d.get();
    in.xq = {xqs_d.get(), xds_d.get()};
    in.ids = ids_d.get();
    in.groups = groups;
    return in;
  };
  auto gate_up_mma = [&](const k::MoeInput& in, int n_pairs) {
    DeviceArray<float> h(static_cast<size_t>(n_pairs * F));
    h.poison();
    EXPECT_EQ(k::launch_moe_gate_up_mma(gate.view(), up.view(), c.act, static_cast<int>(F), in,
                                        h.get(), config, nullptr),
              cudaSuccess);
    return h.download();
  };

  // Gate/up: tiles of 8 and of 32, the dp4a launch, the CPU.
  const Groups g8(ids_d, pairs, n_expert, 8), g32(ids_d, pairs, n_expert, 32);
  const std::vector<float> h = gate_up_mma(input(g32.view, pairs), pairs);
  ASSERT_EQ(gate_up_mma(input(g8.view, pairs), pairs), h) << "gate/up: tiles of 8 and 32 differ";
  DeviceArray<float> h_dp4a_d(static_cast<size_t>(pairs * F));
  ASSERT_EQ(k::launch_moe_gate_up(gate.view(), up.view(), c.act, static_cast<int>(F),
                                  input(g8.view, pairs), h_dp4a_d.get(), config, nullptr),
            cudaSuccess);
  const std::vector<float> h_dp4a = h_dp4a_d.download();
  {  // the dp4a kernel takes a tile of 32 in runs of 8: the same bits
    DeviceArray<float> h32(static_cast<size_t>(pairs * F));
    ASSERT_EQ(k::launch_moe_gate_up(gate.view(), up.view(), c.act, static_cast<int>(F),
                                    input(g32.view, pairs), h32.get(), config, nullptr),
              cudaSuccess);
    ASSERT_EQ(h32.download(), h_dp4a) << "dp4a gate/up: tiles of 8 and 32 differ";
  }
  for (int p = 0; p < pairs; ++p) {
    const int r = p / K, e = ids[static_cast<size_t>(p)];
    for (int64_t o = 0; o < F; ++o) {
      double g = gate.bias_of(e, o), u = up.bias_of(e, o), gm = 0.0, um = 0.0;
      for (int64_t i = 0; i < E; ++i) {
        const double xi = xq.values[static_cast<size_t>(r * E + i)];
        g += gate.row(e, o)[i] * xi;
        u += up.row(e, o)[i] * xi;
        gm += std::fabs(gate.row(e, o)[i] * xi);
        um += std::fabs(up.row(e, o)[i] * xi);
      }
      const double bound =
          2.0 * (1e-5 * gm * (std::fabs(u) + 1.0) + 1e-5 * um * (std::fabs(g) + 1.0)) + 1e-6 +
          gpu_test::moe_activation_slack(c.act, g, u);
      const size_t at = static_cast<size_t>(p * F + o);
      ASSERT_NEAR(h[at], gpu_test::moe_activate(c.act, g, u), bound)
          << "pair " << p << " row " << o;
      ASSERT_NEAR(h[at], h_dp4a[at], bound) << "vs dp4a: pair " << p << " row " << o;
    }
  }
  // The tiled kernels, every tile size: the bits of the tensor-core products above,
  // and where they also write h's int8 blocks, launch_quantize_q8's bytes and scales from h.
  std::vector<int8_t> hq_want;
  std::vector<float2> hd_want;
  {
    DeviceArray<float> h_d(h);
    DeviceArray<int8_t> qs(static_cast<size_t>(pairs * F));
    DeviceArray<float2> ds(static_cast<size_t>(pairs * F / 32));
    ASSERT_EQ(k::launch_quantize_q8(h_d.get(), pairs, static_cast<int>(F), {qs.get(), ds.get()},
                                    config, nullptr),
              cudaSuccess);
    hq_want = qs.download();
    hd_want = ds.download();
  }
  for (const int tile : k::kMoeGemmTilePairs)
    for (const bool quantize : {false, true}) {
      const Groups gt(ids_d, pairs, n_expert, tile);
      DeviceArray<float> hg(static_cast<size_t>(pairs * F));
      DeviceArray<int8_t> hq(static_cast<size_t>(pairs * F));
      DeviceArray<float2> hd(static_cast<size_t>(pairs * F / 32));
      hg.poison();
      hq.poison();
      hd.poison();
      const k::ActivationQ8 out =
          quantize ? k::ActivationQ8{hq.get(), hd.get()} : k::ActivationQ8{};
      ASSERT_EQ(k::launch_moe_gate_up_gemm(gate.view(c.gemm_host), up.view(c.gemm_host), c.act,
                                           static_cast<int>(F), input(gt.view, pairs), hg.get(),
                                           out, config, nullptr),
                cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::string what = "tiled gate/up, tiles of " + std::to_string(tile) +
                               (quantize ? ", with h's int8 blocks" : "");
      const std::vector<float> got = hg.download();
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(got[i], h[i]) << what << ": pair " << i / F << " row " << i % F;
      if (!quantize) continue;
      ASSERT_EQ(hq.download(), hq_want) << what << ": int8 blocks";
      const std::vector<float2> ds = hd.download();
      for (size_t b = 0; b < ds.size(); ++b) {
        ASSERT_EQ(ds[b].x, hd_want[b].x) << what << ": block " << b << " d";
        ASSERT_EQ(ds[b].y, hd_want[b].y) << what << ": block " << b << " d · Σ q";
      }
    }
  // The first rows alone (their own grouping): each of their pairs gets the same bits.
  if (rows > 1) {
    const int prefix = (rows + 1) / 2 * K;
    const Groups gp(ids_d, prefix, n_expert, 32);
    const std::vector<float> hp = gate_up_mma(input(gp.view, prefix), prefix);
    ASSERT_TRUE(std::equal(hp.begin(), hp.end(), h.begin()))
        << "gate/up: a pair's result depends on the other pairs of the run";
  }

  // Down over the GPU's h, through int8 blocks (Divide).
  DeviceArray<float> h_d(h);
  DeviceArray<int8_t> hqs_d(static_cast<size_t>(pairs * F));
  DeviceArray<float2> hds_d(static_cast<size_t>(pairs * F / 32));
  ASSERT_EQ(k::launch_quantize_q8(h_d.get(), pairs, static_cast<int>(F), {hqs_d.get(), hds_d.get()},
                                  config, nullptr),
            cudaSuccess);
  std::vector<float> hin = h;
  cpu::round_through_q8(hin.data(), static_cast<int64_t>(hin.size()), cpu::Q8Rounding::Divide);
  auto down_input = [&](const k::MoeGroups& groups) {
    k::MoeInput din = input(groups, pairs);
    din.n_in = static_cast<int>(F);
    din.x = h_d.get();
    din.xq = {hqs_d.get(), hds_d.get()};
    return din;
  };
  auto down_mma = [&](const k::MoeGroups& groups) {
    DeviceArray<float> y(static_cast<size_t>(pairs * E));
    y.poison();
    EXPECT_EQ(k::launch_moe_down_mma(down.view(), static_cast<int>(E), down_input(groups), y.get(),
                                     config, nullptr),
              cudaSuccess);
    return y.download();
  };
  const std::vector<float> y = down_mma(g32.view);
  ASSERT_EQ(down_mma(g8.view), y) << "down: tiles of 8 and 32 differ";
  DeviceArray<float> y_dp4a_d(static_cast<size_t>(pairs * E));
  ASSERT_EQ(k::launch_moe_down(down.view(), static_cast<int>(E), down_input(g8.view),
                               y_dp4a_d.get(), config, nullptr),
            cudaSuccess);
  const std::vector<float> y_dp4a = y_dp4a_d.download();
  {
    DeviceArray<float> y32(static_cast<size_t>(pairs * E));
    ASSERT_EQ(k::launch_moe_down(down.view(), static_cast<int>(E), down_input(g32.view), y32.get(),
                                 config, nullptr),
              cudaSuccess);
    ASSERT_EQ(y32.download(), y_dp4a) << "dp4a down: tiles of 8 and 32 differ";
  }
  for (const int tile : k::kMoeGemmTilePairs) {
    const Groups gt(ids_d, pairs, n_expert, tile);
    DeviceArray<float> yg(static_cast<size_t>(pairs * E));
    yg.poison();
    ASSERT_EQ(k::launch_moe_down_gemm(down.view(c.gemm_host), static_cast<int>(E),
                                      down_input(gt.view), yg.get(), config, nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> got = yg.download();
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], y[i]) << "tiled down, tiles of " << tile << ": pair " << i / E << " row "
                              << i % E;
  }
  for (int p = 0; p < pairs; ++p) {
    const int e = ids[static_cast<size_t>(p)];
    for (int64_t o = 0; o < E; ++o) {
      double ref = down.bias_of(e, o), mag = 0.0;
      for (int64_t i = 0; i < F; ++i) {
        const double t =
            down.row(e, o)[i] * static_cast<double>(hin[static_cast<size_t>(p * F + i)]);
        ref += t;
        mag += std::fabs(t);
      }
      const size_t at = static_cast<size_t>(p * E + o);
      ASSERT_NEAR(y[at], ref, 1e-5 * mag + 1e-6) << "pair " << p << " row " << o;
      ASSERT_NEAR(y[at], y_dp4a[at], 1e-5 * mag + 1e-6) << "vs dp4a: pair " << p << " row " << o;
    }
  }
}

class MoeMmaTypes : public ::testing::TestWithParam<TensorType> {};

// Rows of 8 choices each: 8, 40, 296 and 600 pairs.
TEST_P(MoeMmaTypes, MatchTheCpuAndTheDp4aProducts) {
  GRANULE_REQUIRE_GPU();
  MmaCase c;
  c.gate_up = c.down = GetParam();
  if (!k::moe_mma_supports(static_cast<uint32_t>(c.gate_up)))
    GTEST_SKIP() << "this device or build has no int8 mma.sync";
  if (!k_quant(c.gate_up)) {  // partial chunks of 4 blocks: 13 and 9 blocks per row
    c.n_embd = 416;
    c.n_ff = 288;
  }
  c.biases = c.gate_up == TensorType::Q8_0 || c.gate_up == TensorType::MXFP4;
  if (c.gate_up == TensorType::MXFP4) c.act = k::MoeActivation::SwigluClamped;
  for (const int rows : {1, 5, 37, 75}) {
    run_mma_case(c, rows, 4321u + static_cast<uint32_t>(rows));
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, MoeMmaTypes, ::testing::ValuesIn(kMmaTypes),
                         [](const ::testing::TestParamInfo<TensorType>& info) {
                           std::string name = tensor_type_name(static_cast<uint32_t>(info.param));
                           std::transform(name.begin(), name.end(), name.begin(), ::tolower);
                           return name;
                         });

// A Q4_K_M-like layer (gate/up Q4_K, down Q6_K) at 30B-A3B's routing (top 8 of 128), and
// gpt-oss-20b's (MXFP4, top 4 of 32, biases, clamped SwiGLU) at its hidden size.
TEST(MoeMmaKernels, ModelShapes) {
  GRANULE_REQUIRE_GPU();
  if (!k::moe_mma_supports(static_cast<uint32_t>(TensorType::Q4_K)))
    GTEST_SKIP() << "this device or build has no int8 mma.sync";
  MmaCase q;
  q.gate_up = TensorType::Q4_K;
  q.down = TensorType::Q6_K;
  q.n_expert = 128;
  q.n_used = 8;
  q.n_embd = 512;
  q.n_ff = 256;
  run_mma_case(q, 64, 17u);
  if (HasFatalFailure()) return;
  MmaCase g;
  g.gate_up = g.down = TensorType::MXFP4;
  g.act = k::MoeActivation::SwigluClamped;
  g.biases = true;
  g.n_expert = 32;
  g.n_used = 4;
  g.n_embd = 2880;
  g.n_ff = 256;
  run_mma_case(g, 20, 18u);
  if (HasFatalFailure()) return;
  // Gemma 4 26B-A4B's experts: GeGLU, top 8 of 128 over its hidden size of 2816, the expert
  // width of 704 (not whole Q4_K blocks: down in Q8_0, as its quantised files take it).
  MmaCase m;
  m.gate_up = TensorType::Q4_K;
  m.down = TensorType::Q8_0;
  m.act = k::MoeActivation::Geglu;
  m.n_expert = 128;
  m.n_used = 8;
  m.n_embd = 2816;
  m.n_ff = 704;
  run_mma_case(m, 16, 19u);
}

// GeGLU experts on every type the tensor-core products take (gate/up and down of one type).
TEST(MoeMmaKernels, GegluEveryType) {
  GRANULE_REQUIRE_GPU();
  for (const TensorType type : kMmaTypes) {
    if (!k::moe_mma_supports(static_cast<uint32_t>(type)))
      GTEST_SKIP() << "this device or build has no int8 mma.sync";
    MmaCase c;
    c.gate_up = c.down = type;
    c.act = k::MoeActivation::Geglu;
    if (!k_quant(type)) {
      c.n_embd = 416;
      c.n_ff = 288;
    }
    for (const int rows : {5, 37}) {
      run_mma_case(c, rows, 999u + static_cast<uint32_t>(rows));
      if (HasFatalFailure()) return;
    }
  }
}

// Skewed groupings through the tiled kernels: one expert with every pair (300 pairs: tiles of 8,
// 32 and 64, the last partial) and 128 experts with one pair each, at the 30B shape's types.
TEST(MoeMmaKernels, SkewedGroupings) {
  GRANULE_REQUIRE_GPU();
  if (!k::moe_mma_supports(static_cast<uint32_t>(TensorType::Q4_K)))
    GTEST_SKIP() << "this device or build has no int8 mma.sync";
  MmaCase one;
  one.gate_up = TensorType::Q4_K;
  one.down = TensorType::Q6_K;
  one.n_expert = 8;
  one.n_used = 1;
  one.routing = Routing::OneExpert;
  run_mma_case(one, 300, 31u);
  if (HasFatalFailure()) return;
  MmaCase spread = one;
  spread.n_expert = 128;
  spread.n_used = 8;
  spread.routing = Routing::OnePairEach;
  run_mma_case(spread, 16, 32u);
}

// A shared expert as CudaMoe runs it (qwen35moe's in moe_model_gpu_test's MoeSharedExpertGpu):
// a one-expert table every row chooses (n_expert 1, n_used 1), hidden 256, width 512, at 24
// rows (one partial tile of 32) and 150 (tiles of 32, the last of 22), Q8_0
// (split layout) and Q4_K: the tiled kernels give the tensor-core products' bits at every tile.
TEST(MoeMmaKernels, SharedExpertShapes) {
  GRANULE_REQUIRE_GPU();
  if (!k::moe_mma_supports(static_cast<uint32_t>(TensorType::Q8_0)))
    GTEST_SKIP() << "this device or build has no int8 mma.sync";
  for (const TensorType type : {TensorType::Q8_0, TensorType::Q4_K}) {
    MmaCase c;
    c.gate_up = c.down = type;
    c.n_expert = 1;
    c.n_used = 1;
    c.n_embd = 256;
    c.n_ff = 512;
    c.routing = Routing::OneExpert;
    for (const int rows : {24, 150}) {
      run_mma_case(c, rows, 61u + static_cast<uint32_t>(rows));
      if (HasFatalFailure()) return;
    }
  }
}

TEST(MoeMmaKernels, RefusesWhatTheyDoNotCover) {
  GRANULE_REQUIRE_GPU();
  const k::KernelConfig config = gpu_test::kernel_config();
  EXPECT_FALSE(k::moe_mma_supports(static_cast<uint32_t>(TensorType::Q5_0)));
  EXPECT_FALSE(k::moe_mma_supports(static_cast<uint32_t>(TensorType::F16)));
  DeviceArray<int32_t> order(8), n_tiles(1);
  DeviceArray<k::MoeTile> tiles(8);
  DeviceArray<const void*> table(1);
  DeviceArray<int8_t> qs(64);
  DeviceArray<float2> ds(2);
  k::MoeMatrix m{.table = table.get(),
                 .type = static_cast<uint32_t>(TensorType::Q8_0),
                 .row_bytes = 68,
                 .bias = nullptr};
  k::MoeInput in;
  in.n_in = 64;
  in.pairs = 1;
  in.n_used = 1;
  in.n_expert = 1;
  in.xq = {qs.get(), ds.get()};
  DeviceArray<float> out(64);
  // No groups: the tensor-core products are grouped launches only.
  EXPECT_EQ(k::launch_moe_down_mma(m, 32, in, out.get(), config, nullptr), cudaErrorInvalidValue);
  // A tile size they have no kernel for.
  in.groups = {order.get(), tiles.get(), n_tiles.get(), 16};
  EXPECT_EQ(k::launch_moe_down_mma(m, 32, in, out.get(), config, nullptr), cudaErrorInvalidValue);
  // A type they do not read.
  in.groups.tile_pairs = 8;
  k::MoeMatrix q5 = m;
  q5.type = static_cast<uint32_t>(TensorType::Q5_0);
  EXPECT_EQ(k::launch_moe_down_mma(q5, 32, in, out.get(), config, nullptr), cudaErrorInvalidValue);
  // Gate and up of different types.
  k::MoeMatrix q4 = m;
  q4.type = static_cast<uint32_t>(TensorType::Q4_0);
  EXPECT_EQ(k::launch_moe_gate_up_mma(m, q4, k::MoeActivation::Swiglu, 32, in, out.get(), config,
                                      nullptr),
            cudaErrorInvalidValue);
}

// The tiled kernels over experts of which the odd ones sit in mapped pinned host memory: whether
// cp.async reads them there (CudaMoe takes the tiled kernels only while every expert is in VRAM;
// this says whether it could take them for streamed experts too). Last in the file: a device
// that refuses such copies leaves the context unusable.
TEST(MoeMmaKernels, TiledReadMappedHostMemory) {
  GRANULE_REQUIRE_GPU();
  if (!k::moe_mma_supports(static_cast<uint32_t>(TensorType::Q4_K)))
    GTEST_SKIP() << "this device or build has no int8 mma.sync";
  for (const TensorType type : {TensorType::Q4_K, TensorType::Q6_K, TensorType::MXFP4}) {
    MmaCase c;
    c.gate_up = c.down = type;
    c.gemm_host = true;
    if (type == TensorType::MXFP4) {
      c.n_embd = 416;
      c.n_ff = 288;
    }
    run_mma_case(c, 37, 51u);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace granule
