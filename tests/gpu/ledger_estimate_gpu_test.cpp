// The fit preview against the ledger: a synthetic model loaded on the GPU at a full budget and
// at a streaming one, Engine::estimate's plan (made from the weight-layout table and the
// workspace list) against what the MemoryManager then holds, category by category. Weights
// resident, staging and workspace must match to the byte; KV reserved VA to the granule; the
// KV committed and pooled must fit the room the estimate leaves; Graphs and Other hold nothing.
// Also: the workspace stays what was estimated after steps that capture graphs and take the
// GEMM path, the kernels' attention scratch formula is the list's, and estimates after an
// engine was opened reuse its bandwidth measurement instead of measuring again.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "attention.cuh"
#include "backends/cuda/h2d_bandwidth.h"
#include "backends/kernel_config_env.h"
#include "gpu_test_support.h"
#include "granule/engine.h"
#include "granule/gguf.h"
#include "granule/testkit/synthetic_model.h"
#include "memory/weight_layout.h"
#include "memory/workspace_layout.h"
#include "support/temp_model.h"

namespace granule {
namespace {

std::filesystem::path model_path() {
  return std::filesystem::temp_directory_path() /
         ("granule-gpu-test-ledger-" + std::to_string(getpid()) + ".gguf");
}

// Eight layers of 256 wide, heads of 64 (what the CUDA kernels take), Q4_0 layers, Q8_0
// embeddings and a Q6_K head: every matrix in the split layout, the head apart from the
// embeddings.
SyntheticModelSpec spec() {
  return {.n_layer = 8,
          .n_embd = 256,
          .n_head = 4,
          .n_head_kv = 2,
          .n_ff = 512,
          .n_vocab = 2048,
          .weight_type = TensorType::Q4_0,
          .embedding_type = TensorType::Q8_0,
          .output_type = TensorType::Q6_K};
}

class LedgerEstimateGpu : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string why;
    if (!gpu_test::gpu_present(&why)) return;
    write_synthetic_model(spec(), model_path());
  }
  static void TearDownTestSuite() { std::filesystem::remove(model_path()); }
};

EngineOptions options(uint64_t budget) {
  return {.device = DeviceKind::Cuda,
          .context_length = 1024,
          .max_sequences = 4,
          .vram_budget_bytes = budget};
}

uint64_t ledger(const TelemetrySnapshot& t, MemoryCategory c) { return t.device.ledger_bytes(c); }

// The estimate against the ledger of an engine just opened with the same options.
void expect_ledger_matches(const FitEstimate& e, const TelemetrySnapshot& t) {
  std::cout << "estimate: " << e.resident_layers << " resident, " << e.streamed_layers
            << " streamed; weights " << e.resident_weight_bytes << ", staging " << e.staging_bytes
            << ", workspace " << e.workspace_bytes << "\nledger:   " << t.streaming.layers_resident
            << " resident, " << t.streaming.layers_streamed << " streamed; weights "
            << ledger(t, MemoryCategory::WeightsResident) << ", staging "
            << ledger(t, MemoryCategory::WeightsStaging) << ", workspace "
            << ledger(t, MemoryCategory::Workspace) << "\n";
  // The placement: the same layers resident.
  EXPECT_EQ(t.streaming.layers_resident, e.resident_layers);
  EXPECT_EQ(t.streaming.layers_streamed, e.streamed_layers);
  ASSERT_EQ(t.streaming.layer_streamed.size(), e.layer_streamed.size());
  for (size_t i = 0; i < e.layer_streamed.size(); ++i)
    EXPECT_EQ(t.streaming.layer_streamed[i] != 0, e.layer_streamed[i]) << "layer " << i;
  // Weights, staging and workspace: exact.
  EXPECT_EQ(ledger(t, MemoryCategory::WeightsResident), e.resident_weight_bytes);
  EXPECT_EQ(ledger(t, MemoryCategory::WeightsStaging), e.staging_bytes);
  EXPECT_EQ(t.streaming.streamed_bytes_per_pass, e.streamed_bytes_per_pass);
  EXPECT_EQ(ledger(t, MemoryCategory::Workspace), e.workspace_bytes);
  // KV reserved VA: each chat's full context, rounded up to a granule (2 MiB on these GPUs).
  const uint64_t kv_exact = e.kv_bytes_per_token * static_cast<uint64_t>(e.context_per_chat) *
                            static_cast<uint64_t>(e.chats);
  constexpr uint64_t kGranule = 2ull << 20;
  EXPECT_GE(ledger(t, MemoryCategory::KvReservedVa), kv_exact);
  EXPECT_LT(ledger(t, MemoryCategory::KvReservedVa),
            kv_exact + static_cast<uint64_t>(e.chats) * kGranule);
  // KV committed and pooled: within the room the plan leaves beside what it holds.
  // Recurrent state slots (Qwen3.5): one per chat.
  const uint64_t states = e.recurrent_state_bytes();
  EXPECT_EQ(ledger(t, MemoryCategory::RecurrentState), states);
  const uint64_t held = e.resident_weight_bytes + e.staging_bytes + e.workspace_bytes + states;
  const uint64_t kv_physical =
      ledger(t, MemoryCategory::KvCommitted) + ledger(t, MemoryCategory::KvPool);
  EXPECT_LE(held + kv_physical, t.device.budget_bytes);
  // Nothing else: graphs and other buffers are charged nowhere.
  EXPECT_EQ(ledger(t, MemoryCategory::Graphs), 0u);
  EXPECT_EQ(ledger(t, MemoryCategory::Other), 0u);
  EXPECT_EQ(t.device.used_bytes, held + kv_physical);
}

