// The host's rows of streamed dense layers (issue 41, backends/cuda/host_rows.h): with about
// half of a small llama model's layers streamed and the host computing part of each streamed
// matrix in decode runs of up to 8 rows, the logits stay within the oracle's bound and the
// greedy tokens are the all-resident run's, at one row and at three rows (bucket 4: a padding
// row), through decode graphs captured once and replayed; a split pass copies only the device's
// rows (the bytes counted), and setting 0 gives the all-resident run's logits bit for bit.
#include <algorithm>
#include <cstring>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/host_rows.h"
#include "gpu_test_support.h"
#include "granule/error.h"
#include "granule/testkit/synthetic_model.h"
#include "memory/host_row_split.h"
#include "memory/weight_layout.h"
#include "oracle_compare.h"
#include "runtime/runtime.h"
#include "support/model_runtime.h"
#include "support/temp_model.h"

namespace granule {
namespace {

using test::random_tokens;

constexpr int kSlots = 4;
constexpr int64_t kContext = 256;

RuntimeOptions options(bool gpu, bool oracle, uint64_t budget, int host_rows) {
  RuntimeOptions o;
  o.device = gpu ? DeviceKind::Cuda : DeviceKind::Cpu;
  o.backend.vram_budget_bytes = budget;
  // The plan keeps every slot's KV free, so no step's KV moves a layer after load (the host's
  // copies are made for the layers streamed at load).
  o.backend.kv_reserve_tokens = kSlots * kContext;
  o.backend.cuda_host_rows = host_rows;
  o.backend.cpu_emulate_device_numerics = oracle;
  o.backend.cpu_exact_numerics = !gpu;  // the CPU reference numerics
  o.context_length = kContext;
  o.slots = kSlots;
  o.kv_pool_granules = 0;
  return o;
}

struct Rig : test::ModelRuntime {
  Rig(const std::filesystem::path& path, const RuntimeOptions& o) : ModelRuntime(path, o) {}
  cuda::CudaModel& model() { return dynamic_cast<cuda::CudaBackend&>(*backend).model(); }
  TelemetrySnapshot telemetry() {
    TelemetrySnapshot t;
    backend->fill_telemetry(t);
    return t;
  }
  // One decode step of `rows` sequences (slot s at position `position`, token tokens[s]).
  std::vector<float> decode(const std::vector<int32_t>& tokens, int64_t position) {
    std::vector<BatchSequence> batch;
    for (size_t s = 0; s < tokens.size(); ++s)
      batch.push_back(
          {static_cast<int32_t>(s), std::span<const int32_t>(&tokens[s], 1), position, false});
    return step(batch);
  }
};

// 24 layers of small-256's shapes, the feed-forward twice as wide: every matrix has at least
// 256 rows, so at 128/256 each splits at a whole 64-row granule. (With 6 such layers no budget
// streams half: the streamed plan's two staging layers and larger workspace cost more than the
// three layers it leaves out, so the budget below the all-resident one is refused; H200,
// 2026-12-07.)
SyntheticModelSpec spec(TensorType type) {
  SyntheticModelSpec s = SyntheticModelSpec::preset("small-256");
  s.name = "host-rows";
  s.n_layer = 24;
  s.n_ff = 1024;
  s.weight_type = type;
  s.embedding_type = type;
  s.output_type = type;
  s.seed = 41 + static_cast<uint64_t>(type);
  return s;
}

size_t bitwise_differences(const std::vector<float>& a, const std::vector<float>& b) {
  size_t n = a.size() == b.size() ? 0 : std::max(a.size(), b.size());
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

// A rig with half of the layers (or more) streamed at load: from the all-resident ledger plus
// the KV reserve, one layer less at a time until the plan streams n_layer / 2 (the ledger may
// already hold some of the KV, so the walk goes on until the plan refuses the budget); each step
// loads without host rows, and the budget found loads again with `host_rows`.
std::unique_ptr<Rig> half_streamed(const std::filesystem::path& path, Rig& resident,
                                   int host_rows) {
  const uint64_t used = resident.runtime.memory->used_bytes();
  const uint64_t kv = resident.model().kv_reserve_bytes();
  const uint64_t layer = resident.model().streamer().layer_bytes()[0];
  const auto n_layer = static_cast<int32_t>(resident.config.n_layer);
  std::string tried;
  for (uint64_t drop = 1; drop * layer < used + kv; ++drop) {
    const uint64_t budget = used + kv - drop * layer;
    // The walk loads without host rows (no copies, no timed products), then the budget found
    // loads once more with the setting under test.
    std::unique_ptr<Rig> rig;
    try {
      rig = std::make_unique<Rig>(path, options(true, false, budget, 0));
    } catch (const CapacityError& e) {
      tried += " then " + std::to_string(budget >> 10) + " KiB: " + e.what();
      break;
    }
    const int32_t streamed = rig->model().streamer().streamed_layers();
    if (streamed >= n_layer / 2 && streamed < n_layer) {
      std::cout << "[host-rows] budget " << (budget >> 10) << " KiB: " << streamed << " of "
                << n_layer << " layers streamed\n";
      if (host_rows == 0) return rig;
      rig.reset();
      rig = std::make_unique<Rig>(path, options(true, false, budget, host_rows));
      if (rig->model().streamer().streamed_layers() == streamed) return rig;
      tried += "; with host rows " + std::to_string(host_rows) + " the plan streamed " +
               std::to_string(rig->model().streamer().streamed_layers());
      break;
    }
    if (drop == 1) tried += std::to_string(budget >> 10) + " KiB: " + std::to_string(streamed);
  }
  ADD_FAILURE() << "used " << (used >> 10) << " KiB, KV reserve " << (kv >> 10) << " KiB, layer "
                << (layer >> 10) << " KiB; " << tried;
  return nullptr;
}

struct HostRowsCase {
  std::string name;
  TensorType type;
  int setting;  // EngineOptions::host_row_share
};

class HostRowsGpu : public ::testing::TestWithParam<HostRowsCase> {};

// Teacher-forced decode steps at `rows` rows: the logits of each rig, row after row (sequence s
// reads tokens[s * steps + i] at position prompt + i after a shared-length prompt).
std::vector<float> teacher_forced(Rig& rig, int rows, int steps, const std::vector<int32_t>& prompt,
                                  const std::vector<int32_t>& tokens) {
  for (int s = 0; s < rows; ++s) rig.run(s, prompt, 0, false);
  std::vector<float> out;
  for (int i = 0; i < steps; ++i) {
    std::vector<int32_t> step_tokens;
    for (int s = 0; s < rows; ++s) step_tokens.push_back(tokens[s * steps + i]);
    const std::vector<float> logits =
        rig.decode(step_tokens, static_cast<int64_t>(prompt.size()) + i);
    out.insert(out.end(), logits.begin(), logits.end());
  }
  return out;
}

// Greedy decoding of `steps` tokens at `rows` rows from per-sequence prompts: the tokens, in
// step order.
std::vector<int32_t> greedy(Rig& rig, int rows, int steps, uint32_t seed) {
  const int64_t vocab = rig.config.n_vocab;
  std::vector<int32_t> current;
  for (int s = 0; s < rows; ++s) {
    const std::vector<int32_t> prompt = random_tokens(6, vocab, seed + static_cast<uint32_t>(s));
    const std::vector<float> last = rig.run(s, prompt, 0, false);
    current.push_back(
        static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin()));
  }
  std::vector<int32_t> produced = current;
  for (int i = 0; i < steps; ++i) {
    const std::vector<float> logits = rig.decode(current, 6 + i);
    for (int s = 0; s < rows; ++s) {
      const float* row = logits.data() + static_cast<int64_t>(s) * vocab;
      current[static_cast<size_t>(s)] =
          static_cast<int32_t>(std::max_element(row, row + vocab) - row);
    }
    produced.insert(produced.end(), current.begin(), current.end());
  }
  return produced;
}

TEST_P(HostRowsGpu, HalfStreamedWithTheHostsRowsMatchesTheOracleAndTheResidentTokens) {
  GRANULE_REQUIRE_GPU();
  const HostRowsCase& c = GetParam();
  const test::TempModel model(spec(c.type), "granule-gpu-test-host-rows-" + c.name);
  const std::filesystem::path& path = model.path;
  Rig resident(path, options(true, false, uint64_t{1} << 40, c.setting));
  ASSERT_EQ(resident.model().streamer().streamed_layers(), 0);
  EXPECT_EQ(resident.model().host_rows(), nullptr) << "nothing streams: the host computes none";
  std::unique_ptr<Rig> split = half_streamed(path, resident, c.setting);
  ASSERT_TRUE(split) << "no budget streamed half of the layers";
  const cuda::HostRows* h = split->model().host_rows();
  ASSERT_NE(h, nullptr) << "layers stream, yet the host computes none of their rows";
  if (c.setting > 0) EXPECT_EQ(h->share(), c.setting);
  EXPECT_GT(h->share(), 0);
  EXPECT_LE(h->share(), kHostRowShareUnits);
  std::cout << "[host-rows] " << c.name << ": share " << h->share() << "/256, copies "
            << (h->copy_bytes() >> 10) << " KiB\n";

  // Every streamed layer splits, and a split pass copies what the host does not read.
  const cuda::WeightStreamer& streamer = split->model().streamer();
  // The rounds a pass posts: per split layer, one per group of matrices the host has rows of.
  uint64_t rounds_per_pass = 0;
  for (size_t i = 0; i < streamer.layers(); ++i) {
    if (!streamer.streamed(i)) continue;
    EXPECT_TRUE(h->splits(i)) << "streamed layer " << i << " has no host rows";
    EXPECT_TRUE(streamer.split_copies(i)) << "streamed layer " << i << " is copied whole";
    for (int m = 0; m < cuda::HostRows::kMatrices; ++m) {
      const cuda::HostRows::Part& p = h->part(i, m);
      if (p.first < p.rows) EXPECT_EQ(p.first % kHostRowGranule, 0) << "layer " << i << ", " << m;
      if (p.split()) EXPECT_EQ(p.first, host_row_begin(p.rows, h->share()));
    }
    auto host = [&](int m) { return h->part(i, m).split() ? 1u : 0u; };
    EXPECT_EQ(host(cuda::HostRows::kGate), host(cuda::HostRows::kUp)) << "layer " << i;
    rounds_per_pass +=
        std::max({host(cuda::HostRows::kQ), host(cuda::HostRows::kK), host(cuda::HostRows::kV)}) +
        host(cuda::HostRows::kO) + host(cuda::HostRows::kGate) + host(cuda::HostRows::kDown);
  }
  ASSERT_GT(rounds_per_pass, 0u);
  // A split pass copies each matrix's device rows; the host reads the rest. What neither
  // covers is the blob's padding after each of a split layer's matrices (its 16 bytes of
  // slack, aligned to 256: WeightLayout), nothing more.
  uint64_t split_layers = 0;
  for (size_t i = 0; i < streamer.layers(); ++i) split_layers += streamer.streamed(i) ? 1 : 0;
  const uint64_t covered = streamer.split_bytes_per_pass() + h->host_bytes_per_pass();
  ASSERT_LE(covered, streamer.streamed_bytes_per_pass());
  const uint64_t padding = streamer.streamed_bytes_per_pass() - covered;
  EXPECT_GE(padding, split_layers * cuda::HostRows::kMatrices * WeightLayout::kTensorSlackBytes);
  EXPECT_LE(padding, split_layers * cuda::HostRows::kMatrices *
                         (WeightLayout::kTensorSlackBytes + WeightLayout::kAlignBytes - 1));
  EXPECT_LT(streamer.split_bytes_per_pass(), streamer.streamed_bytes_per_pass());
  EXPECT_EQ(split->model().streamed_bytes_for(1), streamer.split_bytes_per_pass());
  EXPECT_EQ(split->model().streamed_bytes_for(cuda::HostRows::kMaxRows + 1),
            streamer.streamed_bytes_per_pass());

  const int64_t vocab = resident.config.n_vocab;
  Rig reference(path, options(false, false, uint64_t{1} << 40, 0));
  Rig oracle(path, options(false, true, uint64_t{1} << 40, 0));
  constexpr int kSteps = 16;
  for (const int rows : {1, 3}) {
    const std::string what = c.name + ", " + std::to_string(rows) + " rows";
    const std::vector<int32_t> prompt = random_tokens(5, vocab, 7);
    const std::vector<int32_t> tokens = random_tokens(rows * kSteps, vocab, 8);
    const GraphTelemetry graphs_before = split->graphs();
    const TelemetrySnapshot before = split->telemetry();
    const std::vector<float> got = teacher_forced(*split, rows, kSteps, prompt, tokens);
    const GraphTelemetry graphs_after = split->graphs();
    const TelemetrySnapshot after = split->telemetry();
    gpu_test::expect_close_to_oracle(teacher_forced(reference, rows, kSteps, prompt, tokens),
                                     teacher_forced(oracle, rows, kSteps, prompt, tokens), got,
                                     vocab, what + ": teacher-forced decode", false);
    // The step's graph: captured at most once for its bucket, then replayed.
    EXPECT_LE(graphs_after.captures - graphs_before.captures, 1u) << what;
    EXPECT_EQ(graphs_after.recaptures, graphs_before.recaptures) << what;
    EXPECT_GE(graphs_after.replays - graphs_before.replays, static_cast<uint64_t>(kSteps - 1))
        << what;
    // The host answered every round of every pass: the prompts' (5 rows each) and the steps'.
    EXPECT_EQ(after.streaming.host_row_rounds - before.streaming.host_row_rounds,
              rounds_per_pass * static_cast<uint64_t>(rows + kSteps))
        << what;
    EXPECT_EQ(after.streaming.host_row_share, h->share());
    EXPECT_EQ(after.streaming.split_bytes_per_pass, streamer.split_bytes_per_pass());
    // Each split pass counts the bytes it copied, not the whole layers'.
    EXPECT_EQ(after.streaming.h2d_bytes - before.streaming.h2d_bytes,
              streamer.split_bytes_per_pass() * static_cast<uint64_t>(rows + kSteps))
        << what;

    // Greedy tokens: the all-resident run's, each sequence up to where the oracle's choice is
    // a near-tie (its top-two margin within twice the row's bound, as model_gpu_test's greedy
    // answer): the host's products sum in another order than the device's.
    const std::vector<int32_t> want = greedy(resident, rows, kSteps, 30);
    const std::vector<int32_t> have = greedy(*split, rows, kSteps, 30);
    ASSERT_EQ(have.size(), want.size()) << what;
    for (int s = 0; s < rows; ++s) {
      int i = 0;
      while (i <= kSteps && have[static_cast<size_t>(i * rows + s)] ==
                                want[static_cast<size_t>(i * rows + s)])
        ++i;
      if (i > kSteps) continue;
      // Token i came from the logits after the prompt and the i tokens both runs chose.
      std::vector<int32_t> context = random_tokens(6, vocab, 30 + static_cast<uint32_t>(s));
      for (int k = 0; k < i; ++k) context.push_back(want[static_cast<size_t>(k * rows + s)]);
      const std::vector<float> o = oracle.run(0, context, 0, false);
      const std::vector<float> f = reference.run(0, context, 0, false);
      const double spread = gpu_test::spread_of(o.data(), vocab).std;
      const double bound = gpu_test::row_bound(o.data(), f.data(), vocab, spread);
      const double margin = gpu_test::top_two(o).margin;
      std::cout << "[host-rows] " << what << ", sequence " << s << ": greedy tokens diverge at "
                << i << " of " << kSteps + 1 << ", oracle margin " << margin / spread
                << " x spread (near-tie up to " << 2 * bound << ")\n";
      EXPECT_LE(margin, 2 * bound * spread)
          << what << ", sequence " << s << ": greedy tokens diverge at " << i
          << " where the oracle's choice is clear";
    }
  }
  EXPECT_NO_THROW(split->model().check_host_rows());
}

INSTANTIATE_TEST_SUITE_P(Models, HostRowsGpu,
                         ::testing::Values(HostRowsCase{"Q4_0_half", TensorType::Q4_0, 128},
                                           HostRowsCase{"Q4_0_measured", TensorType::Q4_0, -1},
                                           HostRowsCase{"Q4_K_half", TensorType::Q4_K, 128},
                                           HostRowsCase{"Q4_K_measured", TensorType::Q4_K, -1}),
                         [](const ::testing::TestParamInfo<HostRowsCase>& i) {
                           return i.param.name;
                         });

// Setting 0 is the streaming path as it was: no host copies, every byte over PCIe, and the
// logits of the all-resident run bit for bit (the same kernels over the same weights).
TEST(HostRowsGpuOff, SettingZeroStreamsWholeLayersWithTheResidentBits) {
  GRANULE_REQUIRE_GPU();
  const test::TempModel model(spec(TensorType::Q4_0), "granule-gpu-test-host-rows-off");
  const std::filesystem::path& path = model.path;
  Rig resident(path, options(true, false, uint64_t{1} << 40, 0));
  std::unique_ptr<Rig> streamed = half_streamed(path, resident, 0);
  ASSERT_TRUE(streamed) << "no budget streamed half of the layers";
  EXPECT_EQ(streamed->model().host_rows(), nullptr);
  const cuda::WeightStreamer& streamer = streamed->model().streamer();
  EXPECT_EQ(streamed->model().streamed_bytes_for(1), streamer.streamed_bytes_per_pass());
  const int64_t vocab = resident.config.n_vocab;
  const std::vector<int32_t> prompt = random_tokens(5, vocab, 7);
  const std::vector<int32_t> tokens = random_tokens(3 * 8, vocab, 9);
  for (const int rows : {1, 3})
    EXPECT_EQ(bitwise_differences(teacher_forced(*streamed, rows, 8, prompt, tokens),
                                  teacher_forced(resident, rows, 8, prompt, tokens)),
              0u)
        << rows << " rows";
  EXPECT_EQ(streamed->telemetry().streaming.host_row_rounds, 0u);
}

}  // namespace
}  // namespace granule
