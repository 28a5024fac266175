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

// The valid values of one sampling field and its default. The CLI and the server refuse a
// value outside [min, max]; the window clamps to it.
template <class T>
struct SamplingRange {
  T min;
  T max;
  T default_value;
  constexpr T clamp(T v) const { return v < min ? min : (max < v ? max : v); }
  constexpr bool contains(T v) const { return min <= v && v <= max; }
};

// The one table of sampling fields a user sets: each one's range and default. The defaults
// are the "balanced" preset. The repetition penalty is on by default: with it off the default
// model (SmolLM2-135M) loops on one sentence within a 512-token story; 1.1 over the last 64
// tokens is what Ollama ships (llama.cpp's own default is off). Temperature and the
// frequency/presence penalties end where OpenAI's API ends them.
struct SamplingRanges {
  SamplingRange<double> temperature{0.0, 2.0, 0.7};            // 0 = greedy
  SamplingRange<int32_t> top_k{0, 1 << 20, 40};                // 0 = off
  SamplingRange<double> top_p{0.0, 1.0, 0.95};                 // 1 = off
  SamplingRange<double> min_p{0.0, 1.0, 0.05};                 // 0 = off
  SamplingRange<double> repetition_penalty{0.01, 100.0, 1.1};  // 1 = off
  SamplingRange<double> frequency_penalty{-2.0, 2.0, 0.0};
  SamplingRange<double> presence_penalty{-2.0, 2.0, 0.0};
  SamplingRange<int32_t> penalty_last_n{-1, 1 << 20, 64};  // -1 = all
  SamplingRange<int32_t> max_tokens{1, 1 << 20, 512};
};
inline constexpr SamplingRanges kSamplingRanges{};

// A named starting point, shown to users by name (CLI --preset, the window's settings): the
// sampling fields it sets. The penalties' window, max_tokens, stops and the seed stay the
// caller's.
struct SamplingPreset {
  std::string_view name;
  double temperature;
  int32_t top_k;
  double top_p;
  double min_p;
  double repetition_penalty;
};

namespace detail {
// "balanced" is the defaults; the others say how they differ from it.
inline constexpr SamplingPreset kBalancedPreset{"balanced",
                                                kSamplingRanges.temperature.default_value,
                                                kSamplingRanges.top_k.default_value,
                                                kSamplingRanges.top_p.default_value,
                                                kSamplingRanges.min_p.default_value,
                                                kSamplingRanges.repetition_penalty.default_value};
}  // namespace detail

// The one table of presets, in the order users see them: "precise" (low temperature, for
// facts and code), "balanced" (the defaults), "creative" (higher temperature, wider nucleus)
// and "greedy" (the most likely token every step, no penalty).
inline constexpr SamplingPreset kSamplingPresets[] = {
    {"precise", 0.3, detail::kBalancedPreset.top_k, 0.9, 0.1,
     detail::kBalancedPreset.repetition_penalty},
    detail::kBalancedPreset,
    {"creative", 1.0, 100, 0.98, detail::kBalancedPreset.min_p,
     detail::kBalancedPreset.repetition_penalty},
    {"greedy", 0.0, 0, 1.0, 0.0, 1.0},
};

struct SamplingParams {
  // Defaults from kSamplingRanges (the "balanced" preset).
  float temperature = static_cast<float>(kSamplingRanges.temperature.default_value);
  int32_t top_k = kSamplingRanges.top_k.default_value;
  float top_p = static_cast<float>(kSamplingRanges.top_p.default_value);
  float min_p = static_cast<float>(kSamplingRanges.min_p.default_value);
  // llama.cpp semantics, over the last penalty_last_n tokens.
  float repetition_penalty = static_cast<float>(kSamplingRanges.repetition_penalty.default_value);
  float frequency_penalty = static_cast<float>(kSamplingRanges.frequency_penalty.default_value);
  float presence_penalty = static_cast<float>(kSamplingRanges.presence_penalty.default_value);
  int32_t penalty_last_n = kSamplingRanges.penalty_last_n.default_value;  // tokens looked back
  uint64_t seed = kRandomSeed;  // same seed, same prompt, same params -> same tokens
  int32_t max_tokens = kSamplingRanges.max_tokens.default_value;
  std::vector<std::string> stop_strings;
  bool ignore_eos = false;

  // The "greedy" preset with seed 0.
  static SamplingParams greedy();

  // A default SamplingParams with the preset's fields. Throws UsageError naming the presets
  // for an unknown name.
  static SamplingParams preset(std::string_view name);
  static SamplingParams preset(const SamplingPreset& preset);
  // The preset names, in kSamplingPresets' order.
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
