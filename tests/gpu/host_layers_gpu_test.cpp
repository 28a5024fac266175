// Host layers (engine/src/backends/cuda/host_layers.h): under a budget of about half of the
// layers' bytes, the plan leaves some streamed layers to the host's threads at small batches,
// the decode step stays one captured graph with a host node in it, and what a user sees does
// not change: every step's logits within the oracle bound of the all-resident GPU run and its
// greedy token the same (near-ties excused, oracle_compare.h), through decode on the host,
// a next turn prefilled on the GPU (the host layers' KV copied to the device KV), decode on
// the host again (the prefill's KV copied back) and a batch past HostLayers::kMaxRows, which
// streams every layer. Also: the graphs are captured once per bucket, and the host KV and pinned
// buffers are in the ledger as HostPinned (not the budget).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/host_layers.h"
#include "gpu_test_support.h"
#include "granule/testkit/synthetic_model.h"
#include "oracle_compare.h"
#include "support/model_runtime.h"

namespace granule {
namespace {

constexpr int64_t kContext = 512;
constexpr int32_t kSlots = 12;

std::filesystem::path model_path() {
  return std::filesystem::temp_directory_path() /
         ("granule-gpu-test-host-layers-" + std::to_string(getpid()) + ".gguf");
}

// Eight Q4_0 layers of ~9 MiB (hidden 1024, FFN 4096, heads of 128): large enough that a host
// node's fixed cost (HostLayers::kNodeSeconds) leaves the plan a split, small enough for the f32
// reference.
SyntheticModelSpec spec() {
  SyntheticModelSpec s = SyntheticModelSpec::preset("small-256");
  s.name = "host-layers";
  s.n_layer = 8;
  s.n_embd = 1024;
  s.n_head = 8;
  s.n_head_kv = 2;
  s.n_ff = 4096;
  s.weight_type = TensorType::Q4_0;
  s.embedding_type = TensorType::Q4_0;
  s.output_type = TensorType::Q4_0;
  s.seed = 41;
  return s;
}

// KV the plan keeps free: one 2 MiB granule per slot (every chat here stays within one), so the
// KV maps under the budget whatever the plan streams.
int64_t kv_reserve_tokens() {
  const auto bytes_per_token = static_cast<uint64_t>(
      ModelConfig::from_gguf(*ModelFile::open(model_path())).kv_bytes_per_token(2));
  return kSlots * static_cast<int64_t>((uint64_t{2} << 20) / bytes_per_token);
}

// The host layers' speed set to the PCIe bandwidth: the plan then splits the streamed layers half
// and half (this model's layers are far too small for the host's measured speed to pay: the
// policy would rightly leave them all to PCIe).
double host_speed() { return probe_cuda_device().h2d_bytes_per_second; }

RuntimeOptions options(DeviceKind device, uint64_t budget) {
  RuntimeOptions o;
  o.device = device;
  o.backend.vram_budget_bytes = budget;
  o.backend.context_length = kContext;
  o.backend.kv_reserve_tokens = kv_reserve_tokens();
  o.backend.cpu_exact_numerics = device == DeviceKind::Cpu;  // the f32 reference
  o.backend.cuda_host_bytes_per_second = host_speed();
  o.context_length = kContext;
  o.slots = kSlots;
  o.kv_pool_granules = 0;
  return o;
}

struct Rig : test::ModelRuntime {
  explicit Rig(DeviceKind device, uint64_t budget = uint64_t{1} << 40)
      : ModelRuntime(model_path(), options(device, budget)) {}
  cuda::CudaModel& model() { return dynamic_cast<cuda::CudaBackend&>(*runtime.backend).model(); }
};

class HostLayersGpu : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string why;
    if (!gpu_test::gpu_present(&why)) return;
    write_synthetic_model(spec(), model_path());
  }
  static void TearDownTestSuite() { std::filesystem::remove(model_path()); }
};

// What the all-resident rig charged, less half of the layers' bytes, plus the KV the plan keeps
// free (the plan is made with the reserve; the resident rig's ledger holds none of it yet).
uint64_t half_budget() {
  Rig resident(DeviceKind::Cuda);
  uint64_t layers = 0;
  for (uint64_t b : resident.model().streamer().layer_bytes()) layers += b;
  const auto kv =
      static_cast<uint64_t>(kv_reserve_tokens() * resident.config.kv_bytes_per_token(2));
  return resident.runtime.memory->used_bytes() + kv - layers / 2;
}

int32_t argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

TEST_F(HostLayersGpu, HalfBudgetLeavesSomeStreamedLayersToTheHost) {
  GRANULE_REQUIRE_GPU();
  Rig rig(DeviceKind::Cuda, half_budget());
  const cuda::WeightStreamer& w = rig.model().streamer();
  std::cout << "[host-layers] resident " << w.resident_layers() << ", streamed "
            << w.streamed_layers() << ", of them on the host " << w.host_layers() << "\n";
  ASSERT_GT(w.streamed_layers(), 0);
  EXPECT_GT(w.resident_layers(), 0);
  ASSERT_GT(w.host_layers(), 0) << "the plan left no streamed layer to the host";
  EXPECT_LE(w.host_layers(), w.streamed_layers());
  ASSERT_NE(rig.model().host_layers(), nullptr);
  EXPECT_EQ(rig.model().host_layers()->count(), w.host_layers());
  EXPECT_LT(w.streamed_bytes_per_pass(true), w.streamed_bytes_per_pass(false));
  for (size_t i = 0; i < w.layers(); ++i)
    if (w.host_layer(i)) EXPECT_TRUE(w.streamed(i)) << "layer " << i;
  EXPECT_TRUE(rig.model().takes_host_pass(1));
  EXPECT_TRUE(rig.model().takes_host_pass(cuda::HostLayers::kMaxRows));
  EXPECT_FALSE(rig.model().takes_host_pass(cuda::HostLayers::kMaxRows + 1));
}

