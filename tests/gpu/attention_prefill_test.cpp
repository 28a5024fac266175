// The flash-attention prefill kernel (kernels/attention_prefill.cu) against a double-precision
// CPU reference and against the split kernel (attention.cu) on the same f16 KV: head sizes
// 64/128/256, GQA groups 1/4/8, one sequence's prompt of 1..4100 rows, a chunk of a long
// prompt, mixed batches (prompt runs, decode rows, padding) planned by plan_prefill_tiles,
// hand-made tiles with rows of length 0 and arbitrary lengths. KV outside what a tile may read
// is NaN, and the output starts as NaN bytes: a read past a tile's longest row or a write to a
// row outside the tiles (or of length 0) shows. gpt-oss's attention: sliding windows (KV behind
// every row's window is NaN too, so a read of it shows) and per-head sink logits, in tiles that
// straddle a window's start. Then the engine's prefill logits on a synthetic model with
// GRANULE_FLASH_PREFILL's knob on and off.
//
// The bound, derived: Q is rounded to f16 once (relative error <= 2^-11), so a score s moves
// by ~2^-12·|s| (rms); P is rounded to f16 (<= 2^-11 relative per weight); the output, a
// convex combination of V rows, moves by at most ~(|Δs| + 2^-11)·max|V| where weights shift.
// With scores of a few units that is ~1e-3·max|V| in the worst element and ~2e-4 typically;
// the bound is 2e-3·max|V| for every element, against the reference and the split kernel.
#include "attention_prefill.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "attention.cuh"
#include "backends/backend.h"
#include "gpu_test_support.h"
#include "granule/gguf.h"
#include "granule/model_config.h"
#include "granule/testkit/synthetic_model.h"
#include "kernel_test_inputs.h"
#include "memory/kv_space.h"
#include "memory/memory_manager.h"
#include "runtime/runtime.h"

namespace granule {
namespace {

using gpu_test::DeviceArray;
using gpu_test::kPoisonHalf;
using gpu_test::KvLayout;
using kernels::PrefillTile;

constexpr double kBound = 2e-3;  // of max|V|, per element

struct Shape {
  int head_dim, n_head, n_kv;
};

// gpt-oss's attention options: a sliding window (0: none) and per-head sink logits.
struct Gpt {
  int window = 0;
  bool sinks = false;
};

// Rows of one launch: each row's slot and length (0: padding, slot ignored).
struct Batch {
  std::vector<int32_t> slots, lengths;
  void add_run(int32_t slot, int32_t first_length, int count) {
    for (int i = 0; i < count; ++i) {
      slots.push_back(slot);
      lengths.push_back(first_length + i);
    }
  }
  void add(int32_t slot, int32_t length) {
    slots.push_back(slot);
    lengths.push_back(length);
  }
  int rows() const { return static_cast<int>(lengths.size()); }
};

bool is_poison(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits == 0xFFFFFFFFu;
}

// The KV, Q and the kernels' inputs on the device for one batch and shape. Each slot holds
// random f16 K and V for tokens [0, its rows' longest length) of layer `kLayer`; everything
// else (other tokens, the other layer) is NaN.
class Problem {
 public:
  static constexpr int kLayer = 1;

