// RoPE + KV write and split attention against CPU references: cpu::rope (with bias and
// Qwen3 QK-norm through cpu::rms_norm, YaRN's magnitude and gpt-oss's output bias added to the
// residual), and attention in double precision over the same f16-rounded K and V, with gpt-oss's
// sliding windows and sink logits. KV outside what a kernel may touch is poisoned with NaN: a
// write out of place or a read past a row's length, behind its window (or in another layer)
// shows up as NaN.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "attention.cuh"
#include "backends/cpu/ops.h"
#include "gpu_test_support.h"
#include "kernel_test_inputs.h"
#include "model/rope.h"
#include "rope_kv.cuh"
#include "sync_probe.cuh"

namespace granule {
namespace {

using gpu_test::DeviceArray;
using gpu_test::kPoisonHalf;
using gpu_test::KvLayout;

struct RopeCase {
  int head_dim;
  bool neox, bias, qk_norm;
  float magnitude = 1.0f;      // YaRN's factor on cos and sin
  bool residual_bias = false;  // gpt-oss's output bias into a residual of width 2880
};

class RopeKvKernel : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RopeKvKernel, RotatesQAndWritesKvWhereTheCpuWould) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  const RopeCase rc = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(rc.head_dim + 2 * rc.neox + 4 * rc.bias + 8 * rc.qk_norm));
  const int n_head = 6, n_kv = 2, hd = rc.head_dim, rows = 5, layer = 1;
  const KvLayout kv{3, n_kv, hd, 5000, 2};
  const std::vector<int32_t> positions = {0, 7, 4095, 3, 4999};
  const std::vector<int32_t> slots = {0, 1, 1, 0, 0};
  const int64_t q_dim = n_head * hd, kv_dim = n_kv * hd;
  const std::vector<float> q = gpu_test::random_floats(rows * q_dim, rng),
                           k = gpu_test::random_floats(rows * kv_dim, rng),
                           v = gpu_test::random_floats(rows * kv_dim, rng);
  const std::vector<float> bq = gpu_test::random_floats(q_dim, rng),
                           bk = gpu_test::random_floats(kv_dim, rng),
                           bv = gpu_test::random_floats(kv_dim, rng);
  const std::vector<float> qn = gpu_test::random_floats(hd, rng),
                           kn = gpu_test::random_floats(hd, rng);
  const std::vector<double> freqs = rope_frequencies(hd, 500000.0f, RopeScaling{}, nullptr);
  const int width = 2880;  // gpt-oss's hidden size (not n_head * head_dim)
  const std::vector<float> residual = gpu_test::random_floats(rows * width, rng),
                           bo = gpu_test::random_floats(width, rng);
  DeviceArray<float> d_residual(residual), d_bo(bo);

  DeviceArray<float> d_q(q), d_k(k), d_v(v), d_bq(bq), d_bk(bk), d_bv(bv), d_qn(qn), d_kn(kn);
  DeviceArray<double> d_freqs(freqs);
  DeviceArray<int32_t> d_pos(positions), d_slots(slots);
  DeviceArray<__half> d_kv(static_cast<size_t>(kv.slots * kv.slot_halves()));
  d_kv.poison();
  std::vector<__half*> bases = {d_kv.get(), d_kv.get() + kv.slot_halves()};
  DeviceArray<__half*> d_bases(bases);

  kernels::RopeKvArgs a;
  a.q = d_q.get();
  a.q_stride = q_dim;
  a.k = d_k.get();
  a.k_stride = kv_dim;
  a.v = d_v.get();
  a.v_stride = kv_dim;
  if (rc.bias) {
    a.q_bias = d_bq.get();
    a.k_bias = d_bk.get();
    a.v_bias = d_bv.get();
  }
  if (rc.qk_norm) {
    a.q_norm = d_qn.get();
    a.k_norm = d_kn.get();
  }
  a.norm_eps = 1e-6f;
  a.frequencies = d_freqs.get();
  a.neox = rc.neox;
  a.n_head = n_head;
  a.n_kv = n_kv;
  a.head_dim = hd;
  a.rows = rows;
  a.positions = d_pos.get();
  a.slots = d_slots.get();
  a.slot_base = d_bases.get();
  a.token_stride = kv.token_stride();
  a.layer = layer;
  a.magnitude = rc.magnitude;
  if (rc.residual_bias) {
    a.residual = d_residual.get();
    a.residual_bias = d_bo.get();
    a.residual_width = width;
    a.residual_stride = width;
  }
  CUDA_OK(kernels::launch_rope_kv(a, config, nullptr));
  const std::vector<float> got_residual = d_residual.download();
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < width; ++i) {
      const float want = residual[r * width + i] + (rc.residual_bias ? bo[i] : 0.0f);
      ASSERT_EQ(got_residual[r * width + i], want) << "residual row " << r << " element " << i;
    }

  const std::vector<float> got_q = d_q.download();
  const std::vector<__half> got_kv = d_kv.download();
  const RopeOrdering ordering = rc.neox ? RopeOrdering::NeoX : RopeOrdering::Normal;
  std::vector<bool> written(got_kv.size(), false);
  for (int r = 0; r < rows; ++r) {
    std::vector<float> eq(q.begin() + r * q_dim, q.begin() + (r + 1) * q_dim);
    std::vector<float> ek(k.begin() + r * kv_dim, k.begin() + (r + 1) * kv_dim);
    std::vector<float> ev(v.begin() + r * kv_dim, v.begin() + (r + 1) * kv_dim);
    if (rc.bias) {
      cpu::add_in_place(eq.data(), bq.data(), q_dim);
      cpu::add_in_place(ek.data(), bk.data(), kv_dim);
      cpu::add_in_place(ev.data(), bv.data(), kv_dim);
    }
    if (rc.qk_norm) {
      for (int h = 0; h < n_head; ++h)
        cpu::rms_norm(eq.data() + h * hd, qn.data(), eq.data() + h * hd, hd, 1e-6f);
      for (int h = 0; h < n_kv; ++h)
        cpu::rms_norm(ek.data() + h * hd, kn.data(), ek.data() + h * hd, hd, 1e-6f);
    }
    cpu::rope(eq.data(), n_head, hd, positions[r], freqs.data(), ordering, rc.magnitude);
    cpu::rope(ek.data(), n_kv, hd, positions[r], freqs.data(), ordering, rc.magnitude);
    for (int64_t i = 0; i < q_dim; ++i)
      ASSERT_NEAR(got_q[r * q_dim + i], eq[i], 2e-5 * (1 + std::fabs(eq[i])))
          << "row " << r << " q " << i;
    for (int h = 0; h < n_kv; ++h) {
      for (int d = 0; d < hd; ++d) {
        const int64_t kat = kv.at(slots[r], positions[r], layer, 0, h) + d,
                      vat = kv.at(slots[r], positions[r], layer, 1, h) + d;
        ASSERT_NEAR(__half2float(got_kv[kat]), ek[h * hd + d],
                    1e-3 * std::fabs(ek[h * hd + d]) + 2e-5)
            << "row " << r << " k";
        ASSERT_NEAR(__half2float(got_kv[vat]), ev[h * hd + d],
                    1e-3 * std::fabs(ev[h * hd + d]) + 2e-5)
            << "row " << r << " v";
        written[kat] = written[vat] = true;
      }
    }
  }
  size_t touched_elsewhere = 0;
  for (size_t i = 0; i < got_kv.size(); ++i)
    if (!written[i] && reinterpret_cast<const uint16_t&>(got_kv[i]) != kPoisonHalf)
      ++touched_elsewhere;
  EXPECT_EQ(touched_elsewhere, 0u) << "KV written outside the rows' (slot, position, layer)";
}

