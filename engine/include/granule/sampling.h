// Sampling parameters per sequence, and the host sampler (the reference for the device one).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace granule {

struct SamplingParams {
  float temperature = 0.7f;     // 0 = greedy
  int32_t top_k = 40;           // 0 = off
  float top_p = 0.95f;          // 1 = off
  float min_p = 0.05f;          // 0 = off
  float repetition_penalty = 1.0f;   // 1 = off (llama.cpp semantics, over the last penalty_last_n)
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  int32_t penalty_last_n = 64;
  uint64_t seed = 0;            // same seed, same prompt, same params -> same tokens
  int32_t max_tokens = 512;
  std::vector<std::string> stop_strings;
  bool ignore_eos = false;

  static SamplingParams greedy() {
    SamplingParams p;
    p.temperature = 0.0f; p.top_k = 0; p.top_p = 1.0f; p.min_p = 0.0f;
    return p;
  }
};

// Picks the next token from logits given the recent history, applying, in order:
// penalties, top-k, temperature, top-p, min-p, then a draw from a seeded generator.
// Greedy (temperature 0) is argmax after penalties; ties go to the lowest id.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);
  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  uint64_t state_;   // splitmix/xoshiro state from the seed
  std::vector<std::pair<float, int32_t>> scratch_;
};

}  // namespace granule
