// The engine on the GPU while chats come and go: (1) rounds of 8 chats that end, are
// cancelled mid-generation and regenerated, so KV slots are released and cut back all the
// time; the H200 runner also runs it beside a process that keeps the GPU busy and under
// compute-sanitizer (tests/gpu/run_on_h200.sh contention). (2) A real sticky CUDA error
// injected mid-generation (a kernel reading an illegal address): every chat ends with an
// error that says to reload, new work is refused, nothing throws out of step(), and the
// model opens again in the same process: on the GPU if the reset brought it back (CUDA does
// not promise that after a sticky error), else on the CPU with the reason.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_support.h"
#include "granule/engine.h"
#include "granule/error.h"
#include "granule/testkit/synthetic_model.h"
#include "support/engine_chats.h"
#include "swiglu.cuh"

namespace granule {
namespace {

using test::run_to_idle;

class EngineChurnGpu : public gpu_test::SmolLM2ShapesSuite {};

EngineOptions cuda_options() {
  EngineOptions o;
  o.device = DeviceKind::Cuda;
  o.max_sequences = 8;
  o.context_length = 512;
  return o;
}

// A chat of these tests with what its sink saw, and when it cancels itself.
struct Chat : test::Chat, test::Output {
  int cancel_after = -1;  // tokens; -1: runs to its end
};

// Submits `chat`, its sink filling it; `on_token` runs after each generated token.
SequenceId submit(Engine& engine, Chat& chat,
                  std::function<void(SequenceId, Chat&)> on_token = {}) {
  Request r = test::chat_request(chat, static_cast<test::Output&>(chat));
  if (on_token) {
    r.sink.on_token = [&chat, on_token, base = r.sink.on_token](
                          SequenceId id, const std::string& text, int32_t token) {
      base(id, text, token);
      if (token != kNoToken) on_token(id, chat);
    };
  }
  return engine.submit(std::move(r));
}

std::vector<TokenId> random_prompt(std::mt19937& rng, int length, int64_t vocab) {
  std::uniform_int_distribution<TokenId> token(3, static_cast<TokenId>(vocab - 1));
  std::vector<TokenId> p(static_cast<size_t>(length));
  for (TokenId& t : p) t = token(rng);
  return p;
}

TEST_F(EngineChurnGpu, ChatsThatEndCancelAndRegenerateKeepTheKvLedgerAndTheDeviceHealthy) {
  GRANULE_REQUIRE_GPU();
  auto engine = Engine::open(gpu_test::SmolLM2ShapesSuite::model_path(), cuda_options());
  const int64_t vocab = engine->config().n_vocab;
  std::mt19937 rng(20261203);
  int ended = 0, cancelled = 0, regenerated = 0;
  // Fewer rounds under compute-sanitizer, which runs every kernel far slower.
  const char* rounds_env = std::getenv("GRANULE_CHURN_ROUNDS");
  const int rounds = rounds_env ? std::max(1, std::atoi(rounds_env)) : 6;
  for (int round = 0; round < rounds; ++round) {
    std::vector<Chat> chats(8);
    std::map<SequenceId, size_t> index;
    for (size_t i = 0; i < chats.size(); ++i) {
      chats[i].prompt = random_prompt(rng, 5 + static_cast<int>(rng() % 296), vocab);
      chats[i].max_tokens = 8 + static_cast<int32_t>(rng() % 40);
      if (i % 3 == 1) chats[i].cancel_after = 1 + static_cast<int>(rng() % 6);
    }
    for (Chat& c : chats) {
      Engine* e = engine.get();
      submit(*engine, c, [e](SequenceId id, Chat& chat) {
        if (chat.cancel_after >= 0 && static_cast<int>(chat.tokens.size()) == chat.cancel_after)
          e->cancel(id);  // from the sink: ends after this step, its KV is released
      });
    }
    run_to_idle(*engine);
    // Regenerate every third answer: the same prompt again, after its chat ended (its KV
    // kept for reuse, or given up for a slot).
    std::vector<Chat> again;
    for (size_t i = 2; i < chats.size(); i += 3) {
      Chat c;
      c.prompt = chats[i].prompt;
      c.max_tokens = chats[i].max_tokens;
      again.push_back(std::move(c));
    }
    for (Chat& c : again) submit(*engine, c);
    run_to_idle(*engine);
    for (const Chat& c : chats) {
      ASSERT_EQ(c.finishes, 1);
      ASSERT_NE(c.reason, FinishReason::Error) << c.error;
      if (c.cancel_after >= 0) {
        EXPECT_EQ(c.reason, FinishReason::Cancelled);
        EXPECT_EQ(static_cast<int>(c.tokens.size()), c.cancel_after);
        ++cancelled;
      } else {
        EXPECT_EQ(c.reason, FinishReason::MaxTokens);
        EXPECT_EQ(static_cast<int32_t>(c.tokens.size()), c.max_tokens);
        ++ended;
      }
    }
    for (const Chat& c : again) {
      ASSERT_EQ(c.finishes, 1);
      ASSERT_EQ(c.reason, FinishReason::MaxTokens) << c.error;
      EXPECT_EQ(static_cast<int32_t>(c.tokens.size()), c.max_tokens);
      ++regenerated;
    }
    // What stays committed is the KV kept for a next turn (EngineOptions::kv_reuse) of the
    // chats that ended, and nothing else.
    const TelemetrySnapshot t = engine->telemetry();
    EXPECT_EQ(t.device.ledger_bytes(MemoryCategory::KvCommitted), t.scheduler.kept_kv_bytes)
        << "round " << round;
  }
  EXPECT_EQ(test::kv_committed_after_dropping_kept(*engine), 0u);
  EXPECT_EQ(engine->device_lost_reason(), "");
  CUDA_OK(cudaDeviceSynchronize());
  std::cout << "[churn] " << ended << " chats ended, " << cancelled << " cancelled, " << regenerated
            << " regenerated; granules mapped " << engine->telemetry().kv.granules_mapped
            << ", unmapped " << engine->telemetry().kv.granules_unmapped << "\n";
}

TEST_F(EngineChurnGpu, AStickyCudaErrorMidGenerationEndsEveryChatAndTheModelCanBeReopened) {
  GRANULE_REQUIRE_GPU();
  std::mt19937 rng(7);
  Chat reference;
  {
    auto engine = Engine::open(gpu_test::SmolLM2ShapesSuite::model_path(), cuda_options());
    reference.prompt = random_prompt(rng, 40, engine->config().n_vocab);
    reference.max_tokens = 16;
    submit(*engine, reference);
    run_to_idle(*engine);
    ASSERT_EQ(reference.reason, FinishReason::MaxTokens) << reference.error;
  }
  {
    auto engine = Engine::open(gpu_test::SmolLM2ShapesSuite::model_path(), cuda_options());
    std::vector<Chat> chats(6);
    bool injected = false;
    cudaError_t injected_status = cudaSuccess;
    for (Chat& c : chats) {
      c.prompt = random_prompt(rng, 20 + static_cast<int>(rng() % 100), engine->config().n_vocab);
      c.max_tokens = 40;
    }
    for (size_t i = 0; i < chats.size(); ++i) {
      submit(*engine, chats[i], [&, i](SequenceId, Chat& chat) {
        if (i != 0 || injected || chat.tokens.size() != 4) return;
        // A kernel that reads and writes an address nothing maps: a sticky error.
        auto* bad = reinterpret_cast<float*>(uintptr_t{0x1000});
        kernels::launch_swiglu_f32(bad, bad, 1 << 20, bad, kernels::KernelConfig{}, nullptr);
        injected_status = cudaDeviceSynchronize();
        injected = true;
      });
    }
    run_to_idle(*engine);
    ASSERT_TRUE(injected);
    EXPECT_EQ(injected_status, cudaErrorIllegalAddress) << cudaGetErrorString(injected_status);
    for (const Chat& c : chats) {
      EXPECT_EQ(c.finishes, 1);
      EXPECT_EQ(c.reason, FinishReason::Error);
      EXPECT_NE(c.error.find("reload the model"), std::string::npos) << c.error;
      EXPECT_LT(static_cast<int32_t>(c.tokens.size()), c.max_tokens);
    }
    EXPECT_NE(engine->device_lost_reason(), "");
    Chat refused;
    refused.prompt = reference.prompt;
    refused.max_tokens = 4;
    EXPECT_THROW(submit(*engine, refused), DeviceLostError);
    std::cout << "[fault] " << engine->device_lost_reason() << "\n";
  }  // destroying the engine resets the device (which CUDA does not promise to recover)
  // Reopening in the same process works either way: on the GPU when the reset brought it
  // back (then the answer is the one from before the fault), else on the CPU, with the
  // reason; asking for the GPU explicitly then says to restart.
  EngineOptions automatic = cuda_options();
  automatic.device = DeviceKind::Auto;
  auto engine = Engine::open(gpu_test::SmolLM2ShapesSuite::model_path(), automatic);
  Chat after;
  after.prompt = reference.prompt;
  after.max_tokens = reference.max_tokens;
  submit(*engine, after);
  run_to_idle(*engine);
  ASSERT_EQ(after.reason, FinishReason::MaxTokens) << after.error;
  EXPECT_EQ(static_cast<int32_t>(after.tokens.size()), reference.max_tokens);
  const bool on_gpu = engine->device_name().find("CUDA") != std::string::npos;
  std::cout << "[fault] reopened on " << engine->device_name() << "\n";
  if (on_gpu) {
    EXPECT_EQ(after.tokens, reference.tokens) << "the reset GPU answers as before the fault";
  } else {
    try {
      Engine::open(gpu_test::SmolLM2ShapesSuite::model_path(), cuda_options());
      ADD_FAILURE() << "the GPU did not come back, yet opening on it worked";
    } catch (const DeviceError& e) {
      std::cout << "[fault] opening on the GPU: " << e.what() << "\n";
      EXPECT_NE(std::string(e.what()).find("restarted"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace granule