INSTANTIATE_TEST_SUITE_P(
    Variants, RopeKvKernel,
    ::testing::Values(RopeCase{64, false, false, false}, RopeCase{128, false, true, false},
                      RopeCase{128, true, false, true}, RopeCase{64, true, true, true},
                      RopeCase{256, false, false, false},
                      // gpt-oss: NeoX, Q/K/V biases, YaRN 32's magnitude 1 + 0.1 ln 32, output bias
                      RopeCase{64, true, true, false, 1.3465736f, true},
                      RopeCase{128, false, false, false, 0.75f, false}),
    [](const ::testing::TestParamInfo<RopeCase>& i) {
      return "hd" + std::to_string(i.param.head_dim) + (i.param.neox ? "_neox" : "_normal") +
             (i.param.bias ? "_bias" : "") + (i.param.qk_norm ? "_qknorm" : "") +
             (i.param.magnitude != 1.0f ? "_magnitude" : "") +
             (i.param.residual_bias ? "_residual_bias" : "");
    });

struct AttentionCase {
  int head_dim, n_head, n_kv, split_tokens;
  std::vector<int32_t> lengths;
  int capacity = 0;    // tokens the workspace is sized for (max_splits); 0: the longest length
  int window = 0;      // gpt-oss: a sliding layer's window (0: none)
  bool sinks = false;  // gpt-oss: per-head sink logits
};