// Decode steps (captured graphs) and a 150-token prompt (the GEMM path, cuBLAS).
void generate(Engine& engine) {
  SamplingParams greedy = SamplingParams::greedy();
  greedy.max_tokens = 16;
  greedy.ignore_eos = true;
  std::vector<TokenId> prompt(150);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<TokenId>(3 + i * 7 % 2000);
  engine.submit({.prompt_tokens = prompt, .sampling = greedy});
  prompt.resize(9);
  engine.submit({.prompt_tokens = prompt, .sampling = greedy});
  for (int i = 0; i < 10000 && engine.step(); ++i) {
  }
  EXPECT_TRUE(engine.idle());
}

TEST_F(LedgerEstimateGpu, AtTheGpusOwnBudgetEveryLayerIsResidentAndTheLedgerIsTheEstimate) {
  GRANULE_REQUIRE_GPU();
  const EngineOptions o = options(0);
  const FitEstimate e = Engine::estimate(model_path(), o);
  ASSERT_TRUE(e.loads);
  auto engine = Engine::open(model_path(), o);
  const TelemetrySnapshot t = engine->telemetry();
  EXPECT_EQ(e.streamed_layers, 0);
  expect_ledger_matches(e, t);
  generate(*engine);
  const TelemetrySnapshot after = engine->telemetry();
  EXPECT_EQ(ledger(after, MemoryCategory::Workspace), e.workspace_bytes);
  EXPECT_EQ(ledger(after, MemoryCategory::WeightsResident), e.resident_weight_bytes);
  EXPECT_GT(after.graphs.captures, 0u);
}

TEST_F(LedgerEstimateGpu, AtAStreamingBudgetThePlanAndEveryWeightCategoryAreTheEstimates) {
  GRANULE_REQUIRE_GPU();
  const FitEstimate full = Engine::estimate(model_path(), options(1ull << 30));
  ASSERT_EQ(full.streamed_layers, 0);
  // Four of the eight layers above the minimum (every layer streamed), and half a layer more
  // so that no decision sits on a byte boundary.
  const auto file = ModelFile::open(model_path());
  const ModelConfig config = ModelConfig::from_gguf(*file);
  const WeightLayout layout = weight_layout(config, WeightTable::from_gguf(*file, config),
                                            kernel_config_from_environment().split_weights);
  const uint64_t layer = layout.layers[0].bytes;
  const uint64_t budget = full.minimum_budget_bytes + 4 * layer + layer / 2;
  const FitEstimate e = Engine::estimate(model_path(), options(budget));
  ASSERT_TRUE(e.loads);
  EXPECT_GT(e.streamed_layers, 0);
  EXPECT_GT(e.resident_layers, 0);
  auto engine = Engine::open(model_path(), options(budget));
  expect_ledger_matches(e, engine->telemetry());
  generate(*engine);
  const TelemetrySnapshot after = engine->telemetry();
  EXPECT_LE(after.device.used_bytes, after.device.budget_bytes);
  EXPECT_EQ(ledger(after, MemoryCategory::Workspace), e.workspace_bytes);
}

