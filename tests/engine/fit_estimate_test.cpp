// Tests of Engine::estimate, the fit preview from the file alone: KV per token in the element
// type of the backend the options pick (f32 on the CPU, twice the f16 of CUDA), the same
// weights and KV reservation the opened engine then charges, the budget arithmetic, and
// clear errors.
#include <gtest/gtest.h>

#include <fstream>

#include "granule/engine.h"
#include "granule/error.h"
#include "granule/testkit/synthetic_model.h"
#include "support/temp_model.h"

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
  // The rest does not depend on the backend.
  EXPECT_EQ(cpu.weights_bytes, cuda.weights_bytes);
  EXPECT_EQ(cpu.workspace_bytes, cuda.workspace_bytes);
  // Twice the KV per token: half the tokens in the same budget, up to what the CUDA upload
  // layout adds to the weights (every matrix padded and 256-byte aligned on the device).
  const FitEstimate cpu_same_budget =
      Engine::estimate(model.path, options(DeviceKind::Cpu, 1ull << 30));
  ASSERT_GE(cuda.resident_weight_bytes, cuda.weights_bytes);
  const auto layout_tokens =
      static_cast<int64_t>((cuda.resident_weight_bytes - cuda.weights_bytes) /
                           cuda.kv_bytes_per_token);
  EXPECT_NEAR(cpu_same_budget.kv_capacity_tokens, cuda.kv_capacity_tokens / 2, layout_tokens + 1);
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
  if (!e.gpu) {
    // No usable GPU (or none built in): asking for CUDA without a budget cannot be estimated.
    EXPECT_THROW(Engine::estimate(model.path, options(DeviceKind::Cuda)), Error);
  }
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