// Row r's attention for query head h in double precision over the f16-rounded K and V: tokens
// [first, length), and a sink logit in the normaliser where `sink` is not null.
std::vector<double> reference_head(const float* q, const float* k0, const float* v0,
                                   int64_t token_stride, int length, int hd, int first = 0,
                                   const float* sink = nullptr) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> scores(static_cast<size_t>(length)), out(static_cast<size_t>(hd), 0.0);
  double max_score = sink ? static_cast<double>(*sink) : -INFINITY;
  for (int t = first; t < length; ++t) {
    double s = 0.0;
    for (int d = 0; d < hd; ++d) s += static_cast<double>(q[d]) * k0[t * token_stride + d];
    scores[t] = s * scale;
    max_score = std::max(max_score, scores[t]);
  }
  double sum = sink ? std::exp(*sink - max_score) : 0.0;
  for (int t = first; t < length; ++t) sum += scores[t] = std::exp(scores[t] - max_score);
  for (int t = first; t < length; ++t)
    for (int d = 0; d < hd; ++d) out[d] += scores[t] / sum * v0[t * token_stride + d];
  return out;
}

class AttentionKernel : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(AttentionKernel, MatchesCpuAttentionAndReadsOnlyTheLength) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  const AttentionCase c = GetParam();
  const int rows = static_cast<int>(c.lengths.size());
  const int hd = c.head_dim, n_layer = 2, layer = 1;
  int max_len = 0;
  for (int32_t l : c.lengths) max_len = std::max(max_len, l);
  // Each row has its own slot of length + 8 tokens, one after another.
  const int64_t token_stride = static_cast<int64_t>(n_layer) * 2 * c.n_kv * hd;
  std::vector<int64_t> slot_start(static_cast<size_t>(rows) + 1, 0);
  for (int s = 0; s < rows; ++s)
    slot_start[s + 1] = slot_start[s] + (c.lengths[s] + 8) * token_stride;
  auto at = [&](int slot, int token, int which, int head) {
    return slot_start[slot] + token * token_stride +
           (static_cast<int64_t>(layer) * 2 + which) * c.n_kv * hd + head * hd;
  };
  std::mt19937 rng(static_cast<uint32_t>(hd * 31 + c.n_head * 7 + rows + max_len));
  // Only the layer read gets values; other layers, KV past each length and behind its window
  // stay NaN.
  auto first_token = [&](int length) { return c.window > 0 ? std::max(0, length - c.window) : 0; };
  std::vector<uint16_t> kv_bits(static_cast<size_t>(slot_start[rows]), kPoisonHalf);
  std::vector<float> kv_f32(kv_bits.size(), NAN);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int s = 0; s < rows; ++s)
    for (int t = first_token(c.lengths[s]); t < c.lengths[s]; ++t)
      for (int which = 0; which < 2; ++which)
        for (int h = 0; h < c.n_kv; ++h)
          for (int d = 0; d < hd; ++d) {
            const int64_t i = at(s, t, which, h) + d;
            const __half x = __float2half_rn(dist(rng) * 2.0f);
            kv_bits[i] = reinterpret_cast<const uint16_t&>(x);
            kv_f32[i] = __half2float(x);
          }
  const int64_t q_dim = static_cast<int64_t>(c.n_head) * hd;
  const std::vector<float> q = gpu_test::random_floats(static_cast<size_t>(rows * q_dim), rng);
  DeviceArray<uint16_t> d_kv(kv_bits);
  std::vector<__half*> bases;
  for (int s = 0; s < rows; ++s)
    bases.push_back(reinterpret_cast<__half*>(d_kv.get()) + slot_start[s]);
  // Slots in reverse order: a row's slot is not its index.
  std::vector<int32_t> slots(rows);
  std::vector<__half*> slot_bases(static_cast<size_t>(rows));
  for (int r = 0; r < rows; ++r) {
    slots[r] = rows - 1 - r;
    slot_bases[static_cast<size_t>(slots[r])] = bases[static_cast<size_t>(r)];
  }
  DeviceArray<__half*> d_bases(slot_bases);
  DeviceArray<int32_t> d_slots(slots), d_lengths(c.lengths);
  DeviceArray<float> d_q(q), d_out(static_cast<size_t>(rows * q_dim));
  d_out.poison();
  gpu_test::SplitAttention split(
      gpu_test::attention_args(d_q.get(), d_out.get(), rows, c.n_head, c.n_kv, hd, d_lengths.get(),
                               d_slots.get(), d_bases.get(), token_stride, layer),
      c.split_tokens,
      std::max({c.capacity, c.window > 0 ? std::min(max_len, c.window) : max_len, 1}));
  split.partial.poison();
  kernels::AttentionArgs& a = split.args;
  std::vector<float> sinks;
  for (int h = 0; h < c.n_head && c.sinks; ++h) sinks.push_back(2.0f * dist(rng));
  DeviceArray<float> d_sinks(sinks.empty() ? std::vector<float>(1) : sinks);
  a.window = c.window;
  if (c.sinks) a.sinks = d_sinks.get();
  DeviceArray<int8_t> d_qs(static_cast<size_t>(rows * q_dim));
  DeviceArray<float2> d_ds(static_cast<size_t>(rows * q_dim / 32));
  a.out_q8 = {d_qs.get(), d_ds.get()};  // the output also as int8 blocks
  DeviceArray<__half> d_f16(static_cast<size_t>(rows * q_dim));
  a.out_f16 = d_f16.get();  // and as f16 (the f16 tensor-core products' input)
  DeviceArray<int>& d_counters = split.counters;
  CUDA_OK(kernels::launch_attention(a, config, nullptr));
  // A second launch on the same counters (they must be back at zero) gives the same result.
  const std::vector<float> first = d_out.download();
  EXPECT_EQ(d_counters.download(), std::vector<int>(static_cast<size_t>(rows * c.n_kv), 0));
  d_out.poison();
  CUDA_OK(kernels::launch_attention(a, config, nullptr));
  EXPECT_EQ(d_counters.download(), std::vector<int>(static_cast<size_t>(rows * c.n_kv), 0));
  const std::vector<float> got = d_out.download();
  const std::vector<int8_t> qs = d_qs.download();
  const std::vector<float2> ds = d_ds.download();
  const std::vector<__half> f16 = d_f16.download();
  for (size_t i = 0; i < got.size(); ++i) {
    const uint32_t bits = reinterpret_cast<const uint32_t&>(got[i]);
    ASSERT_EQ(bits, reinterpret_cast<const uint32_t&>(first[i]))
        << "second launch differs at " << i;
    if (c.lengths[i / static_cast<size_t>(q_dim)] == 0) {
      ASSERT_EQ(bits, 0xFFFFFFFFu) << "a row of length 0 was written at " << i;
      continue;
    }
    ASSERT_NEAR(qs[i] * ds[i / 32].x, got[i], 0.5001 * ds[i / 32].x + 1e-7) << "int8 output " << i;
    const __half want16 = __float2half_rn(got[i]);
    ASSERT_EQ(std::memcmp(&f16[i], &want16, sizeof(__half)), 0)
        << "f16 output " << i << " is not the f32 output rounded to nearest";
  }

  const int group = c.n_head / c.n_kv;
  for (int r = 0; r < rows; ++r) {
    if (c.lengths[r] == 0) continue;
    for (int h = 0; h < c.n_head; ++h) {
      const float* k0 = kv_f32.data() + at(r, 0, 0, h / group);
      const float* v0 = kv_f32.data() + at(r, 0, 1, h / group);
      const std::vector<double> expected =
          reference_head(q.data() + r * q_dim + h * hd, k0, v0, token_stride, c.lengths[r], hd,
                         first_token(c.lengths[r]), c.sinks ? &sinks[h] : nullptr);
      for (int d = 0; d < hd; ++d)
        ASSERT_NEAR(got[r * q_dim + h * hd + d], expected[d], 2e-5 * (1 + std::fabs(expected[d])))
            << "row " << r << " (length " << c.lengths[r] << ") head " << h << " element " << d;
    }
  }
}

