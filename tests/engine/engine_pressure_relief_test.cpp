// KV pressure is relieved before anyone is preempted: when the budget refuses a chat's KV,
// the scheduler first asks the backend to free device memory (the CUDA backend moves
// resident layers to streaming), and only preempts when nothing more can be freed. Here a
// CPU-backend decorator holds "weights" on the ledger that it can give up in whole layers,
// as the CUDA backend does: twelve chats that preempt each other on the bare budget run with
// no preemption, give their alone tokens, and the layers given up are what the KV needed; and
// a long generation re-plans once, ahead of its growth, and never again.
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "granule/engine.h"
#include "granule/testkit/synthetic_model.h"
#include "memory/kv_space.h"
#include "memory/memory_manager.h"
#include "support/temp_model.h"

namespace granule {
namespace {

constexpr uint64_t kGranule = 2ull << 20;
constexpr uint64_t kLayerBytes = 8ull << 20;  // a "layer" the decorator can give up
constexpr int kLayers = 16;

// Passes everything to the CPU backend and charges kLayers layers of resident weights at
// attach_kv(); make_room() gives up the fewest whole layers that free what is asked.
class LayeredBackend final : public Backend {
 public:
  explicit LayeredBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  ~LayeredBackend() override {
    if (memory_) memory_->release(MemoryCategory::WeightsResident, resident_ * kLayerBytes);
  }

  std::string name() const override { return inner_->name(); }
  bool is_gpu() const override { return inner_->is_gpu(); }
  uint64_t device_total_bytes() const override { return inner_->device_total_bytes(); }
  int64_t kv_bytes_per_token() const override { return inner_->kv_bytes_per_token(); }
  std::unique_ptr<VirtualMemory> make_kv_virtual_memory() override {
    return inner_->make_kv_virtual_memory();
  }
  void attach_kv(KvSpace& kv) override {
    inner_->attach_kv(kv);
    memory_ = &kv.memory();
    memory_->charge(MemoryCategory::WeightsResident, kLayers * kLayerBytes);
    resident_ = kLayers;
  }
  bool samples_on_device() const override { return inner_->samples_on_device(); }
  void launch(const StepRequest& step) override { inner_->launch(step); }
  StepResult wait() override { return inner_->wait(); }
  void fill_telemetry(TelemetrySnapshot& s) const override {
    inner_->fill_telemetry(s);
    s.streaming.layers_resident = static_cast<int32_t>(resident_);
    s.streaming.layers_streamed = static_cast<int32_t>(kLayers - resident_);
    s.streaming.replans = replans_;
    s.streaming.last_replan_reason = last_reason_;
  }
  uint64_t make_room(uint64_t bytes, const std::string& reason) override {
    const uint64_t layers = (bytes + kLayerBytes - 1) / kLayerBytes;
    if (layers > resident_) return 0;  // cannot free that much: preempting is the way
    ++replans_;                        // one re-plan, however many layers move
    resident_ -= layers;
    memory_->release(MemoryCategory::WeightsResident, layers * kLayerBytes);
    last_reason_ = reason;
    return layers * kLayerBytes;
  }