// Teacher-forced steps of the same batches on the all-resident GPU rig (the oracle), the CPU f32
// reference and the rig under the half budget; the resident rig's greedy tokens drive all three.
TEST_F(HostLayersGpu, DecodeOnTheHostMatchesAllResident) {
  GRANULE_REQUIRE_GPU();
  const uint64_t budget = half_budget();
  Rig resident(DeviceKind::Cuda), reference(DeviceKind::Cpu), host(DeviceKind::Cuda, budget);
  ASSERT_GT(host.model().streamer().host_layers(), 0);
  const int64_t vocab = resident.config.n_vocab;
  std::vector<float> oracle, ref, got;
  auto step = [&](const std::vector<BatchSequence>& batch) {
    const std::vector<float> o = resident.step(batch);
    oracle.insert(oracle.end(), o.begin(), o.end());
    const std::vector<float> r = reference.step(batch);
    ref.insert(ref.end(), r.begin(), r.end());
    const std::vector<float> g = host.step(batch);
    got.insert(got.end(), g.begin(), g.end());
    return o;
  };
  // Two chats' prompts (a prefill of 9 rows and one of 90: device passes), then decode steps of
  // both (bucket 2: host passes).
  std::vector<std::vector<int32_t>> prompts = {test::random_tokens(9, vocab, 5),
                                               test::random_tokens(90, vocab, 6)};
  std::vector<int64_t> length = {9, 90};
  std::vector<int32_t> next(2);
  for (int s = 0; s < 2; ++s) {
    const std::vector<float> o = step({{s, prompts[static_cast<size_t>(s)], 0, false}});
    next[static_cast<size_t>(s)] = argmax(o.data(), vocab);
  }
  auto decode = [&](int steps) {
    for (int i = 0; i < steps; ++i) {
      std::vector<std::vector<int32_t>> tokens = {{next[0]}, {next[1]}};
      const std::vector<float> o =
          step({{0, tokens[0], length[0], false}, {1, tokens[1], length[1], false}});
      for (int s = 0; s < 2; ++s) {
        next[static_cast<size_t>(s)] = argmax(o.data() + s * vocab, vocab);
        ++length[static_cast<size_t>(s)];
      }
    }
  };
  decode(24);
  const uint64_t passes = host.model().host_layers()->passes();
  EXPECT_GE(passes, 24u) << "the decode steps did not run the host layers";
  // A next turn of chat 0 prefilled on the GPU: it reads the host layers' KV of the 24 decoded
  // tokens, which only the host had.
  std::vector<int32_t> turn = test::random_tokens(70, vocab, 7);
  turn.insert(turn.begin(), next[0]);
  const std::vector<float> o = step({{0, turn, length[0], false}});
  length[0] += static_cast<int64_t>(turn.size());
  next[0] = argmax(o.data(), vocab);
  EXPECT_GE(host.model().host_layers()->kv_tokens_to_device(), 24u);
  // Decode on the host again: its attention reads the turn's KV, which only the device had.
  decode(12);
  EXPECT_GE(host.model().host_layers()->kv_tokens_to_host(), 70u);
  // A batch of kMaxRows + 2 chats (bucket 16): every layer streamed, the host layers' KV of the
  // two running chats copied to the device first.
  {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<BatchSequence> batch;
    for (int s = 0; s < cuda::HostLayers::kMaxRows + 2; ++s)
      tokens.push_back(s < 2 ? std::vector<int32_t>{next[static_cast<size_t>(s)]}
                             : test::random_tokens(1, vocab, 100 + static_cast<uint32_t>(s)));
    for (int s = 0; s < cuda::HostLayers::kMaxRows + 2; ++s)
      batch.push_back(
          {s, tokens[static_cast<size_t>(s)], s < 2 ? length[static_cast<size_t>(s)] : 0, false});
    const std::vector<float> wide = step(batch);
    for (int s = 0; s < 2; ++s) {
      next[static_cast<size_t>(s)] = argmax(wide.data() + s * vocab, vocab);
      ++length[static_cast<size_t>(s)];
    }
  }
  decode(6);
  gpu_test::expect_close_to_oracle(ref, oracle, got, vocab, "host layers, teacher-forced", false);

  // One graph per bucket (1 for the single prompts is a prefill: eager), no re-capture.
  const GraphTelemetry g = host.graphs();
  EXPECT_LE(g.captures, 3u);
  EXPECT_GT(g.replays, 0u);
  EXPECT_GT(host.runtime.memory->bytes(MemoryCategory::HostPinned), 0u);
  EXPECT_LE(host.runtime.memory->used_bytes(), host.runtime.memory->budget_bytes());
}

}  // namespace
}  // namespace granule