// Lengths around the decode split size (64), long contexts (4097, 8000) and rows of length 0,
// in batches of 1, 8 and 33 rows.
std::vector<int32_t> mixed_lengths(int rows) {
  const std::vector<int32_t> pattern = {8000, 1, 63, 64, 65, 1000, 4097, 0};
  std::vector<int32_t> lengths;
  for (int r = 0; r < rows; ++r)
    lengths.push_back(r < static_cast<int>(pattern.size()) ? pattern[static_cast<size_t>(r)]
                                                           : 1 + (r * 97) % 300);
  return lengths;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionKernel,
    ::testing::Values(
        AttentionCase{64, 9, 3, 128, {1, 5, 130, 257, 64}},     // SmolLM2 heads, several splits
        AttentionCase{128, 32, 8, 128, {700, 1, 129}},          // Llama 3 8B heads
        AttentionCase{128, 8, 8, 1024, {1500, 3, 1024, 1025}},  // no GQA, prefill split size
        AttentionCase{64, 8, 1, 32, {33, 100, 31}},             // group of 8
        AttentionCase{256, 4, 2, 128, {200, 17}},
        AttentionCase{128, 32, 8, 64, {8000}},             // 8B decode at 8k, one row
        AttentionCase{128, 32, 8, 64, mixed_lengths(8)},   // 8B decode, 8 rows
        AttentionCase{128, 32, 8, 64, mixed_lengths(33)},  // 8B decode, 33 rows
        AttentionCase{64, 8, 8, 64, mixed_lengths(8)},     // group of 1
        AttentionCase{64, 16, 4, 64, {4097, 0, 65}},       // group of 4
        AttentionCase{256, 16, 2, 64, mixed_lengths(8)},   // group of 8
        AttentionCase{128, 64, 8, 64, {8000, 65, 0, 1}},   // 70B heads, group of 8
        AttentionCase{128, 6, 1, 64, {4097, 1, 63}},       // group of 6 (padded to 8)
        AttentionCase{256, 6, 2, 64, {1000, 64}},          // group of 3 (padded to 4)
        AttentionCase{64, 32, 8, 1024, {8000, 2000, 1}},   // prefill split size, long row
        // More splits than one merge pass takes (2 x head_dim = 128 at head_dim 64): on 132
        // SMs, 129 splits of 32 tokens for the long row.
        AttentionCase{64, 4, 1, 16, {4097, 300}},
        // max_splits far above what the rows need (a 32k-token workspace)
        AttentionCase{128, 32, 8, 64, {100, 8000, 1}, 32768},
        // gpt-oss: 64 heads of 64 over 8 KV heads (q width 4096), sliding window 128 and sinks
        // (the KV behind each window NaN), decode rows before, at and past the window; the
        // workspace sized for the window as CudaModel does, and for the whole context.
        AttentionCase{64, 64, 8, 64, {1, 127, 128, 129, 200, 8000, 0, 4097}, 128, 128, true},
        AttentionCase{64, 64, 8, 64, mixed_lengths(33), 8000, 128, true},
        AttentionCase{64, 64, 8, 64, {8000, 65, 1}, 0, 0, true},             // sinks, full layer
        AttentionCase{64, 16, 2, 16, {4097, 300, 17}, 1000, 1000, false},    // many splits
        AttentionCase{128, 32, 8, 1024, {1500, 3, 1025}, 1500, 700, true}),  // prefill split size
    [](const ::testing::TestParamInfo<AttentionCase>& i) {
      return "hd" + std::to_string(i.param.head_dim) + "_h" + std::to_string(i.param.n_head) +
             "_kv" + std::to_string(i.param.n_kv) + "_split" +
             std::to_string(i.param.split_tokens) + "_rows" +
             std::to_string(i.param.lengths.size()) + "_cap" + std::to_string(i.param.capacity) +
             (i.param.window > 0 ? "_window" + std::to_string(i.param.window) : "") +
             (i.param.sinks ? "_sinks" : "") + "_" + std::to_string(i.index);
    });