 private:
  std::unique_ptr<Backend> inner_;
  MemoryManager* memory_ = nullptr;
  uint64_t resident_ = 0;
  uint64_t replans_ = 0;
  std::string last_reason_;
};

SyntheticModelSpec kv_wide_spec() {
  SyntheticModelSpec s;
  s.n_layer = 4;
  s.n_embd = 64;
  s.n_head = 8;
  s.n_head_kv = 8;
  s.head_dim = 128;  // 32 KiB of f32 KV a token: 64 tokens a granule
  s.n_ff = 128;
  s.n_vocab = 384;
  s.context_length = 512;
  s.seed = 5;
  return s;
}

EngineOptions cpu_options(uint64_t budget) {
  EngineOptions o;
  o.device = DeviceKind::Cpu;
  o.cpu_threads = 2;
  o.context_length = 512;
  o.max_sequences = 8;
  o.prefill_chunk_tokens = 96;
  o.vram_budget_bytes = budget;
  return o;
}

struct Output {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::None;
  std::string error;
};

std::vector<std::vector<TokenId>> prompts() {
  std::mt19937_64 random(20261203);
  std::vector<std::vector<TokenId>> out(12);
  for (auto& p : out) {
    p.resize(40 + random() % 120);
    for (TokenId& t : p) t = static_cast<TokenId>(3 + random() % 380);
  }
  return out;
}

// Runs every prompt at once for 60 tokens; fills the per-chat outputs in order.
TelemetrySnapshot run_all(Engine& engine, std::vector<Output>& outputs) {
  const auto ps = prompts();
  outputs.assign(ps.size(), {});
  for (size_t i = 0; i < ps.size(); ++i) {
    Request r;
    r.prompt_tokens = ps[i];
    r.sampling = SamplingParams::greedy();
    r.sampling.max_tokens = 60;
    r.sampling.ignore_eos = true;
    Output* out = &outputs[i];
    r.sink.on_token = [out](SequenceId, const std::string&, int32_t token) {
      if (token != kNoToken) out->tokens.push_back(token);
    };
    r.sink.on_finish = [out](SequenceId, FinishReason reason, const std::string& error) {
      out->reason = reason;
      out->error = error;
    };
    engine.submit(std::move(r));
  }
  for (int steps = 0; engine.step(); ++steps) {
    EXPECT_LE(engine.telemetry().device.used_bytes, engine.telemetry().device.budget_bytes);
    if (steps > 20000) break;
  }
  EXPECT_TRUE(engine.idle());
  return engine.telemetry();
}

TEST(EnginePressureRelief, LayersMoveOutBeforeAnyChatIsPreempted) {
  const test::TempModel model(kv_wide_spec(), "granule_relief");
  // The budget: what the engine holds with no KV, plus the decorator's layers, plus room
  // for four granules of KV. Twelve chats of up to ~220 tokens need far more.
  uint64_t base = 0;
  std::vector<Output> unlimited;
  {
    auto engine = Engine::open(model.path, cpu_options(0));
    const TelemetrySnapshot t = engine->telemetry();
    base = t.device.used_bytes - t.device.ledger_bytes(MemoryCategory::KvPool);
    run_all(*engine, unlimited);
  }
  const uint64_t budget = base + kLayers * kLayerBytes + 4 * kGranule;

  // Without relief (the plain CPU backend, the same budget less the layers): preemption.
  std::vector<Output> bare;
  {
    auto engine = Engine::open(model.path, cpu_options(budget - kLayers * kLayerBytes));
    EXPECT_GT(run_all(*engine, bare).scheduler.preemptions, 0u);
  }

  EngineOptions o = cpu_options(budget);
  o.wrap_backend = [](std::unique_ptr<Backend> inner) -> std::unique_ptr<Backend> {
    return std::make_unique<LayeredBackend>(std::move(inner));
  };
  auto engine = Engine::open(model.path, o);
  EXPECT_EQ(engine->telemetry().streaming.layers_streamed, 0);
  std::vector<Output> relieved;
  const TelemetrySnapshot t = run_all(*engine, relieved);
  std::cout << "twelve chats: " << t.streaming.layers_streamed << " of " << kLayers
            << " layers streamed in " << t.streaming.replans << " re-plans, "
            << t.scheduler.preemptions << " preemptions\n";
  EXPECT_EQ(t.scheduler.preemptions, 0u);
  EXPECT_GT(t.streaming.layers_streamed, 0);
  EXPECT_LT(t.streaming.layers_streamed, kLayers);  // only what the KV needed
  EXPECT_GT(t.streaming.replans, 0u);
  EXPECT_NE(t.streaming.last_replan_reason.find("KV needed"), std::string::npos)
      << t.streaming.last_replan_reason;
  ASSERT_EQ(relieved.size(), unlimited.size());
  for (size_t i = 0; i < unlimited.size(); ++i) {
    EXPECT_EQ(relieved[i].reason, FinishReason::MaxTokens) << relieved[i].error;
    EXPECT_EQ(relieved[i].tokens, unlimited[i].tokens) << "chat " << i;
    EXPECT_EQ(bare[i].tokens, unlimited[i].tokens) << "chat " << i;
  }
}

// The case: one chat generating 440 tokens on a budget with room for about a quarter of their
// KV. Planned ahead, the first decode step moves the layers that the whole generation needs in
// one re-plan, and nothing re-plans after it (on a GPU each re-plan re-captures the graphs).
TEST(EnginePressureRelief, LongGenerationRePlansOnceAheadAndThenNever) {
  const test::TempModel model(kv_wide_spec(), "granule_relief_long");
  uint64_t base = 0;
  std::vector<int32_t> unlimited;
  Request r;
  r.prompt_tokens = prompts().front();
  r.prompt_tokens->resize(20);
  r.sampling = SamplingParams::greedy();
  r.sampling.max_tokens = 440;
  r.sampling.ignore_eos = true;
  auto submit = [&r](Engine& engine, std::vector<int32_t>& tokens) {
    Request copy = r;
    copy.sink.on_token = [&tokens](SequenceId, const std::string&, int32_t token) {
      if (token != kNoToken) tokens.push_back(token);
    };
    engine.submit(std::move(copy));
  };
  {
    auto engine = Engine::open(model.path, cpu_options(0));
    const TelemetrySnapshot t = engine->telemetry();
    base = t.device.used_bytes - t.device.ledger_bytes(MemoryCategory::KvPool);
    submit(*engine, unlimited);
    while (engine->step()) {
    }
  }
  ASSERT_EQ(unlimited.size(), 440u);

  EngineOptions o = cpu_options(base + kLayers * kLayerBytes + 4 * kGranule);
  o.wrap_backend = [](std::unique_ptr<Backend> inner) -> std::unique_ptr<Backend> {
    return std::make_unique<LayeredBackend>(std::move(inner));
  };
  auto engine = Engine::open(model.path, o);
  std::vector<int32_t> tokens;
  submit(*engine, tokens);
  std::vector<uint64_t> replans;  // after each step
  while (engine->step()) {
    const TelemetrySnapshot t = engine->telemetry();
    EXPECT_LE(t.device.used_bytes, t.device.budget_bytes);
    replans.push_back(t.streaming.replans);
  }
  const TelemetrySnapshot t = engine->telemetry();
  ASSERT_GE(replans.size(), 2u);
  EXPECT_EQ(replans[0], 0u);  // the prompt's step: its KV fits
  EXPECT_EQ(replans[1], 1u);  // the first decode step planned the rest
  EXPECT_EQ(t.streaming.replans, 1u);
  // The 459 tokens' KV (and the look-ahead) is 8 granules, 4 of them free at the start: one
  // 8 MiB layer covers the rest.
  EXPECT_EQ(t.streaming.layers_streamed, 1);
  EXPECT_EQ(t.scheduler.preemptions, 0u);
  EXPECT_EQ(tokens, unlimited);
}

}  // namespace
}  // namespace granule
