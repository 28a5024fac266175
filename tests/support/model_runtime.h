// A model file with the runtime the engine makes for it (make_runtime): its own ledger,
// backend and KV space, for the tests that drive a backend directly.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "granule/gguf.h"
#include "granule/model_config.h"
#include "granule/telemetry.h"
#include "runtime/runtime.h"

namespace granule::test {

struct ModelRuntime {
  std::unique_ptr<ModelFile> file;
  ModelConfig config;
  WeightTable weights;
  Runtime runtime;
  std::unique_ptr<Backend>& backend = runtime.backend;
  std::unique_ptr<KvSpace>& kv = runtime.kv;

  ModelRuntime(const std::filesystem::path& path, const RuntimeOptions& options);

  // `tokens` on `slot` from `start`, the KV mapped through them first (a refusal fails the
  // test): one row of logits per token (all_logits) or the last token's.
  std::vector<float> run(int32_t slot, const std::vector<int32_t>& tokens, int64_t start,
                         bool all_logits);
  // One step of several sequences, each one's KV mapped through its tokens first. `slide`:
  // mapped as the engine maps, from the first position the step writes (a sliding-window part
  // lets go of its granules behind the window); else from 0 (every token stays mapped).
  std::vector<float> step(const std::vector<BatchSequence>& batch, bool slide = false);
  // The backend's graph counters (captures, replays).
  GraphTelemetry graphs();

  struct PromptAndGreedy {
    std::vector<float> logits;    // one row per prompt token
    std::vector<int32_t> greedy;  // the tokens decoded after it
  };
  // The teacher-forced logits of every position of `prompt` (slot 0, from position 0), then
  // `greedy` tokens decoded one step at a time, each the first largest logit of the last row.
  PromptAndGreedy prompt_and_greedy(const std::vector<int32_t>& prompt, int greedy);
};

// n token ids in [3, vocab) from `seed`.
std::vector<int32_t> random_tokens(int n, int64_t vocab, uint32_t seed);

// The CPU backend with 2 threads on its exact path (cpu_exact_numerics): `slots` sequences of
// `context` tokens, a budget that never binds and no pre-created KV granules.
RuntimeOptions cpu_runtime_options(int32_t slots, int64_t context);

}  // namespace granule::test