// Decode attention requests the K and V of the tokens earlier steps wrote before its PDL wait, and
// those the step's own kernels write only after it: the output is the same to the bit as over a
// KV written in full beforehand. A late writer
// (launch_late_copy: it lets the next kernel start at once and copies after 50 µs) puts each
// slot's newest tokens in place just before the attention launch; until then they hold NaN, so
// a request for one of them issued before the wait would show up in the output. Two steps:
// decode rows of their own slots (each row's newest token written late), and the four rows of
// one sequence's run (its last four tokens written late, each row seeing up to its own).
struct LateStep {
  std::vector<int32_t> lengths, slots;
  int late_tokens;
};

TEST(AttentionEarlyRequests, TheStepsTokensAreReadAfterTheWait) {
  GRANULE_REQUIRE_GPU();
  const int hd = 64, n_head = 9, n_kv = 3, n_layer = 2, layer = 1, capacity = 512;
  const int64_t token_stride = static_cast<int64_t>(n_layer) * 2 * n_kv * hd;
  const int64_t slot_halves = token_stride * capacity;
  const int64_t q_dim = static_cast<int64_t>(n_head) * hd;
  for (const LateStep& step :
       {LateStep{{35, 1, 448, 64}, {0, 1, 2, 3}, 1}, LateStep{{61, 62, 63, 64}, {0, 0, 0, 0}, 4}}) {
    SCOPED_TRACE("rows of lengths " + std::to_string(step.lengths[0]) + ".." +
                 std::to_string(step.lengths.back()));
    const int rows = static_cast<int>(step.lengths.size());
    const int n_slots = *std::max_element(step.slots.begin(), step.slots.end()) + 1;
    std::vector<int> slot_length(static_cast<size_t>(n_slots), 0);
    for (int r = 0; r < rows; ++r)
      slot_length[step.slots[r]] = std::max(slot_length[step.slots[r]], step.lengths[r]);
    std::mt19937 rng(static_cast<uint32_t>(rows * 131 + step.late_tokens));
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<uint16_t> full(static_cast<size_t>(n_slots * slot_halves), kPoisonHalf);
    for (int s = 0; s < n_slots; ++s)
      for (int64_t i = 0; i < slot_length[s] * token_stride; ++i) {
        const __half x = __float2half_rn(dist(rng) * 2.0f);
        full[static_cast<size_t>(s * slot_halves + i)] = reinterpret_cast<const uint16_t&>(x);
      }
    // Each slot's last late_tokens tokens (all layers: one contiguous range) come late.
    std::vector<uint16_t> early_kv = full;
    std::vector<int64_t> late_at;
    std::vector<DeviceArray<uint16_t>> late_values;
    const int64_t late_halves = step.late_tokens * token_stride;
    for (int s = 0; s < n_slots; ++s) {
      const int64_t at = s * slot_halves + (slot_length[s] - step.late_tokens) * token_stride;
      late_at.push_back(at);
      late_values.emplace_back(
          std::vector<uint16_t>(full.begin() + at, full.begin() + at + late_halves));
      std::fill(early_kv.begin() + at, early_kv.begin() + at + late_halves, kPoisonHalf);
    }
    DeviceArray<uint16_t> d_kv(full);
    std::vector<__half*> bases;
    for (int s = 0; s < n_slots; ++s)
      bases.push_back(reinterpret_cast<__half*>(d_kv.get()) + s * slot_halves);
    DeviceArray<__half*> d_bases(bases);
    DeviceArray<int32_t> d_slots(step.slots), d_lengths(step.lengths);
    DeviceArray<float> d_q(gpu_test::random_floats(static_cast<size_t>(rows * q_dim), rng));
    DeviceArray<float> d_out(static_cast<size_t>(rows * q_dim));
    gpu_test::SplitAttention split(
        gpu_test::attention_args(d_q.get(), d_out.get(), rows, n_head, n_kv, hd, d_lengths.get(),
                                 d_slots.get(), d_bases.get(), token_stride, layer),
        64, capacity);  // the engine's decode split size
    kernels::AttentionArgs& a = split.args;
    DeviceArray<int8_t> d_qs(static_cast<size_t>(rows * q_dim));
    DeviceArray<float2> d_ds(static_cast<size_t>(rows * q_dim / 32));
    a.out_q8 = {d_qs.get(), d_ds.get()};
    DeviceArray<int>& d_counters = split.counters;

    const kernels::KernelConfig config = gpu_test::kernel_config();
    d_out.poison();
    CUDA_OK(kernels::launch_attention(a, config, nullptr));
    const std::vector<float> want = d_out.download();
    const std::vector<int8_t> want_qs = d_qs.download();
    for (size_t i = 0; i < want.size(); ++i) ASSERT_FALSE(std::isnan(want[i])) << i;
    for (int run = 0; run < 2; ++run) {  // twice: the split counters are left at zero
      d_kv.upload(early_kv);
      d_out.poison();
      for (int s = 0; s < n_slots; ++s)
        CUDA_OK(kernels::launch_late_copy(reinterpret_cast<uint16_t*>(d_kv.get()) + late_at[s],
                                          late_values[s].get(), late_halves * 2, 50000, config,
                                          nullptr));
      CUDA_OK(kernels::launch_attention(a, config, nullptr));
      const std::vector<float> got = d_out.download();
      EXPECT_EQ(d_qs.download(), want_qs);
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_EQ(reinterpret_cast<const uint32_t&>(got[i]),
                  reinterpret_cast<const uint32_t&>(want[i]))
            << "row " << i / q_dim << " element " << i % q_dim << ": " << got[i] << " against "
            << want[i];
      EXPECT_EQ(d_counters.download(), std::vector<int>(static_cast<size_t>(rows * n_kv), 0));
    }
  }
}