  Problem(const Shape& shape, Batch batch, float q_sigma, uint32_t seed, Gpt gpt = {})
      : shape_(shape), batch_(std::move(batch)), gpt_(gpt) {
    std::mt19937 rng(seed);
    int n_slots = 1;
    for (int r = 0; r < batch_.rows(); ++r)
      if (batch_.lengths[r] > 0) n_slots = std::max(n_slots, batch_.slots[r] + 1);
    filled_.assign(static_cast<size_t>(n_slots), 0);
    for (int r = 0; r < batch_.rows(); ++r)
      if (batch_.lengths[r] > 0)
        filled_[batch_.slots[r]] = std::max(filled_[batch_.slots[r]], batch_.lengths[r]);
    const int longest = *std::max_element(filled_.begin(), filled_.end());
    // On a sliding layer, tokens before every row's window stay NaN (never read).
    std::vector<int32_t> behind(static_cast<size_t>(n_slots), gpt_.window > 0 ? INT32_MAX : 0);
    if (gpt_.window > 0)
      for (int r = 0; r < batch_.rows(); ++r)
        if (batch_.lengths[r] > 0)
          behind[batch_.slots[r]] =
              std::min(behind[batch_.slots[r]], first_token(batch_.lengths[r]));
    // 16 tokens of NaN past the longest filled prefix (the kernel reads whole 64-token tiles).
    kv_ = KvLayout{2, shape.n_kv, shape.head_dim, longest + 16, n_slots};
    std::vector<uint16_t> bits(static_cast<size_t>(kv_.slots * kv_.slot_halves()), kPoisonHalf);
    kv_f32_.assign(bits.size(), NAN);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (int s = 0; s < n_slots; ++s)
      for (int t = 0; t < filled_[s]; ++t)
        for (int which = 0; which < 2; ++which)
          for (int h = 0; h < shape.n_kv; ++h)
            for (int d = 0; d < shape.head_dim; ++d) {
              const int64_t at = kv_.at(s, t, kLayer, which, h) + d;
              if (t < behind[s]) {  // NaN, but the generator advances as without a window
                dist(rng);
                continue;
              }
              const __half x = __float2half_rn(dist(rng));
              std::memcpy(&bits[at], &x, sizeof(uint16_t));
              kv_f32_[at] = __half2float(x);
              if (which == 1) max_abs_v_ = std::max(max_abs_v_, std::fabs(double(kv_f32_[at])));
            }
    // Each (slot, KV head)'s K and V rows also contiguous, for a cache-friendly reference.
    contiguous_.resize(static_cast<size_t>(n_slots * shape.n_kv));
    for (int s = 0; s < n_slots; ++s)
      for (int h = 0; h < shape.n_kv; ++h)
        for (int which = 0; which < 2; ++which) {
          std::vector<float>& c = contiguous_[s * shape.n_kv + h][which];
          c.resize(static_cast<size_t>(filled_[s]) * shape.head_dim);
          for (int t = 0; t < filled_[s]; ++t)
            std::copy_n(kv_f32_.data() + kv_.at(s, t, kLayer, which, h), shape.head_dim,
                        c.data() + static_cast<size_t>(t) * shape.head_dim);
        }
    q_ = gpu_test::random_floats(static_cast<size_t>(batch_.rows()) * q_dim(), rng, q_sigma);
    if (gpt_.sinks) {  // logits around the scores' range: some rows' sinks dominate
      std::normal_distribution<float> sink(0.0f, 2.0f);
      for (int h = 0; h < shape.n_head; ++h) sinks_.push_back(sink(rng));
      d_sinks_.emplace(sinks_);
    }
    d_kv_.emplace(bits);
    std::vector<__half*> bases;
    for (int s = 0; s < n_slots; ++s)
      bases.push_back(reinterpret_cast<__half*>(d_kv_->get()) + s * kv_.slot_halves());
    d_bases_.emplace(bases);
    std::vector<int32_t> slots = batch_.slots;
    for (int32_t& s : slots) s = std::max(s, 0);  // padding rows: any slot, never read
    d_slots_.emplace(slots);
    d_lengths_.emplace(batch_.lengths);
    d_q_.emplace(q_);
  }

  int rows() const { return batch_.rows(); }
  int64_t q_dim() const { return static_cast<int64_t>(shape_.n_head) * shape_.head_dim; }
  double max_abs_v() const { return max_abs_v_; }
  const Batch& batch() const { return batch_; }

  kernels::AttentionArgs args(float* out, const int32_t* lengths) const {
    kernels::AttentionArgs a =
        gpu_test::attention_args(d_q_->get(), out, rows(), shape_.n_head, shape_.n_kv,
                                 shape_.head_dim, lengths ? lengths : d_lengths_->get(),
                                 d_slots_->get(), d_bases_->get(), kv_.token_stride(), kLayer);
    a.window = gpt_.window;
    a.sinks = d_sinks_ ? d_sinks_->get() : nullptr;
    return a;
  }

  // The first token a row of this length reads.
  int first_token(int length) const {
    return gpt_.window > 0 ? std::max(0, length - gpt_.window) : 0;
  }

