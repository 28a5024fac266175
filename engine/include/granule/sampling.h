// Sampling parameters per sequence, and the host sampler (the reference for the device one).
#pragma once
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace granule {

// The seed that asks for a fresh random seed: Engine::submit replaces it with one drawn from
// the system's entropy source (resolve_seed), so every other value, 0 included, is a fixed
// seed and repeats its text. The CLI, the server and the window share this one rule.
inline constexpr uint64_t kRandomSeed = std::numeric_limits<uint64_t>::max();

struct SamplingParams {
  // The defaults are the "balanced" preset. The repetition penalty is on by default: with it
  // off the default model (SmolLM2-135M) loops on one sentence within a 512-token story; 1.1
  // over the last 64 tokens is what Ollama ships (llama.cpp's own default is off).
  float temperature = 0.7f;         // 0 = greedy
  int32_t top_k = 40;               // 0 = off
  float top_p = 0.95f;              // 1 = off
  float min_p = 0.05f;              // 0 = off
  float repetition_penalty = 1.1f;  // 1 = off (llama.cpp semantics, over the last penalty_last_n)
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  int32_t penalty_last_n = 64;  // tokens the penalties look back over; -1 = all
  uint64_t seed = kRandomSeed;  // same seed, same prompt, same params -> same tokens
  int32_t max_tokens = 512;
  std::vector<std::string> stop_strings;
  bool ignore_eos = false;

  // The most likely token every step, on the raw logits (no penalties), seed 0.
  static SamplingParams greedy() {
    SamplingParams p;
    p.temperature = 0.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repetition_penalty = 1.0f;
    p.seed = 0;
    return p;
  }

  // Named starting points, shown to users by name (CLI --preset, the window's settings):
  // "precise" (low temperature, for facts and code), "balanced" (the defaults), "creative"
  // (higher temperature, wider nucleus) and "greedy". Only the sampling fields differ from
  // a default SamplingParams. Throws UsageError naming the presets for an unknown name.
  static SamplingParams preset(std::string_view name);
  // The preset names, in the order above.
  static std::span<const std::string_view> preset_names();
  // The preset name whose sampling fields equal these, or "" for none.
  static std::string_view preset_name_of(const SamplingParams& params);
};

// `seed`, or a fresh random seed (never kRandomSeed) when it is kRandomSeed.
uint64_t resolve_seed(uint64_t seed);

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
  double next_uniform();  // [0, 1)

  SamplingParams params_;
  uint64_t state_;  // splitmix64 state from the seed
  // Scratch reused across calls so a warm sampler does not allocate.
  std::vector<float> token_values_;                    // by id: logits, then weights
  std::vector<std::pair<float, int32_t>> candidates_;  // (value or weight, id)
  std::vector<int32_t> penalty_window_;
  std::vector<double> mass_by_log_weight_;  // top-p's histogram, see sampler.cpp
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