// Decode rows over KV in the engine's layout where every byte of K and V is 0x3C, so every
// element is the f16 0x3C3C (kValue) and so must every output element be: row r's `length`
// tokens in slot r, its q random (from a fresh std::mt19937(7)), scaled, without splits.
struct UniformKvDecode {
  static constexpr float kValue = 1.05859375f;  // f16 0x3C3C
  int64_t slot_halves;
  DeviceArray<uint16_t> kv;
  DeviceArray<float> q, out;
  DeviceArray<__half*> bases;
  DeviceArray<int32_t> slots, lengths;
  kernels::AttentionArgs args;

  UniformKvDecode(int rows, int length, int n_head, int n_kv, int hd, int64_t token_stride,
                  int layer)
      : slot_halves(token_stride * length),
        kv(static_cast<size_t>(rows * slot_halves)),
        q(random_q(static_cast<size_t>(rows) * n_head * hd)),
        out(static_cast<size_t>(rows) * n_head * hd),
        bases(slot_bases(kv, rows, slot_halves)),
        slots(iota(rows)),
        lengths(std::vector<int32_t>(static_cast<size_t>(rows), length)),
        args(gpu_test::attention_args(q.get(), out.get(), rows, n_head, n_kv, hd, lengths.get(),
                                      slots.get(), bases.get(), token_stride, layer)) {
    if (cudaMemset(kv.get(), 0x3C, kv.size() * 2) != cudaSuccess)
      throw std::runtime_error("cudaMemset failed");
  }

