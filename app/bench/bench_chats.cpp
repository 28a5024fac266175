// Random greedy chats for the engine benchmarks, and their progress.
#include "bench_chats.h"

#include <algorithm>
#include <utility>

#include "granule/error.h"

namespace granule {

DeviceKind device_kind(const std::string& name) {
  if (name == "cpu") return DeviceKind::Cpu;
  if (name == "cuda") return DeviceKind::Cuda;
  if (name == "auto") return DeviceKind::Auto;
  throw UsageError("unknown device '" + name + "' (auto, cpu or cuda)");
}

std::vector<TokenId> random_prompt(int64_t tokens, int64_t vocab, std::mt19937_64& random) {
  const int64_t first = std::min<int64_t>(3, vocab - 1);
  std::vector<TokenId> prompt(static_cast<size_t>(tokens));
  for (TokenId& t : prompt) {
    t = static_cast<TokenId>(first +
                             static_cast<int64_t>(random() % static_cast<uint64_t>(vocab - first)));
  }
  return prompt;
}

void submit_random_chats(Engine& engine, int32_t chats, int64_t prompt_tokens,
                         int32_t generate_tokens, std::mt19937_64& random, ChatsProgress& progress,
                         const Constraint& constraint) {
  for (int32_t i = 0; i < chats; ++i) {
    Request r;
    r.prompt_tokens = random_prompt(prompt_tokens, engine.config().n_vocab, random);
    r.sampling = SamplingParams::greedy();
    r.sampling.max_tokens = generate_tokens;
    r.sampling.ignore_eos = true;
    r.constraint = constraint;
    r.sink.on_token = [&progress, first = true](SequenceId, const std::string&,
                                                int32_t token) mutable {
      if (token == kNoToken) return;
      ++progress.generated;
      if (first) ++progress.started;
      first = false;
    };
    r.sink.on_finish = [&progress](SequenceId, FinishReason reason, const std::string& error) {
      ++progress.finished;
      if (reason == FinishReason::Error && progress.errors++ == 0) progress.first_error = error;
    };
    engine.submit(std::move(r));
  }
}

}  // namespace granule