// A Qwen3.5-shaped hybrid (Gated DeltaNet and attention layers, heads the CUDA kernels take):
// the estimate holds its recurrent state slots and section rope table as the backend does, at
// the GPU's own budget and at one that streams layers.
TEST(LedgerEstimateHybridGpu, TheRecurrentStateAndSectionRopeAreWhereTheEstimateSays) {
  GRANULE_REQUIRE_GPU();
  SyntheticModelSpec s = gpu_test::qwen35_spec(TensorType::Q4_0);
  s.name = "tiny-qwen35-ledger";
  s.n_vocab = 2048;  // generate()'s prompt tokens
  s.embedding_type = TensorType::Q8_0;
  s.output_type = TensorType::Q6_K;
  test::TempModel model(s, "ledger-hybrid");
  const FitEstimate full = Engine::estimate(model.path, options(0));
  ASSERT_TRUE(full.loads);
  EXPECT_GT(full.recurrent_state_bytes_per_chat, 0u);
  {
    auto engine = Engine::open(model.path, options(0));
    expect_ledger_matches(full, engine->telemetry());
    generate(*engine);
  }
  const FitEstimate small = Engine::estimate(model.path, options(1ull << 30));
  const auto file = ModelFile::open(model.path);
  const ModelConfig config = ModelConfig::from_gguf(*file);
  const WeightLayout layout = weight_layout(config, WeightTable::from_gguf(*file, config),
                                            kernel_config_from_environment().split_weights);
  const uint64_t layer = layout.layers[0].bytes;
  const uint64_t budget = small.minimum_budget_bytes + 2 * layer + layer / 2;
  const FitEstimate e = Engine::estimate(model.path, options(budget));
  ASSERT_TRUE(e.loads);
  EXPECT_GT(e.streamed_layers, 0);
  auto engine = Engine::open(model.path, options(budget));
  expect_ledger_matches(e, engine->telemetry());
  generate(*engine);
}

TEST_F(LedgerEstimateGpu, TheListsAttentionScratchIsTheKernelsFormula) {
  GRANULE_REQUIRE_GPU();
  const SyntheticModelSpec s = spec();
  const int head_dim = static_cast<int>(s.n_embd / s.n_head);
  for (int rows : {64, 512})
    for (int context : {1, 1000, 4096}) {
      const int decode = (context + kDecodeSplitTokens - 1) / kDecodeSplitTokens;
      const int prefill = (context + kPrefillSplitTokens - 1) / kPrefillSplitTokens;
      const size_t floats = std::max(
          kernels::attention_workspace_floats(64, static_cast<int>(s.n_head), decode, head_dim),
          kernels::attention_workspace_floats(rows, static_cast<int>(s.n_head), prefill, head_dim));
      ModelConfig c;
      c.n_embd = s.n_embd;
      c.n_head = s.n_head;
      c.n_head_kv = s.n_head_kv;
      c.head_dim = head_dim;
      c.n_ff = s.n_ff;
      c.n_vocab = s.n_vocab;
      const CudaWorkspace w = cuda_workspace(c, WeightLayout{}, rows, context, 1);
      EXPECT_EQ(w.bytes("attention_partial"), floats * sizeof(float)) << rows << " " << context;
    }
}

TEST_F(LedgerEstimateGpu, EstimatesAfterAnEngineOpenedReuseItsBandwidth) {
  GRANULE_REQUIRE_GPU();
  auto engine = Engine::open(model_path(), options(0));
  const double measured = engine->telemetry().streaming.h2d_bandwidth_bytes_per_second;
  const uint64_t measurements = cuda::h2d_bandwidth_cache().measurements();
  EXPECT_EQ(measurements, 1u);  // once per process, whichever asked first
  size_t free_before = 0, free_after = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free_before, &total));
  for (int i = 0; i < 5; ++i) {
    const FitEstimate e = Engine::estimate(model_path(), options(0));
    EXPECT_TRUE(e.h2d_measured);
    EXPECT_EQ(e.h2d_bytes_per_second, measured);
  }
  CUDA_OK(cudaMemGetInfo(&free_after, &total));
  EXPECT_EQ(cuda::h2d_bandwidth_cache().measurements(), measurements);
  EXPECT_EQ(free_after, free_before);  // no buffer held or left behind by the estimates
  std::cout << "host-to-device " << measured / 1e9 << " GB/s, measured "
            << cuda::h2d_bandwidth_cache().measurements() << " time(s)\n";
}

}  // namespace
}  // namespace granule