 private:
  static std::vector<float> random_q(size_t n) {
    std::mt19937 rng(7);
    return gpu_test::random_floats(n, rng);
  }
  static std::vector<__half*> slot_bases(const DeviceArray<uint16_t>& kv, int rows,
                                         int64_t slot_halves) {
    std::vector<__half*> bases;
    for (int r = 0; r < rows; ++r)
      bases.push_back(reinterpret_cast<__half*>(kv.get()) + r * slot_halves);
    return bases;
  }
  static std::vector<int32_t> iota(int rows) {
    std::vector<int32_t> v(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) v[static_cast<size_t>(r)] = r;
    return v;
  }
};

// Microseconds per launch of `a` into `us`, over 50 launches after 3 that warm up.
void time_attention(const kernels::AttentionArgs& a, const kernels::KernelConfig& config,
                    double& us) {
  for (int i = 0; i < 3; ++i) CUDA_OK(kernels::launch_attention(a, config, nullptr));
  cudaEvent_t begin, end;
  ASSERT_EQ(cudaEventCreate(&begin), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&end), cudaSuccess);
  const int launches = 50;
  ASSERT_EQ(cudaEventRecord(begin, nullptr), cudaSuccess);
  for (int i = 0; i < launches; ++i) CUDA_OK(kernels::launch_attention(a, config, nullptr));
  ASSERT_EQ(cudaEventRecord(end, nullptr), cudaSuccess);
  ASSERT_EQ(cudaEventSynchronize(end), cudaSuccess);
  float ms = 0.0f;
  ASSERT_EQ(cudaEventElapsedTime(&ms, begin, end), cudaSuccess);
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  us = 1e3 * ms / launches;
}