  // The split kernel (attention.cu) into `out` for every row of `lengths` (default: the
  // batch's) with a length > 0, at the prefill split size the backend uses.
  void run_split(float* out, const int32_t* lengths = nullptr) const {
    const gpu_test::SplitAttention split(args(out, lengths), 1024, kv_.max_tokens);
    ASSERT_EQ(kernels::launch_attention(split.args, gpu_test::kernel_config(), nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }

  // Row r's attention for query head h in double precision over the f16 K and V.
  std::vector<double> reference(int r, int h) const {
    const int hd = shape_.head_dim, group = shape_.n_head / shape_.n_kv;
    const int length = batch_.lengths[r], slot = batch_.slots[r];
    const float* q = q_.data() + r * q_dim() + h * hd;
    const auto& kv = contiguous_[slot * shape_.n_kv + h / group];
    std::vector<double> qd(q, q + hd);
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    std::vector<double> scores(static_cast<size_t>(length));
    double top = sinks_.empty() ? -INFINITY : static_cast<double>(sinks_[h]);
    const int first = first_token(length);
    for (int t = first; t < length; ++t) {
      const float* k = kv[0].data() + static_cast<size_t>(t) * hd;
      double s[4] = {0, 0, 0, 0};  // hd is a multiple of 4
      for (int d = 0; d < hd; d += 4)
        for (int i = 0; i < 4; ++i) s[i] += qd[d + i] * k[d + i];
      scores[t] = (s[0] + s[1] + s[2] + s[3]) * scale;
      top = std::max(top, scores[t]);
    }
    std::vector<double> out(static_cast<size_t>(hd), 0.0);
    double sum = sinks_.empty() ? 0.0 : std::exp(sinks_[h] - top);
    for (int t = first; t < length; ++t) {
      const double p = std::exp(scores[t] - top);
      sum += p;
      const float* v = kv[1].data() + static_cast<size_t>(t) * hd;
      for (int d = 0; d < hd; ++d) out[d] += p * v[d];
    }
    for (double& x : out) x /= sum;
    return out;
  }

 private:
  Shape shape_;
  Batch batch_;
  Gpt gpt_;
  std::vector<float> sinks_;  // [n_head] where gpt_.sinks
  std::vector<int32_t> filled_;
  KvLayout kv_{};
  std::vector<float> q_, kv_f32_;
  std::vector<std::array<std::vector<float>, 2>> contiguous_;  // [slot * n_kv + head][K, V]
  double max_abs_v_ = 0;
  // (optional: DeviceArray has no assignment; emplaced once the host data is ready)
  std::optional<DeviceArray<uint16_t>> d_kv_;
  std::optional<DeviceArray<__half*>> d_bases_;
  std::optional<DeviceArray<int32_t>> d_slots_, d_lengths_;
  std::optional<DeviceArray<float>> d_q_, d_sinks_;
};

// Rows the CPU reference checks (the split kernel checks every row): all of a short batch; of
// a longer one the first 8, the last 40 (the last tile, longest rows) and ~32 spread between,
// which keeps the whole binary within a couple of minutes of one CPU core.
std::vector<int> reference_rows(int rows) {
  std::vector<int> out;
  const int step = std::max(1, (rows - 48) / 32);
  for (int r = 0; r < rows; ++r)
    if (rows <= 80 || r < 8 || r >= rows - 40 || r % step == 0) out.push_back(r);
  return out;
}

// Runs the flash kernel over `tiles`, then the split kernel over `split_rows` only (lengths of
// the other rows zeroed, as CudaModel does), and checks: rows outside the tiles untouched by
// the flash kernel, every row of length > 0 within the bound of the split kernel run alone on
// every row and of the double reference (on reference_rows), rows of length 0 never written,
// and a second flash launch bit-identical.
void check(const Problem& p, const std::vector<PrefillTile>& tiles,
           const std::vector<int32_t>& split_rows, const std::string& what) {
  const kernels::KernelConfig config = gpu_test::kernel_config();
  const int rows = p.rows();
  const int64_t q_dim = p.q_dim();
  const size_t n = static_cast<size_t>(rows) * q_dim;
  std::vector<bool> in_tile(static_cast<size_t>(rows), false);
  for (const PrefillTile& t : tiles) {
    ASSERT_GE(t.count, 1) << what;
    ASSERT_LE(t.count, kernels::kPrefillTileRows) << what;
    for (int r = t.first_row; r < t.first_row + t.count; ++r) {
      ASSERT_FALSE(in_tile[r]) << what << ": row " << r << " in two tiles";
      in_tile[r] = true;
    }
  }

  // (one dummy tile when there are none: the launch with 0 tiles must do nothing)
  DeviceArray<PrefillTile> d_tiles(tiles.empty() ? std::vector<PrefillTile>(1) : tiles);
  DeviceArray<float> d_out(n), d_split(n);
  d_out.poison();
  d_split.poison();
  const kernels::AttentionArgs a = p.args(d_out.get(), nullptr);
  CUDA_OK(kernels::launch_attention_prefill(a, d_tiles.get(), static_cast<int>(tiles.size()),
                                            config, nullptr));
  const std::vector<float> flash = d_out.download();
  d_out.poison();
  CUDA_OK(kernels::launch_attention_prefill(a, d_tiles.get(), static_cast<int>(tiles.size()),
                                            config, nullptr));
  const std::vector<float> again = d_out.download();
  for (size_t i = 0; i < n; ++i) {
    const int r = static_cast<int>(i / q_dim);
    const bool written = in_tile[r] && p.batch().lengths[r] > 0;
    if (written) {
      ASSERT_TRUE(std::isfinite(flash[i])) << what << ": row " << r << " element " << i % q_dim;
      ASSERT_EQ(std::memcmp(&flash[i], &again[i], sizeof(float)), 0)
          << what << ": second launch differs, row " << r;
    } else {
      ASSERT_TRUE(is_poison(flash[i]) && is_poison(again[i]))
          << what << ": flash kernel wrote row " << r << " (length " << p.batch().lengths[r]
          << (in_tile[r] ? ", in a tile)" : ", in no tile)");
    }
  }

  // The backend's sequence: flash for the tiles, then split for the other rows.
  std::vector<float> combined = flash;
  if (!split_rows.empty()) {
    std::vector<int32_t> other(static_cast<size_t>(rows), 0);
    for (const int32_t r : split_rows) other[r] = p.batch().lengths[r];
    DeviceArray<int32_t> d_other(other);
    DeviceArray<float> d_both(flash);
    ASSERT_NO_FATAL_FAILURE(p.run_split(d_both.get(), d_other.get()));
    combined = d_both.download();
  }
  ASSERT_NO_FATAL_FAILURE(p.run_split(d_split.get()));
  const std::vector<float> split = d_split.download();

  const double limit = kBound * p.max_abs_v();
  double worst_split = 0, worst_reference = 0;
  for (int r = 0; r < rows; ++r) {
    const bool has_output = p.batch().lengths[r] > 0;
    for (int64_t i = 0; i < q_dim; ++i) {
      const float got = combined[r * q_dim + i];
      if (!has_output) {
        ASSERT_TRUE(is_poison(got)) << what << ": row " << r << " of length 0 written";
        continue;
      }
      const double e = std::fabs(double(got) - split[r * q_dim + i]);
      worst_split = std::max(worst_split, e);
      ASSERT_LE(e, limit) << what << ": row " << r << " (length " << p.batch().lengths[r]
                          << ") element " << i << " vs the split kernel " << split[r * q_dim + i];
    }
  }
  const int hd = static_cast<int>(q_dim / (a.n_head));
  // Every head of the first KV head and the last of each other (all where there are <= 8).
  const int group = a.n_head / a.n_kv;
  for (const int r : reference_rows(rows)) {
    if (p.batch().lengths[r] == 0) continue;
    for (int h = 0; h < a.n_head; ++h) {
      if (a.n_head > 8 && h >= group && h % group != group - 1) continue;
      const std::vector<double> want = p.reference(r, h);
      for (int d = 0; d < hd; ++d) {
        const double e = std::fabs(combined[r * q_dim + h * hd + d] - want[d]);
        worst_reference = std::max(worst_reference, e);
        ASSERT_LE(e, limit) << what << ": row " << r << " (length " << p.batch().lengths[r]
                            << ") head " << h << " element " << d << " want " << want[d];
      }
    }
  }
  std::cout << "[flash-prefill] " << what << ": rows " << rows << ", tiles " << tiles.size()
            << ", max |err|/max|V| vs double " << worst_reference / p.max_abs_v()
            << ", vs split kernel " << worst_split / p.max_abs_v() << "\n";
}

// Plans the batch as the backend does (runs of >= min_run rows of a slot in tiles) and checks.
void check_planned(const Shape& shape, const Batch& batch, int min_run, float q_sigma,
                   uint32_t seed, const std::string& what, Gpt gpt = {}) {
  const Problem p(shape, batch, q_sigma, seed, gpt);
  std::vector<PrefillTile> tiles;
  std::vector<int32_t> others;
  kernels::plan_prefill_tiles(batch.slots.data(), batch.lengths.data(), batch.rows(), min_run,
                              tiles, others);
  check(p, tiles, others, what);
}

// --- the tile planner (host code: runs without a GPU) ----------------------------------------

std::vector<std::pair<int, int>> plan(const Batch& b, int min_run, std::vector<int32_t>& others) {
  std::vector<PrefillTile> tiles = {{99, 99}};  // cleared by the planner
  others = {42};
  kernels::plan_prefill_tiles(b.slots.data(), b.lengths.data(), b.rows(), min_run, tiles, others);
  std::vector<std::pair<int, int>> out;
  for (const PrefillTile& t : tiles) out.emplace_back(t.first_row, t.count);
  return out;
}

TEST(FlashPrefillPlan, RunsOfOneSlotInBalancedTilesOthersForTheSplitKernel) {
  using Tiles = std::vector<std::pair<int, int>>;
  std::vector<int32_t> others;
  Batch one;
  one.add_run(3, 1, 1);
  EXPECT_EQ(plan(one, 2, others), Tiles{});
  EXPECT_EQ(others, std::vector<int32_t>{0});
  EXPECT_EQ(plan(one, 1, others), (Tiles{{0, 1}}));
  EXPECT_TRUE(others.empty());
  Batch long_run;
  long_run.add_run(0, 4001, 150);  // 150 rows: 3 tiles of 50
  EXPECT_EQ(plan(long_run, 2, others), (Tiles{{0, 50}, {50, 50}, {100, 50}}));
  Batch exact;
  exact.add_run(1, 1, 128);  // 2 x 64
  exact.add_run(2, 1, 129);  // 43 + 43 + 43
  EXPECT_EQ(plan(exact, 2, others), (Tiles{{0, 64}, {64, 64}, {128, 43}, {171, 43}, {214, 43}}));
  // Padding (length 0) ends a run and is in neither list; a slot's rows split by another
  // slot's are two runs.
  Batch mixed;
  mixed.add_run(0, 10, 3);  // 0..2
  mixed.add(-1, 0);         // 3
  mixed.add_run(0, 13, 2);  // 4..5
  mixed.add(5, 7);          // 6
  mixed.add_run(0, 15, 1);  // 7
  mixed.add(-1, 0);         // 8
  EXPECT_EQ(plan(mixed, 2, others), (Tiles{{0, 3}, {4, 2}}));
  EXPECT_EQ(others, (std::vector<int32_t>{6, 7}));
  EXPECT_EQ(plan(mixed, 3, others), (Tiles{{0, 3}}));
  EXPECT_EQ(others, (std::vector<int32_t>{4, 5, 6, 7}));
  Batch empty;
  EXPECT_EQ(plan(empty, 2, others), Tiles{});
  EXPECT_TRUE(others.empty());
}

// --- one sequence's prompt from position 0: rows of lengths 1..L ---------------------------

struct PromptCase {
  Shape shape;
  int length;
};

class FlashPrefillPrompt : public ::testing::TestWithParam<PromptCase> {};

TEST_P(FlashPrefillPrompt, MatchesDoubleReferenceAndSplitKernel) {
  GRANULE_REQUIRE_GPU();
  const PromptCase c = GetParam();
  Batch b;
  b.add_run(0, 1, c.length);
  // min_run 1: a 1-row prompt is a 1-row tile here (the backend would give it to the split
  // kernel).
  check_planned(c.shape, b, 1, 1.0f,
                static_cast<uint32_t>(c.length * 7 + c.shape.head_dim + c.shape.n_head),
                "prompt of " + std::to_string(c.length));
}

std::vector<PromptCase> prompt_cases() {
  std::vector<PromptCase> out;
  for (const int hd : {64, 128, 256})
    for (const Shape s : {Shape{hd, 2, 2}, Shape{hd, 8, 2}, Shape{hd, 8, 1}})
      for (const int length : {1, 17, 64, 65, 200, 1000, 4100}) out.push_back({s, length});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashPrefillPrompt, ::testing::ValuesIn(prompt_cases()),
                         [](const ::testing::TestParamInfo<PromptCase>& i) {
                           const Shape& s = i.param.shape;
                           return "hd" + std::to_string(s.head_dim) + "_group" +
                                  std::to_string(s.n_head / s.n_kv) + "_len" +
                                  std::to_string(i.param.length);
                         });

// --- other batches ---------------------------------------------------------------------------

class FlashPrefillBatch : public ::testing::TestWithParam<Shape> {};

std::string shape_name(const Shape& s) {
  return "hd" + std::to_string(s.head_dim) + "_h" + std::to_string(s.n_head) + "_kv" +
         std::to_string(s.n_kv);
}

TEST_P(FlashPrefillBatch, ChunkOfALongPrompt) {
  GRANULE_REQUIRE_GPU();
  // Rows at positions 4096..4159 reading KV 0..4159 (one full tile), then a 150-row chunk at
  // 4000..4149 (three tiles of 50), with sharper scores.
  Batch b;
  b.add_run(0, 4097, 64);
  check_planned(GetParam(), b, 2, 1.0f, 11, "chunk 4096..4159 " + shape_name(GetParam()));
  Batch c;
  c.add_run(0, 4001, 150);
  check_planned(GetParam(), c, 2, 2.5f, 12, "chunk 4000..4149 " + shape_name(GetParam()));
}

TEST_P(FlashPrefillBatch, MixedBatchPlannedAsTheBackendDoes) {
  GRANULE_REQUIRE_GPU();
  Batch b;
  b.add_run(0, 1, 100);    // rows 0..99: a prompt from position 0
  b.add(1, 3000);          // 100: a decode row at a long context
  b.add(-1, 0);            // 101: padding
  b.add_run(2, 501, 70);   // 102..171: a prompt chunk at positions 500..569
  b.add(3, 1);             // 172: a decode row at position 0
  b.add_run(4, 11, 2);     // 173..174: a run of 2
  b.add(-1, 0);            // 175: padding
  b.add(0, 201);           // 176: slot 0 again, alone
  b.add_run(5, 1, 64);     // 177..240: exactly one tile
  b.add_run(6, 1000, 65);  // 241..305: 65 rows right after another slot's run
  std::vector<PrefillTile> tiles;
  std::vector<int32_t> others;
  kernels::plan_prefill_tiles(b.slots.data(), b.lengths.data(), b.rows(), 2, tiles, others);
  const std::vector<std::pair<int, int>> want_tiles = {{0, 50},  {50, 50},  {102, 35}, {137, 35},
                                                       {173, 2}, {177, 64}, {241, 32}, {273, 33}};
  ASSERT_EQ(tiles.size(), want_tiles.size());
  for (size_t i = 0; i < tiles.size(); ++i) {
    EXPECT_EQ(tiles[i].first_row, want_tiles[i].first) << "tile " << i;
    EXPECT_EQ(tiles[i].count, want_tiles[i].second) << "tile " << i;
  }
  EXPECT_EQ(others, (std::vector<int32_t>{100, 172, 176}));
  const Problem p(GetParam(), b, 1.5f, 21);
  check(p, tiles, others, "mixed batch " + shape_name(GetParam()));
}

TEST_P(FlashPrefillBatch, HandMadeTilesWithZeroLengthsAndArbitraryLengths) {
  GRANULE_REQUIRE_GPU();
  // One slot, 130 rows of random lengths in [0, 300] (a quarter of them 0), in tiles of 64, 1,
  // 17 and 48 rows; rows 0 and 129 have length 0 at the tiles' edges.
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> length(1, 300), coin(0, 3);
  Batch b;
  for (int r = 0; r < 130; ++r) b.add(0, coin(rng) == 0 ? 0 : length(rng));
  b.lengths[0] = b.lengths[129] = 0;
  b.lengths[64] = 300;
  const std::vector<PrefillTile> tiles = {{0, 64}, {64, 1}, {65, 17}, {82, 48}};
  const Problem p(GetParam(), b, 2.0f, 31);
  check(p, tiles, {}, "hand-made tiles " + shape_name(GetParam()));
  // A tile of only length-0 rows writes nothing; no tiles at all is no launch.
  Batch z;
  for (int r = 0; r < 20; ++r) z.add(0, r == 7 ? 5 : 0);
  const Problem pz(GetParam(), z, 1.0f, 32);
  check(pz, {{0, 5}, {8, 12}}, {7}, "tiles of length-0 rows " + shape_name(GetParam()));
  check(pz, {}, {7}, "no tiles " + shape_name(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashPrefillBatch,
                         ::testing::Values(Shape{64, 8, 1}, Shape{128, 32, 8}, Shape{128, 8, 2},
                                           Shape{256, 4, 4}, Shape{64, 9, 3}),
                         [](const ::testing::TestParamInfo<Shape>& i) {
                           return shape_name(i.param);
                         });

// --- gpt-oss: sliding windows and sinks --------------------------------------------------------

class FlashPrefillGptOss : public ::testing::TestWithParam<Shape> {};

TEST_P(FlashPrefillGptOss, WindowsAndSinks) {
  GRANULE_REQUIRE_GPU();
  const Shape& shape = GetParam();
  const std::string name = shape_name(shape);
  // A prompt from position 0 crossing gpt-oss's window of 128 (and a window of 8, shorter than
  // a KV tile): the tiles' rows start their windows at different tokens.
  for (const Gpt gpt : {Gpt{128, true}, Gpt{8, true}, Gpt{128, false}, Gpt{0, true}}) {
    const std::string what =
        " window " + std::to_string(gpt.window) + (gpt.sinks ? " sinks " : " ") + name;
    Batch b;
    b.add_run(0, 1, 300);
    check_planned(shape, b, 2, 1.5f, 41 + gpt.window, "prompt of 300," + what, gpt);
    // A chunk of a long prompt: every row's window far from token 0 (the KV before it NaN).
    Batch c;
    c.add_run(0, 4001, 150);
    check_planned(shape, c, 2, 2.0f, 42 + gpt.window, "chunk 4000..4149," + what, gpt);
  }
  // A mixed batch under a window of 100: prompt runs, decode rows past and within the window.
  Batch m;
  m.add_run(0, 1, 130);  // rows 0..129
  m.add(1, 3000);        // a decode row at a long context
  m.add(-1, 0);          // padding
  m.add_run(2, 90, 40);  // a chunk whose rows' windows begin at 0..29
  m.add(3, 50);          // a decode row inside its window
  check_planned(shape, m, 2, 1.5f, 43, "mixed batch, window 100 sinks " + name, Gpt{100, true});
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashPrefillGptOss,
                         ::testing::Values(Shape{64, 16, 2}, Shape{64, 64, 8}, Shape{128, 8, 2}),
                         [](const ::testing::TestParamInfo<Shape>& i) {
                           return shape_name(i.param);
                         });

TEST(FlashPrefillLauncher, RejectsWhatItCannotRun) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  Batch b;
  b.add_run(0, 1, 4);
  const Problem p(Shape{128, 4, 2}, b, 1.0f, 41);
  DeviceArray<float> out(static_cast<size_t>(p.rows() * p.q_dim()));
  DeviceArray<PrefillTile> tiles(std::vector<PrefillTile>{{0, 4}});
  DeviceArray<int8_t> qs(static_cast<size_t>(p.rows() * p.q_dim()));
  DeviceArray<float2> ds(static_cast<size_t>(p.rows() * p.q_dim() / 32));
  kernels::AttentionArgs a = p.args(out.get(), nullptr);
  EXPECT_EQ(kernels::launch_attention_prefill(a, tiles.get(), 0, config, nullptr), cudaSuccess);
  kernels::AttentionArgs q8 = a;
  q8.out_q8 = {qs.get(), ds.get()};
  EXPECT_EQ(kernels::launch_attention_prefill(q8, tiles.get(), 1, config, nullptr),
            cudaErrorInvalidValue);
  kernels::AttentionArgs bad_dim = a;
  bad_dim.head_dim = 96;
  EXPECT_EQ(kernels::launch_attention_prefill(bad_dim, tiles.get(), 1, config, nullptr),
            cudaErrorInvalidValue);
  kernels::AttentionArgs bad_group = a;
  bad_group.n_head = 18;
  bad_group.n_kv = 2;  // 9 per KV head
  EXPECT_EQ(kernels::launch_attention_prefill(bad_group, tiles.get(), 1, config, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // nothing left behind
  EXPECT_TRUE(kernels::attention_prefill_fits_device(128));
  EXPECT_FALSE(kernels::attention_prefill_fits_device(96));
}

// --- the engine: prefill logits with the flash kernel on and off ------------------------------

struct Rig {
  std::unique_ptr<ModelFile> file;
  ModelConfig config;
  WeightTable weights;
  Runtime runtime;

  Rig(const std::filesystem::path& path, bool gpu, std::optional<kernels::KernelConfig> kc) {
    file = ModelFile::open(path);
    config = ModelConfig::from_gguf(*file);
    weights = WeightTable::from_gguf(*file, config);
    RuntimeOptions options;
    options.device = gpu ? DeviceKind::Cuda : DeviceKind::Cpu;
    options.backend.cpu_exact_numerics = !gpu;  // the CPU reference numerics
    options.backend.vram_budget_bytes = uint64_t{1} << 40;
    options.backend.kernel_config = kc;
    options.context_length = 512;
    options.slots = 4;
    options.kv_pool_granules = 0;
    runtime = make_runtime(*file, config, weights, options);
  }

  std::vector<float> run(const std::vector<BatchSequence>& batch) {
    for (const BatchSequence& s : batch)
      if (!runtime.kv->map_through(s.slot,
                                   s.start_position + static_cast<int64_t>(s.tokens.size())))
        throw std::runtime_error("KV map refused");
    std::vector<float> logits;
    runtime.backend->forward(batch, logits);
    return logits;
  }
};

double row_spread(const float* row, int64_t n) {
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < n; ++i) sum += row[i];
  const double mean = sum / static_cast<double>(n);
  for (int64_t i = 0; i < n; ++i) sq += (row[i] - mean) * (row[i] - mean);
  return std::sqrt(sq / static_cast<double>(n));
}

// max_i |(a_i - mean a) - (b_i - mean b)|: the centred logits' largest difference.
double centred_error(const float* a, const float* b, int64_t n) {
  double ma = 0, mb = 0;
  for (int64_t i = 0; i < n; ++i) {
    ma += a[i];
    mb += b[i];
  }
  ma /= static_cast<double>(n);
  mb /= static_cast<double>(n);
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double e = std::fabs((a[i] - ma) - (b[i] - mb));
    worst = std::isnan(e) ? INFINITY : std::max(worst, e);
  }
  return worst;
}

struct EngineCase {
  std::string name;
  int64_t head_dim, n_head, n_head_kv, n_embd;
};

class FlashPrefillEngine : public ::testing::TestWithParam<EngineCase> {};

// The same steps with the flash kernel on and off: a 150-row prompt (one sequence, three
// tiles) and a mixed step (a 100-row prompt, a decode row of a sequence prefilled before, a
// 70-row prompt: 171 rows, tiles plus a split-kernel row). The bound is the model_gpu_test
// cuBLAS-path one: the flash kernel's rounding (Q and P in f16, ~2^-12 relative each) is the
// size of one more f16 rounding of the attention output, which the cuBLAS path already makes
// (its f16 GEMM operands), so per row the centred logits of the two runs differ by at most
// kSummationTolerance (1e-3 of the spread) + kFlipFactor (2) x the flash-off run's own distance
// from the f32 CPU reference; greedy tokens agree unless the margin is within that bound.
TEST_P(FlashPrefillEngine, PrefillLogitsAgreeWithTheSplitKernel) {
  GRANULE_REQUIRE_GPU();
  const EngineCase ec = GetParam();
  SyntheticModelSpec s;
  s.name = ec.name;
  s.n_layer = 2;
  s.n_embd = ec.n_embd;
  s.n_head = ec.n_head;
  s.n_head_kv = ec.n_head_kv;
  s.head_dim = ec.head_dim;
  s.n_ff = 512;
  s.n_vocab = 1000;
  s.weight_type = TensorType::F16;
  s.embedding_type = TensorType::F16;
  s.output_type = TensorType::F16;
  s.seed = 99;
  const auto path =
      std::filesystem::temp_directory_path() / ("granule-flash-prefill-" + ec.name + ".gguf");
  write_synthetic_model(s, path);
  kernels::KernelConfig on = gpu_test::kernel_config(), off = on;
  on.flash_prefill = true;
  off.flash_prefill = false;
  Rig cpu(path, false, std::nullopt), gpu_on(path, true, on), gpu_off(path, true, off);
  const int64_t vocab = cpu.config.n_vocab;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(3, static_cast<int32_t>(vocab - 1));
  auto tokens = [&](int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& x : t) x = token(rng);
    return t;
  };
  const std::vector<int32_t> long_prompt = tokens(150), first = tokens(40), decode = tokens(1),
                             a = tokens(100), b = tokens(70);
  // Slot 1 holds 40 tokens before the mixed step (a matvec-path prefill, same on both).
  for (Rig* r : {&cpu, &gpu_on, &gpu_off}) r->run({{1, first, 0, false}});

  auto compare = [&](const std::vector<BatchSequence>& step, const std::string& what) {
    const std::vector<float> ref = cpu.run(step), got_on = gpu_on.run(step),
                             got_off = gpu_off.run(step);
    ASSERT_EQ(got_on.size(), ref.size());
    ASSERT_EQ(got_off.size(), ref.size());
    const int rows = static_cast<int>(ref.size() / static_cast<size_t>(vocab));
    double worst_ratio = 0, worst = 0;
    int greedy_differs = 0;
    for (int r = 0; r < rows; ++r) {
      const float* f = ref.data() + r * vocab;
      const float* g1 = got_on.data() + r * vocab;
      const float* g0 = got_off.data() + r * vocab;
      const double spread = row_spread(g0, vocab);
      const double d_row = centred_error(g0, f, vocab) / spread;
      const double e = centred_error(g1, g0, vocab) / spread;
      const double bound = 1e-3 + 2.0 * d_row;
      worst = std::max(worst, e);
      worst_ratio = std::max(worst_ratio, e / bound);
      EXPECT_LE(e, bound) << what << ": row " << r << " flash on vs off, d_row " << d_row;
      const gpu_test::TopTwo t0 = gpu_test::top_two({g0, static_cast<size_t>(vocab)});
      const gpu_test::TopTwo t1 = gpu_test::top_two({g1, static_cast<size_t>(vocab)});
      if (t0.best != t1.best) {
        ++greedy_differs;
        EXPECT_LE(t0.margin, 2 * bound * spread) << what << ": row " << r << " greedy differs";
      }
    }
    std::cout << "[flash-prefill-engine] " << ec.name << " " << what << ": rows " << rows
              << ", max |on - off|/spread " << worst << ", worst err/bound " << worst_ratio
              << ", greedy differs in " << greedy_differs << " rows\n";
  };
  compare({{0, long_prompt, 0, true}}, "prompt 150");
  compare({{2, a, 0, true}, {1, decode, 40, true}, {3, b, 0, true}}, "mixed step 171 rows");
  std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(Models, FlashPrefillEngine,
                         ::testing::Values(EngineCase{"hd64", 64, 4, 2, 256},
                                           EngineCase{"hd128", 128, 4, 1, 256},
                                           EngineCase{"hd256", 256, 2, 1, 256}),
                         [](const ::testing::TestParamInfo<EngineCase>& i) {
                           return i.param.name;
                         });

}  // namespace
}  // namespace granule
