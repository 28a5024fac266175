// A device error in the middle of generation, injected into the forward pass the way the
// CUDA backend reports one: the engine ends the affected conversations with an error that
// says what happened, frees their KV, and goes on (an error the device survives) or refuses
// new work until it is reopened (a lost device); nothing throws out of step(), nothing dies.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "granule/engine.h"
#include "granule/error.h"
#include "granule/testkit/synthetic_model.h"
#include "support/engine_chats.h"
#include "support/fault_injecting_backend.h"
#include "support/temp_model.h"

namespace granule {
namespace {

using test::FaultInjectingBackend;
using test::run_to_idle;
using test::TempModel;

EngineOptions options_with_fault(int fail_at, FaultInjectingBackend::Fault fault) {
  EngineOptions o = test::cpu_engine_options(128, 3);
  o.wrap_backend = FaultInjectingBackend::wrap(fail_at, fault);
  return o;
}

SequenceId submit(Engine& engine, test::Outputs& outputs, int32_t max_tokens) {
  return engine.submit(test::chat_request({{1, 5, 9, 13, 17, 21}, max_tokens}, outputs));
}

// A new chat on `engine` runs to its max_tokens.
void expect_a_whole_answer(Engine& engine, int32_t max_tokens) {
  test::Outputs out;
  const SequenceId id = submit(engine, out, max_tokens);
  run_to_idle(engine);
  EXPECT_EQ(out[id].reason, FinishReason::MaxTokens);
  EXPECT_EQ(out[id].tokens.size(), static_cast<size_t>(max_tokens));
}

TEST(EngineFault, AnErrorTheDeviceSurvivesEndsTheBatchAndTheEngineGoesOn) {
  TempModel model(SyntheticModelSpec::preset("tiny-gqa"), "granule_fault");
  // Pass 1 prefills the three running chats, passes 2-4 decode: pass 4 fails mid-generation.
  auto engine =
      Engine::open(model.path, options_with_fault(4, FaultInjectingBackend::Fault::DeviceError));
  test::Outputs out;
  std::vector<SequenceId> running;
  for (int i = 0; i < 3; ++i) running.push_back(submit(*engine, out, 20));
  const SequenceId waiting = submit(*engine, out, 20);  // no slot: waits for one
  run_to_idle(*engine);
  for (SequenceId id : running) {
    EXPECT_EQ(out[id].finishes, 1);
    EXPECT_EQ(out[id].reason, FinishReason::Error) << "chat " << id;
    EXPECT_NE(out[id].error.find("illegal memory access"), std::string::npos) << out[id].error;
    EXPECT_GE(out[id].tokens.size(), 2u) << "the error came mid-generation";
    EXPECT_LT(out[id].tokens.size(), 20u);
  }
  EXPECT_EQ(out[waiting].reason, FinishReason::MaxTokens) << "the chat that was not in the batch";
  EXPECT_EQ(out[waiting].tokens.size(), 20u);
  EXPECT_EQ(test::kv_committed_after_dropping_kept(*engine), 0u) << "every chat's KV is freed";
  // The engine takes new work.
  expect_a_whole_answer(*engine, 5);
}

TEST(EngineFault, ALostDeviceEndsEveryChatRefusesNewOnesAndAReopenedEngineWorks) {
  TempModel model(SyntheticModelSpec::preset("tiny-gqa"), "granule_fault");
  test::Outputs out;
  std::vector<SequenceId> ids;
  {
    auto engine =
        Engine::open(model.path, options_with_fault(5, FaultInjectingBackend::Fault::DeviceLost));
    for (int i = 0; i < 4; ++i) ids.push_back(submit(*engine, out, 30));  // 3 run, 1 waits
    run_to_idle(*engine);
    for (SequenceId id : ids) {
      EXPECT_EQ(out[id].finishes, 1) << "chat " << id;
      EXPECT_EQ(out[id].reason, FinishReason::Error) << "chat " << id;
      EXPECT_NE(out[id].error.find("reload the model"), std::string::npos) << out[id].error;
    }
    EXPECT_GT(out[ids[0]].tokens.size(), 0u) << "the error came mid-generation";
    EXPECT_EQ(out[ids[3]].tokens.size(), 0u) << "the waiting chat ended without running";
    EXPECT_EQ(test::kv_committed_after_dropping_kept(*engine), 0u);
    EXPECT_FALSE(engine->step());
    test::Outputs refused;
    EXPECT_THROW(submit(*engine, refused, 5), DeviceLostError);
    EXPECT_TRUE(refused.empty()) << "a refused request gets no callbacks";
    EXPECT_THROW(engine->logits_for({1, 2, 3}), DeviceLostError);
  }  // destroying the engine after a lost device is clean
  auto reopened =
      Engine::open(model.path, options_with_fault(1000, FaultInjectingBackend::Fault::DeviceLost));
  expect_a_whole_answer(*reopened, 8);
}

TEST(EngineFault, ALostDeviceDuringPrefillEndsTheChatsBeforeAnyToken) {
  TempModel model(SyntheticModelSpec::preset("tiny-gqa"), "granule_fault");
  auto engine =
      Engine::open(model.path, options_with_fault(1, FaultInjectingBackend::Fault::DeviceLost));
  test::Outputs out;
  const SequenceId a = submit(*engine, out, 10), b = submit(*engine, out, 10);
  run_to_idle(*engine);
  for (SequenceId id : {a, b}) {
    EXPECT_EQ(out[id].reason, FinishReason::Error);
    EXPECT_EQ(out[id].tokens.size(), 0u);
    EXPECT_EQ(out[id].finishes, 1);
  }
}

}  // namespace
}  // namespace granule