// Times the 8B decode shapes of issue 15 in the engine's KV layout (32 layers: consecutive
// tokens of one layer are 128 KB apart) and prints µs per launch; every K and V element is the
// same f16 value, so each output element must be exactly that value.
TEST(AttentionKernelTiming, DecodeShapesOf8B) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  const int n_head = 32, n_kv = 8, hd = 128, n_layer = 32, layer = 31, capacity = 8192;
  const int64_t token_stride = static_cast<int64_t>(n_layer) * 2 * n_kv * hd;
  struct Shape {
    int rows, length;
  };
  for (const Shape shape :
       {Shape{1, 8000}, Shape{8, 8000}, Shape{8, 200}, Shape{32, 200}, Shape{1, 64}}) {
    const int rows = shape.rows;
    UniformKvDecode d(rows, shape.length, n_head, n_kv, hd, token_stride, layer);
    gpu_test::SplitAttention split(d.args, 64, capacity);  // the engine's decode split size
    double us = 0;
    ASSERT_NO_FATAL_FAILURE(time_attention(split.args, config, us));
    const double bytes = 2.0 * rows * shape.length * n_kv * hd * 2;
    std::printf("[attention-timing] %2d rows x %5d tokens: %8.2f us per launch, %.2f TB/s of K+V\n",
                rows, shape.length, us, bytes / (us * 1e-6) / 1e12);
    EXPECT_EQ(split.counters.download(), std::vector<int>(static_cast<size_t>(rows * n_kv), 0));
    const std::vector<float> got = d.out.download();
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], UniformKvDecode::kValue, 1e-5f)
          << rows << " rows x " << shape.length << " at " << i;
  }
}

// gpt-oss-20b's decode attention (64 query heads of 64 over 8 KV heads, 24 layers) at 8,000
// tokens of context: a full layer, and a sliding layer of window 128 whose workspace is sized for
// the window as CudaModel does — its time stays that of 128 tokens, whatever the context. Sinks
// of -30 (a negligible share): every output element is still the one K/V value.
TEST(AttentionKernelTiming, DecodeShapesOfGptOss20b) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  const int n_head = 64, n_kv = 8, hd = 64, n_layer = 24, layer = 23, length = 8000;
  const int64_t token_stride = static_cast<int64_t>(n_layer) * 2 * n_kv * hd;
  DeviceArray<float> d_sinks(std::vector<float>(n_head, -30.0f));
  for (const int rows : {1, 32}) {
    for (const int window : {0, 128}) {
      UniformKvDecode d(rows, length, n_head, n_kv, hd, token_stride, layer);
      kernels::AttentionArgs base = d.args;
      base.window = window;
      base.sinks = d_sinks.get();
      gpu_test::SplitAttention split(base, 64, window > 0 ? window : length);
      double us = 0;
      ASSERT_NO_FATAL_FAILURE(time_attention(split.args, config, us));
      const int read = window > 0 ? window : length;
      const double bytes = 2.0 * rows * read * n_kv * hd * 2;
      std::printf(
          "[attention-timing] gpt-oss-20b %2d rows x %5d tokens, %s: %8.2f us per launch, %.2f "
          "TB/s of the K+V read\n",
          rows, length, window > 0 ? "window 128" : "full layer", us, bytes / (us * 1e-6) / 1e12);
      EXPECT_EQ(split.counters.download(), std::vector<int>(static_cast<size_t>(rows * n_kv), 0));
      const std::vector<float> got = d.out.download();
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], UniformKvDecode::kValue, 1e-5f)
            << rows << " rows, window " << window << " at " << i;
    }
  }
}

}  // namespace
}  // namespace granule
