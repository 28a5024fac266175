// The CPU backend's forward pass in parts (cpu_backend.h forward_layers, the CUDA backend's host
// layers): embed, layers [0, k), layers [k, n), head on one backend equals forward() of the
// whole model on another, bit for bit, over a prompt and the decode steps after it, for several
// sequences at once; a backend computing only some layers refuses the others.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/ops.h"
#include "granule/error.h"
#include "granule/gguf.h"
#include "granule/model_config.h"
#include "memory/kv_space.h"
#include "memory/memory_manager.h"
#include "support/temp_model.h"

namespace granule {
namespace {

constexpr int64_t kContext = 256;
constexpr int32_t kSlots = 2;

// A CPU backend over its own KvSpace; `layers` as CpuBackend's computed_layers.
struct Rig {
  std::unique_ptr<ModelFile> file;
  ModelConfig config;
  WeightTable weights;
  BackendOptions options;
  std::unique_ptr<MemoryManager> memory;
  std::unique_ptr<cpu::CpuBackend> backend;
  std::unique_ptr<KvSpace> kv;

  Rig(const std::filesystem::path& path, bool exact, std::vector<bool> layers = {},
      bool kv_through_f16 = false) {
    file = ModelFile::open(path);
    config = ModelConfig::from_gguf(*file);
    weights = WeightTable::from_gguf(*file, config);
    options.cpu_threads = 2;
    options.cpu_exact_numerics = exact;
    memory = std::make_unique<MemoryManager>(uint64_t{1} << 40);
    backend = std::make_unique<cpu::CpuBackend>(
        BackendInit{*file, config, weights, *memory, options}, std::move(layers), kv_through_f16);
    KvGeometry g;
    g.bytes_per_token = backend->kv_bytes_per_token();
    g.max_tokens = kContext;
    g.slots = kSlots;
    g.parts = kv_parts(config, kCpuKvElementBytes);
    kv = std::make_unique<KvSpace>(backend->make_kv_virtual_memory(), g, *memory);
    backend->attach_kv(*kv);
  }
  ~Rig() {
    kv.reset();
    backend.reset();
  }
  void map(const std::vector<BatchSequence>& batch) {
    for (const BatchSequence& s : batch)
      ASSERT_TRUE(
          kv->map_through(s.slot, s.start_position + static_cast<int64_t>(s.tokens.size())));
  }
  // The whole model through forward().
  std::vector<float> whole(const std::vector<BatchSequence>& batch) {
    map(batch);
    std::vector<float> logits;
    backend->forward(batch, logits);
    return logits;
  }
  // The same step as embed, forward_layers over [0, split) and [split, n), head of each
  // sequence's last row.
  std::vector<float> parts(const std::vector<BatchSequence>& batch, int64_t split) {
    map(batch);
    std::vector<int32_t> tokens, slots, positions;
    std::vector<size_t> last_rows;
    for (const BatchSequence& s : batch) {
      for (size_t i = 0; i < s.tokens.size(); ++i) {
        tokens.push_back(s.tokens[i]);
        slots.push_back(s.slot);
        positions.push_back(static_cast<int32_t>(s.start_position + static_cast<int64_t>(i)));
      }
      last_rows.push_back(tokens.size() - 1);
    }
    const int64_t d = config.n_embd;
    std::vector<float> hidden(tokens.size() * static_cast<size_t>(d));
    backend->embed(tokens, hidden.data());
    backend->forward_layers(0, split, slots, positions, hidden.data());
    backend->forward_layers(split, config.n_layer, slots, positions, hidden.data());
    std::vector<float> rows;
    for (size_t r : last_rows)
      rows.insert(rows.end(), hidden.begin() + static_cast<std::ptrdiff_t>(r * d),
                  hidden.begin() + static_cast<std::ptrdiff_t>((r + 1) * d));
    std::vector<float> logits;
    backend->head(rows.data(), static_cast<int64_t>(last_rows.size()), logits);
    return logits;
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

int32_t argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

std::vector<int32_t> prompt(int n, int64_t vocab, int salt) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i)
    t.push_back(static_cast<int32_t>(3 + (i * 37 + salt * 11 + i / 5) % (vocab - 3)));
  return t;
}

// Two sequences: a prompt each (one step of both), then greedy decode steps of both, through
// the whole forward on one rig and the parts on the other; every step's logits the same bits.
void expect_parts_equal_whole(const SyntheticModelSpec& spec, bool exact, int64_t split) {
  test::TempModel model(spec, "cpu-layer-range");
  Rig whole(model.path, exact), parts(model.path, exact);
  const int64_t vocab = whole.config.n_vocab;
  std::vector<int32_t> a = prompt(13, vocab, 1), b = prompt(7, vocab, 2);
  std::vector<BatchSequence> batch = {{0, a, 0, false}, {1, b, 0, false}};
  std::vector<float> expected = whole.whole(batch);
  std::vector<float> got = parts.parts(batch, split);
  ASSERT_TRUE(same_bits(expected, got)) << "prompt step, split at layer " << split;
  int64_t pos_a = static_cast<int64_t>(a.size()), pos_b = static_cast<int64_t>(b.size());
  for (int step = 0; step < 6; ++step) {
    std::vector<int32_t> ta = {argmax(expected.data(), vocab)};
    std::vector<int32_t> tb = {argmax(expected.data() + vocab, vocab)};
    batch = {{0, ta, pos_a, false}, {1, tb, pos_b, false}};
    expected = whole.whole(batch);
    got = parts.parts(batch, split);
    ASSERT_TRUE(same_bits(expected, got)) << "decode step " << step << ", split at " << split;
    ++pos_a;
    ++pos_b;
  }
}

SyntheticModelSpec four_layers(const char* preset, TensorType type) {
  SyntheticModelSpec s = SyntheticModelSpec::preset(preset);
  s.name = std::string("layer-range-") + preset;
  s.n_layer = 4;
  s.weight_type = type;
  return s;
}

TEST(CpuLayerRange, ExactPathSplitsEqualWholeForward) {
  for (int64_t split : {0, 1, 2, 4})
    expect_parts_equal_whole(four_layers("tiny", TensorType::F32), true, split);
}

TEST(CpuLayerRange, FastPathQuantisedSplitsEqualWholeForward) {
  // Q4_0 takes the int8 kernels on the fast path (fast_matmul.h).
  expect_parts_equal_whole(four_layers("tiny", TensorType::Q4_0), false, 2);
  expect_parts_equal_whole(four_layers("tiny-qwen3", TensorType::Q8_0), false, 3);
}

TEST(CpuLayerRange, MixtureOfExpertsSplitsEqualWholeForward) {
  SyntheticModelSpec s = SyntheticModelSpec::preset("tiny-qwen3moe");
  s.name = "layer-range-moe";
  expect_parts_equal_whole(s, false, 1);
}

TEST(CpuLayerRange, BackendOfSomeLayersComputesThemAlike) {
  // A backend holding int8 copies of layers 2 and 3 only gives the same rows through them as a
  // backend of every layer, and refuses the layers it does not hold.
  test::TempModel model(four_layers("tiny", TensorType::Q4_0), "cpu-layer-subset");
  Rig all(model.path, false), some(model.path, false, {false, false, true, true});
  const int64_t d = all.config.n_embd;
  const std::vector<int32_t> tokens = prompt(5, all.config.n_vocab, 3);
  const std::vector<int32_t> slots(tokens.size(), 1);
  std::vector<int32_t> positions;
  for (int32_t i = 0; i < static_cast<int32_t>(tokens.size()); ++i) positions.push_back(i);
  ASSERT_TRUE(all.kv->map_through(1, static_cast<int64_t>(tokens.size())));
  ASSERT_TRUE(some.kv->map_through(1, static_cast<int64_t>(tokens.size())));
  std::vector<float> h(tokens.size() * static_cast<size_t>(d));
  all.backend->embed(tokens, h.data());
  all.backend->forward_layers(0, 2, slots, positions, h.data());
  std::vector<float> h_some = h;
  all.backend->forward_layers(2, 4, slots, positions, h.data());
  some.backend->forward_layers(2, 4, slots, positions, h_some.data());
  EXPECT_TRUE(same_bits(h, h_some));
  EXPECT_FALSE(some.backend->computes(1));
  EXPECT_THROW(some.backend->forward_layers(1, 3, slots, positions, h_some.data()), UsageError);
}

TEST(CpuLayerRange, KvThroughF16HoldsWhatTheDeviceKvWould) {
  // The host layers' KV (kv_through_f16): every K and V element written is an f16 value, so a
  // copy to the CUDA KV and back loses nothing; the layers' outputs stay close to the f32 KV's.
  test::TempModel model(four_layers("tiny", TensorType::Q4_0), "cpu-layer-kv-f16");
  Rig f32(model.path, false), f16(model.path, false, {}, true);
  const std::vector<int32_t> tokens = prompt(9, f32.config.n_vocab, 4);
  std::vector<BatchSequence> batch = {{0, tokens, 0, false}};
  const std::vector<float> a = f32.whole(batch), b = f16.whole(batch);
  const auto elements = static_cast<size_t>(tokens.size()) *
                        static_cast<size_t>(f16.backend->kv_bytes_per_token()) / sizeof(float);
  std::vector<float> kv(reinterpret_cast<const float*>(f16.kv->slot_base(0)),
                        reinterpret_cast<const float*>(f16.kv->slot_base(0)) + elements);
  std::vector<float> rounded = kv;
  cpu::round_through_f16(rounded.data(), static_cast<int64_t>(rounded.size()));
  EXPECT_TRUE(same_bits(kv, rounded)) << "a KV element is not an f16 value";
  // (The int8 activations of the fast path turn the KV's 5e-4 rounding into int8 flips: a few
  // per cent of the logits' range on this tiny random model, not more.)
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
  const auto [lo, hi] = std::minmax_element(a.begin(), a.end());
  EXPECT_FALSE(same_bits(a, b)) << "the f16 rounding changed nothing: not applied?";
  EXPECT_LT(worst, 0.05 * (*hi - *lo));
}

TEST(CpuLayerRange, BadRangesAndRowsAreRefused) {
  test::TempModel model(four_layers("tiny", TensorType::F32), "cpu-layer-bad");
  Rig rig(model.path, true);
  std::vector<float> h(static_cast<size_t>(rig.config.n_embd), 0.5f);
  const std::vector<int32_t> slot0 = {0}, pos0 = {0}, bad_slot = {kSlots}, far = {kContext};
  ASSERT_TRUE(rig.kv->map_through(0, 1));
  EXPECT_THROW(rig.backend->forward_layers(3, 5, slot0, pos0, h.data()), UsageError);
  EXPECT_THROW(rig.backend->forward_layers(2, 1, slot0, pos0, h.data()), UsageError);
  EXPECT_THROW(rig.backend->forward_layers(0, 1, bad_slot, pos0, h.data()), UsageError);
  EXPECT_THROW(rig.backend->forward_layers(0, 1, slot0, far, h.data()), CapacityError);
  EXPECT_THROW(rig.backend->forward_layers(0, 1, slot0, {}, h.data()), UsageError);
  EXPECT_THROW(
      cpu::CpuBackend(BackendInit{*rig.file, rig.config, rig.weights, *rig.memory, rig.options},
                      std::vector<bool>(3, true)),
      UsageError);
}

}  // namespace
}  // namespace granule
