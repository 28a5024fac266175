// Sampling parameters per sequence, and the host sampler (the reference for the device one).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
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
// The draw uses splitmix64 and the sampler's own float arithmetic (no <random>
// distributions), so a seed gives the same tokens with every standard library; draw i
// uses the same uniform as the device sampler's kernels::sampling_uniform(seed, i). Throws
// UsageError for empty logits or when every logit is NaN or -inf.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);
  // Puts the generator where it is after `draws` draws from the seed, so a sequence sampled
  // on the device for some steps and on the host for others draws what either alone would.
  void set_draw_index(uint64_t draws);
  const SamplingParams& params() const { return params_; }

 private:
  void apply_penalties(std::span<const int32_t> history);
  int32_t sample_top_k(float inverse_temperature);
  int32_t sample_all(float best, float inverse_temperature);
  // Grows the sorted prefix of candidates_[0, count) until top-p's mass is reached;
  // returns how many candidates top-p keeps.
  size_t top_p_prefix(size_t count, size_t sorted, double total_weight);
  int32_t draw_from_prefix(size_t count);
  double next_uniform();   // [0, 1)

  SamplingParams params_;
  uint64_t state_;   // splitmix64 state from the seed
  // Scratch reused across calls so a warm sampler does not allocate.
  std::vector<float> token_values_;                      // by id: logits, then weights
  std::vector<std::pair<float, int32_t>> candidates_;    // (value or weight, id)
  std::vector<int32_t> penalty_window_;
  std::vector<double> mass_by_log_weight_;               // top-p's histogram, see sampler.cpp
};

// Stop strings over streamed text. The engine keeps the text it has not yet sent; a stop
// string found there ends the sequence (the text before it is sent, the stop is not),
// otherwise everything but the hold-back can be sent, since no stop can begin in it.
// Empty stop strings are ignored. With valid UTF-8 text and stops, the cut falls on a
// character boundary.
// Byte offset of the earliest complete occurrence of any stop string, or npos.
size_t find_stop_string(std::string_view text, const std::vector<std::string>& stops);
// How many trailing bytes of text could still begin a stop string: the longest suffix that
// is a proper prefix of one of them (0 when none).
size_t stop_string_holdback(std::string_view text, const std::vector<std::string>& stops);

}  // namespace granule
