// ModelRuntime: a model file with its backend and KV space, set up as the engine sets them up.
#include "support/model_runtime.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <span>

#include "backends/backend.h"
#include "memory/kv_space.h"

namespace granule::test {
namespace {

// The index of the first largest of v[0..n).
int32_t argmax(const float* v, int64_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);
}

}  // namespace

ModelRuntime::ModelRuntime(const std::filesystem::path& path, const RuntimeOptions& options) {
  file = ModelFile::open(path);
  config = ModelConfig::from_gguf(*file);
  weights = WeightTable::from_gguf(*file, config);
  runtime = make_runtime(*file, config, weights, options);
}

std::vector<float> ModelRuntime::run(int32_t slot, const std::vector<int32_t>& tokens,
                                     int64_t start, bool all_logits) {
  EXPECT_TRUE(kv->map_through(slot, start + static_cast<int64_t>(tokens.size())));
  BatchSequence seq{slot, tokens, start, all_logits};
  std::vector<float> logits;
  backend->forward(std::span<const BatchSequence>(&seq, 1), logits);
  return logits;
}

std::vector<float> ModelRuntime::step(const std::vector<BatchSequence>& batch, bool slide) {
  for (const BatchSequence& s : batch)
    EXPECT_TRUE(kv->map_through(s.slot, s.start_position + static_cast<int64_t>(s.tokens.size()),
                                slide ? s.start_position : 0));
  std::vector<float> logits;
  backend->forward(batch, logits);
  return logits;
}

ModelRuntime::PromptAndGreedy ModelRuntime::prompt_and_greedy(const std::vector<int32_t>& prompt,
                                                              int greedy) {
  PromptAndGreedy out;
  out.logits = run(0, prompt, 0, true);
  const int64_t vocab = config.n_vocab;
  int32_t next = argmax(out.logits.data() + out.logits.size() - static_cast<size_t>(vocab), vocab);
  auto position = static_cast<int64_t>(prompt.size());
  for (int i = 0; i < greedy; ++i) {
    out.greedy.push_back(next);
    const std::vector<float> row = run(0, {next}, position++, false);
    next = argmax(row.data(), vocab);
  }
  return out;
}

GraphTelemetry ModelRuntime::graphs() {
  TelemetrySnapshot t;
  backend->fill_telemetry(t);
  return t.graphs;
}

std::vector<int32_t> random_tokens(int n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(3, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = dist(rng);
  return t;
}

RuntimeOptions cpu_runtime_options(int32_t slots, int64_t context) {
  RuntimeOptions options;
  options.device = DeviceKind::Cpu;
  options.backend.cpu_threads = 2;
  options.backend.cpu_exact_numerics = true;  // the reference numerics the tests compare
  options.backend.vram_budget_bytes = uint64_t{1} << 40;
  options.context_length = context;
  options.slots = slots;
  options.kv_pool_granules = 0;
  return options;
}

}  // namespace granule::test
