// Tests of Engine::estimate, the fit preview from the file alone: KV per token in the element
// type of the backend the options pick (f32 on the CPU, twice the f16 of CUDA), the same
// weights and KV reservation the opened engine then charges, the GPU plan made from the
// weight-layout table and the workspace list CudaModel allocates from, the budget arithmetic,
// the host-to-device bandwidth measured at most once however often it is asked, and clear
// errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/int8_packed.h"
#include "backends/kernel_config_env.h"
#include "backends/measured_once.h"
#include "granule/engine.h"
#include "granule/error.h"
#include "granule/gguf.h"
#include "granule/model_config.h"
#include "granule/testkit/synthetic_model.h"
#include "memory/placement.h"
#include "memory/weight_layout.h"
#include "memory/workspace_layout.h"
#include "support/temp_model.h"
#ifdef GRANULE_HAVE_CUDA
#include "backends/cuda/h2d_bandwidth.h"
#endif

namespace granule {
namespace {

using test::TempModel;

// 2 layers, 2 KV heads of 16: 2 × 2 × 2 × 16 = 128 K and V elements per token; a 4,096-token
// context of f32 KV is then exactly one 2 MiB granule per slot.
SyntheticModelSpec spec() {
  SyntheticModelSpec s = SyntheticModelSpec::preset("tiny");
  s.context_length = 4096;
  return s;
}

EngineOptions options(DeviceKind device, uint64_t budget = 0) {
  EngineOptions o;
  o.device = device;
  o.cpu_threads = 2;
  o.context_length = 4096;
  o.max_sequences = 3;
  o.vram_budget_bytes = budget;
  return o;
}

// The CUDA backend's tables for a model file: its weight layout, and the workspace list for
// the options' prefill chunk (512 rows), `context` and chats.
WeightLayout layout_of(const std::filesystem::path& path) {
  const auto file = ModelFile::open(path);
  const ModelConfig config = ModelConfig::from_gguf(*file);
  return weight_layout(config, WeightTable::from_gguf(*file, config),
                       kernel_config_from_environment().split_weights);
}

CudaWorkspace workspace_of(const std::filesystem::path& path, int64_t context) {
  const auto file = ModelFile::open(path);
  return cuda_workspace(ModelConfig::from_gguf(*file), layout_of(path), 512, context, 3);
}

TEST(FitEstimate, KvPerTokenOnTheCpuIsF32TwiceTheF16OfCuda) {
  const TempModel model(spec(), "granule_fit");
  const FitEstimate cpu = Engine::estimate(model.path, options(DeviceKind::Cpu));
  // A budget makes the CUDA estimate a plan for a GPU: no GPU is needed for it.
  const FitEstimate cuda = Engine::estimate(model.path, options(DeviceKind::Cuda, 1ull << 30));
  EXPECT_FALSE(cpu.gpu);
  EXPECT_TRUE(cuda.gpu);
  EXPECT_EQ(cpu.kv_element_bytes, 4);
  EXPECT_EQ(cuda.kv_element_bytes, 2);
  EXPECT_EQ(cpu.kv_bytes_per_token, 128u * 4);
  EXPECT_EQ(cuda.kv_bytes_per_token, 128u * 2);
  EXPECT_EQ(cpu.kv_bytes_per_token, 2 * cuda.kv_bytes_per_token);
  // The file's weights do not depend on the backend; the workspace does (the CUDA backend's
  // buffers, sized as cuda_model.cpp allocates them, against the CPU's allowance).
  EXPECT_EQ(cpu.weights_bytes, cuda.weights_bytes);
  EXPECT_GT(cuda.workspace_bytes, 0u);
  // Twice the KV per token: each side's capacity is its budget's rest over its KV per token;
  // the GPU's plan holds its weights in the device layout (aligned, padded), a little larger.
  const FitEstimate cpu_same_budget =
      Engine::estimate(model.path, options(DeviceKind::Cpu, 1ull << 30));
  EXPECT_EQ(cpu_same_budget.kv_capacity_tokens,
            static_cast<int64_t>(((1ull << 30) - cpu.weights_bytes - cpu.workspace_bytes) /
                                 (2 * cuda.kv_bytes_per_token)));
  EXPECT_EQ(
      cuda.kv_capacity_tokens,
      static_cast<int64_t>(((1ull << 30) - cuda.resident_weight_bytes - cuda.workspace_bytes) /
                           cuda.kv_bytes_per_token));
  EXPECT_GE(cuda.resident_weight_bytes, cuda.weights_bytes);
}

TEST(FitEstimate, TheGpuPlanIsTheWeightLayoutAndTheWorkspaceListCudaModelAllocates) {
  SyntheticModelSpec q4 = spec();
  q4.weight_type = TensorType::Q4_0;  // split rows where the kernels read them
  const TempModel model(q4, "granule_fit");
  const FitEstimate e = Engine::estimate(model.path, options(DeviceKind::Cuda, 1ull << 30));
  const DeviceWeightSizes sizes = layout_of(model.path).sizes();
  const CudaWorkspace workspace = workspace_of(model.path, 4096);
  EXPECT_EQ(e.resident_layers, 2);
  EXPECT_EQ(e.resident_weight_bytes, sizes.total());
  // 1 GiB is roomy: the model takes the prefill overlap's second f16 scratch.
  EXPECT_EQ(e.workspace_bytes, workspace.total() + workspace.overlap_bytes);
  // The minimum is the plan's without that scratch: fixed weights, a ring of two of the
  // largest layer, the workspace and 512 tokens of f16 KV.
  const uint64_t largest = std::max(sizes.layer_bytes[0], sizes.layer_bytes[1]);
  EXPECT_EQ(e.kv_reserve_bytes, 512 * e.kv_bytes_per_token);
  EXPECT_EQ(e.minimum_budget_bytes,
            sizes.fixed_bytes + 2 * largest + workspace.total() + e.kv_reserve_bytes);
  // At that minimum (which, with two layers of one size, holds both resident instead of a
  // ring of two) the overlap's scratch does not fit, and is left out.
  const FitEstimate tight =
      Engine::estimate(model.path, options(DeviceKind::Cuda, e.minimum_budget_bytes));
  EXPECT_TRUE(tight.loads);
  EXPECT_EQ(tight.resident_layers, 2);
  EXPECT_EQ(tight.workspace_bytes, workspace.total());
  EXPECT_FALSE(
      Engine::estimate(model.path, options(DeviceKind::Cuda, e.minimum_budget_bytes - 1)).loads);
}

TEST(FitEstimate, TheBandwidthCacheMeasuresOnceHoweverOftenAndFromHoweverManyThreads) {
  MeasuredOnce cache;
  std::atomic<int> calls{0};
  auto measure = [&] {
    ++calls;
    return 55e9;
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) threads.emplace_back([&] { EXPECT_EQ(cache.get(measure), 55e9); });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(cache.get(measure), 55e9);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(cache.measurements(), 1u);
  // A measurement that throws caches nothing: the next one runs.
  MeasuredOnce failing;
  EXPECT_FALSE(failing.cached());
  EXPECT_THROW(failing.get([]() -> double { throw std::runtime_error("no device"); }),
               std::runtime_error);
  EXPECT_FALSE(failing.cached());
  EXPECT_EQ(failing.get([] { return 1.0; }), 1.0);
  EXPECT_EQ(failing.measurements(), 2u);
}

TEST(FitEstimate, RepeatedEstimatesDoNotMeasureTheBandwidthAgain) {
  const TempModel model(spec(), "granule_fit");
  std::vector<double> bandwidths;
  for (int i = 0; i < 4; ++i) {
    const FitEstimate e = Engine::estimate(model.path, options(DeviceKind::Auto, 1ull << 30));
    bandwidths.push_back(e.h2d_bytes_per_second);
  }
  EXPECT_EQ(std::count(bandwidths.begin(), bandwidths.end(), bandwidths[0]), 4);
#ifdef GRANULE_HAVE_CUDA
  // With a GPU the first estimate measured (through a ledger); without one none did.
  EXPECT_LE(cuda::h2d_bandwidth_cache().measurements(), 1u);
#endif
}

TEST(FitEstimate, MatchesWhatTheOpenedCpuEngineCharges) {
  const TempModel model(spec(), "granule_fit");
  const FitEstimate e = Engine::estimate(model.path, options(DeviceKind::Cpu));
  const TelemetrySnapshot t = Engine::open(model.path, options(DeviceKind::Cpu))->telemetry();
  EXPECT_EQ(e.weights_bytes, t.device.ledger_bytes(MemoryCategory::WeightsResident));
  EXPECT_EQ(e.budget_bytes, t.device.budget_bytes);  // host memory, the CPU backend's default
  // Every slot reserves its full context of KV: one granule here, so no rounding hides a
  // wrong element size.
  EXPECT_EQ(e.kv_bytes_per_token * static_cast<uint64_t>(e.context_per_chat) *
                static_cast<uint64_t>(e.chats),
            t.device.ledger_bytes(MemoryCategory::KvReservedVa));
  EXPECT_EQ(e.config.n_layer, 2);
  EXPECT_EQ(e.config.name, spec().name);
  EXPECT_EQ(e.block_type, "F32");
  EXPECT_GT(e.parameters, 0u);
  EXPECT_GT(e.file_bytes, e.weights_bytes);  // header, metadata and vocabulary besides
}

TEST(FitEstimate, AutoPicksTheBackendOpenPicks) {
  const TempModel model(spec(), "granule_fit");
  const FitEstimate e = Engine::estimate(model.path, options(DeviceKind::Auto));
  const TelemetrySnapshot t = Engine::open(model.path, options(DeviceKind::Auto))->telemetry();
  EXPECT_EQ(e.gpu, t.device.gpu);
  EXPECT_EQ(e.kv_element_bytes, e.gpu ? 2 : 4);
  bool gpu_usable = false;
#ifdef GRANULE_HAVE_CUDA
  try {
    probe_cuda_device();
    gpu_usable = true;
  } catch (const DeviceError&) {
  }
#endif
  // "tiny"'s heads of 16 are CPU-only: Auto picks the CPU on a GPU machine too (the line above).
  if (gpu_usable) EXPECT_FALSE(e.gpu);
  // No usable GPU (or none built in): asking for CUDA without a budget cannot be estimated.
  if (!gpu_usable) EXPECT_THROW(Engine::estimate(model.path, options(DeviceKind::Cuda)), Error);
}

TEST(FitEstimate, BudgetArithmetic) {
  const TempModel model(spec(), "granule_fit");
  const FitEstimate roomy = Engine::estimate(model.path, options(DeviceKind::Cpu, 1ull << 30));
  const uint64_t fixed = roomy.weights_bytes + roomy.workspace_bytes;
  EXPECT_EQ(roomy.budget_bytes, 1ull << 30);
  EXPECT_EQ(roomy.kv_capacity_tokens,
            static_cast<int64_t>(((1ull << 30) - fixed) / roomy.kv_bytes_per_token));
  EXPECT_EQ(roomy.max_context_per_chat, 4096);  // capped at the trained context
  EXPECT_TRUE(roomy.fits);

  // Room for 1,000 tokens per chat.
  const uint64_t tight_budget = fixed + 3 * 1000 * roomy.kv_bytes_per_token;
  const FitEstimate tight = Engine::estimate(model.path, options(DeviceKind::Cpu, tight_budget));
  EXPECT_EQ(tight.kv_capacity_tokens, 3000);
  EXPECT_EQ(tight.max_context_per_chat, 1000);
  EXPECT_FALSE(tight.fits);
  EXPECT_EQ(tight.context_per_chat, 4096);

  const FitEstimate none = Engine::estimate(model.path, options(DeviceKind::Cpu, fixed / 2));
  EXPECT_EQ(none.kv_capacity_tokens, 0);
  EXPECT_EQ(none.max_context_per_chat, 0);
  EXPECT_FALSE(none.fits);

  // A context past the model's is clamped as open() clamps it.
  EngineOptions long_context = options(DeviceKind::Cpu, 1ull << 30);
  long_context.context_length = 1 << 20;
  EXPECT_EQ(Engine::estimate(model.path, long_context).context_per_chat, 4096);
}

// The placement plan for a GPU (planned here without one: a budget is given). Six layers of
// the same size, so the staging ring is two of them and every budget step is one layer.
SyntheticModelSpec six_layers() {
  SyntheticModelSpec s = spec();
  s.n_layer = 6;
  return s;
}

// Every layer streamed or resident as a trailing run: resident from layer 0, then streamed.
void expect_trailing_run(const FitEstimate& e) {
  ASSERT_EQ(e.layer_streamed.size(), static_cast<size_t>(e.resident_layers + e.streamed_layers));
  for (size_t i = 0; i < e.layer_streamed.size(); ++i)
    EXPECT_EQ(e.layer_streamed[i], static_cast<int32_t>(i) >= e.resident_layers) << "layer " << i;
}

TEST(FitEstimate, APlanForAGpuNeedsNoGpu) {
  const TempModel model(six_layers(), "granule_fit");
  const FitEstimate e = Engine::estimate(model.path, options(DeviceKind::Cuda, 1ull << 30));
  EXPECT_TRUE(e.gpu);
  EXPECT_TRUE(e.loads);
  EXPECT_EQ(e.budget_bytes, 1ull << 30);
  EXPECT_EQ(e.resident_layers, 6);
  EXPECT_EQ(e.streamed_layers, 0);
  EXPECT_EQ(e.layer_streamed, std::vector<bool>(6, false));
  EXPECT_EQ(e.staging_bytes, 0u);
  EXPECT_EQ(e.streamed_bytes_per_pass, 0u);
  EXPECT_EQ(e.pcie_tokens_per_second, 0.0);  // nothing streams: no bound
  EXPECT_GT(e.h2d_bytes_per_second, 0.0);
  // One prefill chunk of KV is kept free: min(context, 512) tokens.
  EXPECT_EQ(e.kv_reserve_bytes, e.kv_bytes_per_token * 512);
}

// Gemma 4 E4B's real shape (headers only: zero data, holes in the file): the plan counts what
// the CUDA backend allocates for the per-layer embeddings (cuda_gemma4.cpp) — their projection,
// gates and projections and their norms resident beside the embeddings, their inputs and scratch
// in the workspace list — and not the token table of 262,144 x 10,752, which stays in pinned
// host memory (host_pinned_bytes, outside the budget).
TEST(FitEstimate, Gemma4PerLayerEmbeddingsCountWhereTheCudaBackendHoldsThem) {
  SyntheticModelSpec s = SyntheticModelSpec::preset("gemma4-e4b");
  s.zero_data = true;
  const TempModel model(s, "granule_fit_gemma4");
  const auto file = ModelFile::open(model.path);
  const ModelConfig c = ModelConfig::from_gguf(*file);
  const WeightTable weights = WeightTable::from_gguf(*file, c);
  // The shape the preset says.
  EXPECT_EQ(c.architecture, "gemma4");
  EXPECT_EQ(c.n_layer, 42);
  EXPECT_EQ(c.n_embd, 2560);
  EXPECT_EQ(c.n_embd_per_layer, 256);
  EXPECT_EQ(c.n_vocab, 262144);
  EXPECT_EQ(c.sliding_window, 512);
  EXPECT_TRUE(c.layer_slides(0) && !c.layer_slides(5) && !c.layer_slides(41));
  EXPECT_EQ(c.head_dim_of(0), 256);
  EXPECT_EQ(c.head_dim_of(5), 512);
  EXPECT_EQ(c.n_head_kv_of(0), 2);
  EXPECT_EQ(c.n_head_kv_of(5), 2);
  EXPECT_EQ(c.rope_dims_of(0), 256);
  EXPECT_EQ(c.kv_source(23), 23);  // the last layer with its own KV
  EXPECT_EQ(c.kv_source(24), 22);  // sliding: the last earlier sliding layer's
  EXPECT_EQ(c.kv_source(41), 23);  // global: layer 23's
  EXPECT_EQ(c.n_ff_of(41), 10240);
  EXPECT_EQ(weights.layers[5].wv, nullptr);  // V = K on the global layers
#ifdef GRANULE_HAVE_CUDA
  EXPECT_EQ(cuda_model_refusal(c, weights), "");  // the CUDA backend runs this shape
#endif

  const WeightLayout layout =
      weight_layout(c, weights, kernel_config_from_environment().split_weights);
  ASSERT_EQ(layout.per_layer.size(), 1u + 2 * 42);
  uint64_t matrices = 0;
  for (const MatrixLayout& m : layout.per_layer) matrices += m.padded_bytes;
  EXPECT_EQ(layout.per_layer_matrix_bytes, matrices);
  EXPECT_EQ(layout.per_layer[0].tensor->name, "per_layer_model_proj.weight");
  EXPECT_EQ(layout.per_layer[1].tensor->name, "blk.0.inp_gate.weight");
  EXPECT_EQ(layout.per_layer[84].tensor->name, "blk.41.proj.weight");
  EXPECT_EQ(layout.per_layer_vector_bytes, (256u + 42u * 2560u) * sizeof(float));
  // The table: Q6_K rows of 10,752 (210 bytes a block of 256), as stored, padded.
  EXPECT_EQ(layout.per_layer_table.tensor->name, "per_layer_token_embd.weight");
  EXPECT_FALSE(layout.per_layer_table.split);
  EXPECT_EQ(layout.per_layer_table_bytes,
            WeightLayout::align_up(262144ull * 42 * 210 + WeightLayout::kTensorSlackBytes));
  const DeviceWeightSizes sizes = layout.sizes();
  EXPECT_EQ(sizes.fixed_bytes, layout.fixed_matrix_bytes + layout.vector_floats * sizeof(float) +
                                   layout.rope_bytes + layout.per_layer_matrix_bytes +
                                   layout.per_layer_vector_bytes);
  const CudaWorkspace workspace = workspace_of(model.path, 4096);
  EXPECT_EQ(workspace.bytes("ple_inputs"), 512u * 42 * 256 * sizeof(float));
  EXPECT_EQ(workspace.bytes("ple_scratch"), 512u * 42 * 256 * sizeof(float));

  const FitEstimate e = Engine::estimate(model.path, options(DeviceKind::Cuda, 24ull << 30));
  EXPECT_TRUE(e.loads);
  EXPECT_EQ(e.resident_layers, 42);
  EXPECT_EQ(e.resident_weight_bytes, sizes.total());
  EXPECT_EQ(e.workspace_bytes, workspace.total() + workspace.overlap_bytes);
  EXPECT_EQ(e.host_pinned_bytes, layout.per_layer_table_bytes);
  // The file's weights hold the table; the device's do not (it is most of what E4B adds).
  EXPECT_LT(e.resident_weight_bytes + layout.per_layer_table.bytes / 2, e.weights_bytes);
  EXPECT_GT(e.resident_weight_bytes + e.host_pinned_bytes, e.weights_bytes);
  // Below what the resident weights (the per-layer matrices included), a ring of staging and
  // the workspace need, nothing loads.
  EXPECT_GE(e.minimum_budget_bytes, sizes.fixed_bytes + workspace.total() + e.kv_reserve_bytes);
  EXPECT_FALSE(
      Engine::estimate(model.path, options(DeviceKind::Cuda, e.minimum_budget_bytes - 1)).loads);
  // The CPU holds everything in host memory as weights: nothing pinned apart.
  EXPECT_EQ(Engine::estimate(model.path, options(DeviceKind::Cpu)).host_pinned_bytes, 0u);
}

TEST(FitEstimate, StreamedLayersGrowAsTheBudgetShrinks) {
  const TempModel model(six_layers(), "granule_fit");
  const FitEstimate roomy = Engine::estimate(model.path, options(DeviceKind::Cuda, 1ull << 30));
  const uint64_t device_weights = roomy.resident_weight_bytes;  // every layer resident
  // All resident: device weights, workspace and the KV reserve. (A roomy budget also holds the
  // prefill overlap's second scratch, which the model drops before it would stream a layer.)
  const uint64_t workspace = workspace_of(model.path, 4096).total();
  EXPECT_GE(roomy.workspace_bytes, workspace);
  const uint64_t all_resident = device_weights + workspace + roomy.kv_reserve_bytes;
  const uint64_t minimum = roomy.minimum_budget_bytes;
  ASSERT_LT(minimum, all_resident);

  const FitEstimate exact = Engine::estimate(model.path, options(DeviceKind::Cuda, all_resident));
  EXPECT_EQ(exact.streamed_layers, 0);
  EXPECT_EQ(exact.workspace_bytes, workspace);
  const FitEstimate one_short =
      Engine::estimate(model.path, options(DeviceKind::Cuda, all_resident - 1));
  EXPECT_GT(one_short.streamed_layers, 0);

  int32_t previous_streamed = 0;
  uint64_t layer_bytes = 0;
  const uint64_t step = (all_resident - minimum) / 24;
  for (uint64_t budget = all_resident; budget >= minimum; budget -= step) {
    SCOPED_TRACE("budget " + std::to_string(budget));
    const FitEstimate e = Engine::estimate(model.path, options(DeviceKind::Cuda, budget));
    EXPECT_TRUE(e.loads);
    EXPECT_EQ(e.minimum_budget_bytes, minimum);  // the minimum does not depend on the budget
    EXPECT_EQ(e.resident_layers + e.streamed_layers, 6);
    EXPECT_GE(e.streamed_layers, previous_streamed);
    previous_streamed = e.streamed_layers;
    expect_trailing_run(e);
    // The weights are where they are: resident or streamed, never both, never lost.
    EXPECT_EQ(e.resident_weight_bytes + e.streamed_bytes_per_pass, device_weights);
    if (e.streamed_layers > 0) {
      if (layer_bytes == 0) layer_bytes = e.streamed_bytes_per_pass / e.streamed_layers;
      EXPECT_EQ(e.streamed_bytes_per_pass, layer_bytes * e.streamed_layers);
      // A ring of two layers (one when only one streams).
      EXPECT_EQ(e.staging_bytes, layer_bytes * std::min(e.streamed_layers, 2));
      // The KV tokens the rest of the budget holds.
      const uint64_t held = e.resident_weight_bytes + e.staging_bytes + e.workspace_bytes;
      EXPECT_EQ(e.kv_capacity_tokens, static_cast<int64_t>((budget - held) / e.kv_bytes_per_token));
      EXPECT_GE(e.kv_capacity_tokens * e.kv_bytes_per_token, e.kv_reserve_bytes);
    }
    if (budget < minimum + step) break;
  }
  EXPECT_EQ(previous_streamed, 6);  // the last budget is within a step of the minimum

  // At the minimum every layer streams; a byte less does not load.
  const FitEstimate at_minimum = Engine::estimate(model.path, options(DeviceKind::Cuda, minimum));
  EXPECT_TRUE(at_minimum.loads);
  EXPECT_EQ(at_minimum.streamed_layers, 6);
  EXPECT_EQ(at_minimum.resident_layers, 0);
  EXPECT_EQ(at_minimum.layer_streamed, std::vector<bool>(6, true));
  // The minimum: fixed weights, a ring of two layers, workspace and the KV reserve.
  EXPECT_EQ(minimum, at_minimum.resident_weight_bytes + 2 * layer_bytes +
                         at_minimum.workspace_bytes + at_minimum.kv_reserve_bytes);
  const FitEstimate below = Engine::estimate(model.path, options(DeviceKind::Cuda, minimum - 1));
  EXPECT_FALSE(below.loads);
  EXPECT_FALSE(below.fits);
  EXPECT_EQ(below.minimum_budget_bytes, minimum);
  EXPECT_FALSE(Engine::estimate(model.path, options(DeviceKind::Cuda, 1 << 20)).loads);
}

TEST(FitEstimate, PcieBoundIsBandwidthOverStreamedBytes) {
  const TempModel model(six_layers(), "granule_fit");
  const uint64_t minimum =
      Engine::estimate(model.path, options(DeviceKind::Cuda, 1ull << 30)).minimum_budget_bytes;
  const FitEstimate all = Engine::estimate(model.path, options(DeviceKind::Cuda, minimum));
  ASSERT_EQ(all.streamed_layers, 6);
  const uint64_t layer_bytes = all.streamed_bytes_per_pass / 6;
  // Two layers more than the minimum: two resident, four streamed.
  const FitEstimate some =
      Engine::estimate(model.path, options(DeviceKind::Cuda, minimum + 2 * layer_bytes));
  ASSERT_EQ(some.streamed_layers, 4);
  for (const FitEstimate* e : {&all, &some}) {
    EXPECT_GT(e->h2d_bytes_per_second, 0.0);
    EXPECT_DOUBLE_EQ(e->pcie_tokens_per_second,
                     e->h2d_bytes_per_second / static_cast<double>(e->streamed_bytes_per_pass));
  }
  // Fewer bytes streamed per token: a higher bound, in proportion.
  EXPECT_DOUBLE_EQ(some.pcie_tokens_per_second / all.pcie_tokens_per_second, 6.0 / 4.0);
  if (!all.h2d_measured) EXPECT_DOUBLE_EQ(all.h2d_bytes_per_second, 25e9);  // PCIe 4.0 x16
}

// Streamed layers whose matrices the host's int8 kernels run: the preview says the host
// computes part of their rows at small batches (the CUDA backend's HostRows), unless asked not
// to; nothing streamed, or F32 layers, no such line.
TEST(FitEstimate, StreamedLayersNameTheHostsRows) {
  SyntheticModelSpec q = six_layers();
  q.weight_type = TensorType::Q4_0;
  const TempModel model(q, "granule_fit_host_rows");
  const FitEstimate roomy = Engine::estimate(model.path, options(DeviceKind::Cuda, 1ull << 30));
  EXPECT_EQ(roomy.streamed_layers, 0);
  EXPECT_FALSE(roomy.host_rows) << "nothing streams";
  const FitEstimate all =
      Engine::estimate(model.path, options(DeviceKind::Cuda, roomy.minimum_budget_bytes));
  ASSERT_EQ(all.streamed_layers, 6);
  EXPECT_EQ(all.host_rows, cpu::Int8Weights::supports(TensorType::Q4_0, q.n_embd));
  EngineOptions off = options(DeviceKind::Cuda, roomy.minimum_budget_bytes);
  off.host_row_share = 0;
  EXPECT_FALSE(Engine::estimate(model.path, off).host_rows) << "--host-rows 0";

  const TempModel f32(six_layers(), "granule_fit_host_rows_f32");
  const uint64_t minimum =
      Engine::estimate(f32.path, options(DeviceKind::Cuda, 1ull << 30)).minimum_budget_bytes;
  const FitEstimate streamed = Engine::estimate(f32.path, options(DeviceKind::Cuda, minimum));
  ASSERT_EQ(streamed.streamed_layers, 6);
  EXPECT_EQ(streamed.host_rows, cpu::Int8Weights::supports(TensorType::F32, 64));
}

TEST(FitEstimate, AShorterContextKeepsMoreLayersResident) {
  const TempModel model(six_layers(), "granule_fit");
  const FitEstimate roomy = Engine::estimate(model.path, options(DeviceKind::Cuda, 1ull << 30));
  const uint64_t budget = roomy.minimum_budget_bytes + 1;  // every layer streamed at 4,096
  EngineOptions short_context = options(DeviceKind::Cuda, budget);
  short_context.context_length = 256;
  const FitEstimate e = Engine::estimate(model.path, short_context);
  EXPECT_EQ(e.kv_reserve_bytes, e.kv_bytes_per_token * 256);
  EXPECT_LT(e.minimum_budget_bytes, roomy.minimum_budget_bytes);
  // Less KV reserve (256 tokens, not 512) and a smaller attention scratch (the workspace list
  // at 256 tokens against 4,096).
  EXPECT_EQ(roomy.minimum_budget_bytes - e.minimum_budget_bytes,
            roomy.kv_bytes_per_token * (512 - 256) + workspace_of(model.path, 4096).total() -
                workspace_of(model.path, 256).total());
  EXPECT_LE(e.workspace_bytes, roomy.workspace_bytes);
  EXPECT_GT(e.resident_layers,
            Engine::estimate(model.path, options(DeviceKind::Cuda, budget)).resident_layers);
  expect_trailing_run(e);
}

TEST(FitEstimate, TheCpuHoldsEveryLayerAndLoadsAboveWeightsAndWorkspace) {
  const TempModel model(six_layers(), "granule_fit");
  const FitEstimate roomy = Engine::estimate(model.path, options(DeviceKind::Cpu, 1ull << 30));
  const uint64_t minimum = roomy.weights_bytes + roomy.workspace_bytes;
  EXPECT_EQ(roomy.minimum_budget_bytes, minimum);
  for (uint64_t budget : {minimum, minimum - 1}) {
    const FitEstimate e = Engine::estimate(model.path, options(DeviceKind::Cpu, budget));
    EXPECT_EQ(e.loads, budget >= minimum);
    EXPECT_EQ(e.resident_layers, 6);
    EXPECT_EQ(e.streamed_layers, 0);
    EXPECT_EQ(e.layer_streamed, std::vector<bool>(6, false));
    EXPECT_EQ(e.resident_weight_bytes, e.weights_bytes);
    EXPECT_EQ(e.staging_bytes, 0u);
    EXPECT_EQ(e.streamed_bytes_per_pass, 0u);
    EXPECT_EQ(e.pcie_tokens_per_second, 0.0);
  }
}

TEST(FitEstimate, BadInputIsAClearError) {
  const TempModel model(spec(), "granule_fit");
  EngineOptions no_slots = options(DeviceKind::Cpu);
  no_slots.max_sequences = 0;
  EXPECT_THROW(Engine::estimate(model.path, no_slots), UsageError);

  const auto junk = std::filesystem::temp_directory_path() / "granule_fit_junk.gguf";
  std::ofstream(junk) << "not a model";
  EXPECT_THROW(Engine::estimate(junk, options(DeviceKind::Cpu)), FormatError);
  std::filesystem::remove(junk);
}

}  // namespace
}  // namespace granule
