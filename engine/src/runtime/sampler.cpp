// The host sampler: penalties, top-k, temperature, top-p, min-p and a seeded draw, in
// that order; the named presets and the random-seed rule; also the stop-string helpers
// used while streaming text.
#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <limits>
#include <random>
#include <string>

#include "granule/error.h"
#include "granule/sampling.h"

namespace granule {
namespace {

// Candidates in a total order (higher value first, then lower id), so every step that
// sorts or selects gives the same result with any standard library.
bool ranks_before(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// Sorting the top-p prefix starts with this many candidates and doubles: a peaked
// distribution needs only a few, a flat one pays for what it uses.
constexpr size_t kFirstTopPChunk = 64;

// Without top-k, top-p first finds roughly where its cut falls with a histogram of the
// log-weights (0 for the best token, down to -kMassBins * kMassBinWidth = -32, where a
// weight is 1e-14 of the best; everything lower shares the last bin), so it ranks only
// the tokens near and above the cut instead of the whole vocabulary.
constexpr size_t kMassBins = 512;
constexpr float kMassBinWidth = 1.0f / 16.0f;

constexpr float kInfinity = std::numeric_limits<float>::infinity();

// The largest value, NaN skipped. Eight independent running maxima keep the comparisons
// from forming one serial chain: std::max_element is several times slower on 150k.
float max_ignoring_nan(const std::vector<float>& values, bool& saw_nan) {
  constexpr size_t kLanes = 8;
  float lane_max[kLanes];
  int32_t lane_nans[kLanes];
  for (size_t j = 0; j < kLanes; ++j) lane_max[j] = -kInfinity, lane_nans[j] = 0;
  size_t i = 0;
  for (; i + kLanes <= values.size(); i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) {
      const float v = values[i + j];
      lane_max[j] = std::max(lane_max[j], v);  // (max < NaN) is false: NaN is skipped
      lane_nans[j] += v != v;
    }
  }
  float best = -kInfinity;
  saw_nan = false;
  for (size_t j = 0; j < kLanes; ++j)
    best = std::max(best, lane_max[j]), saw_nan |= lane_nans[j] != 0;
  for (; i < values.size(); ++i)
    best = std::max(best, values[i]), saw_nan |= values[i] != values[i];
  return best;
}

size_t mass_bin(float log_weight) {
  const float depth = -log_weight / kMassBinWidth;  // >= 0; +inf for a zero weight
  return depth < static_cast<float>(kMassBins) ? static_cast<size_t>(depth) : kMassBins;
}

constexpr size_t kPresetCount = std::size(kSamplingPresets);
constexpr std::array<std::string_view, kPresetCount> kPresetNames = [] {
  std::array<std::string_view, kPresetCount> names;
  for (size_t i = 0; i < kPresetCount; ++i) names[i] = kSamplingPresets[i].name;
  return names;
}();

// Only the fields a preset decides; max_tokens, stops and the seed are the caller's.
bool same_sampling(const SamplingParams& a, const SamplingParams& b) {
  return a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p &&
         a.min_p == b.min_p && a.repetition_penalty == b.repetition_penalty &&
         a.frequency_penalty == b.frequency_penalty && a.presence_penalty == b.presence_penalty &&
         a.penalty_last_n == b.penalty_last_n;
}

}  // namespace

SamplingParams SamplingParams::preset(const SamplingPreset& preset) {
  SamplingParams p;
  p.temperature = static_cast<float>(preset.temperature);
  p.top_k = preset.top_k;
  p.top_p = static_cast<float>(preset.top_p);
  p.min_p = static_cast<float>(preset.min_p);
  p.repetition_penalty = static_cast<float>(preset.repetition_penalty);
  return p;
}

SamplingParams SamplingParams::preset(std::string_view name) {
  for (const SamplingPreset& p : kSamplingPresets) {
    if (p.name == name) return preset(p);
  }
  std::string names;
  for (std::string_view n : kPresetNames) names += (names.empty() ? "" : ", ") + std::string(n);
  throw UsageError("unknown sampling preset '" + std::string(name) + "'; presets: " + names);
}

SamplingParams SamplingParams::greedy() {
  SamplingParams p = preset("greedy");
  p.seed = 0;
  return p;
}

std::span<const std::string_view> SamplingParams::preset_names() { return kPresetNames; }

std::string_view SamplingParams::preset_name_of(const SamplingParams& params) {
  for (const SamplingPreset& p : kSamplingPresets) {
    if (same_sampling(params, preset(p))) return p.name;
  }
  return {};
}

uint64_t resolve_seed(uint64_t seed) {
  if (seed != kRandomSeed) return seed;
  // 64 bits from the entropy source; one draw per request, so no generator is kept.
  std::random_device entropy;
  uint64_t fresh = kRandomSeed;
  while (fresh == kRandomSeed) {
    fresh = (static_cast<uint64_t>(entropy()) << 32) ^ static_cast<uint64_t>(entropy());
  }
  return fresh;
}

Sampler::Sampler(const SamplingParams& params) : params_(params), state_(params.seed) {}

void Sampler::set_draw_index(uint64_t draws) {
  state_ = params_.seed + draws * 0x9E3779B97F4A7C15ull;  // next_uniform's increment, draws times
}

double Sampler::next_uniform() {
  // splitmix64 (Steele, Lea and Flood 2014): full 2^64 period, passes BigCrush. Draw i
  // (from 0) hashes seed + (i + 1) * gamma and keeps the top 24 bits, exactly as the
  // device sampler's sampling_uniform(seed, i) does, so both backends draw the same u.
  state_ += 0x9E3779B97F4A7C15ull;
  uint64_t z = state_;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 40) * 0x1.0p-24;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  if (logits.empty()) throw UsageError("cannot sample from empty logits");
  if (logits.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw UsageError("vocabulary too large to sample from");
  }
  token_values_.assign(logits.begin(), logits.end());
  apply_penalties(history);
  bool saw_nan = false;
  float best = max_ignoring_nan(token_values_, saw_nan);
  if (saw_nan || best == kInfinity) {
    // NaN can never win; +inf would make every softmax weight NaN, so it becomes the
    // largest float, which still wins. Rare, so a second pass is fine.
    for (float& v : token_values_) {
      v = std::isnan(v) ? -kInfinity : std::min(v, std::numeric_limits<float>::max());
    }
    best = max_ignoring_nan(token_values_, saw_nan);
  }
  if (best == -kInfinity) throw UsageError("cannot sample: every logit is NaN or -inf");

  // A temperature so small that 1 / T overflows is the greedy limit (and would make the
  // best token's weight 0 * inf = NaN).
  const float inverse_temperature = 1.0f / params_.temperature;
  if (params_.temperature <= 0.0f || std::isinf(inverse_temperature) || params_.top_k == 1) {
    // The first position of the maximum: ties go to the lowest id.
    return static_cast<int32_t>(std::find(token_values_.begin(), token_values_.end(), best) -
                                token_values_.begin());
  }
  const auto vocab = static_cast<int64_t>(token_values_.size());
  if (params_.top_k > 0 && params_.top_k < vocab) return sample_top_k(inverse_temperature);
  return sample_all(best, inverse_temperature);
}

void Sampler::apply_penalties(std::span<const int32_t> history) {
  const bool repetition = params_.repetition_penalty != 1.0f;
  if ((!repetition && params_.frequency_penalty == 0.0f && params_.presence_penalty == 0.0f) ||
      params_.penalty_last_n == 0 || history.empty()) {
    return;
  }
  // penalty_last_n < 0 means the whole history.
  const size_t window = params_.penalty_last_n < 0
                            ? history.size()
                            : std::min(history.size(), static_cast<size_t>(params_.penalty_last_n));
  penalty_window_.assign(history.end() - static_cast<std::ptrdiff_t>(window), history.end());
  std::sort(penalty_window_.begin(), penalty_window_.end());
  const auto vocab = static_cast<int32_t>(token_values_.size());
  for (size_t i = 0; i < penalty_window_.size();) {
    const int32_t token = penalty_window_[i];
    size_t count = 0;
    while (i < penalty_window_.size() && penalty_window_[i] == token) ++i, ++count;
    if (token < 0 || token >= vocab) continue;
    float& v = token_values_[static_cast<size_t>(token)];
    // llama.cpp's rule: a repeated token always becomes less likely, whatever its sign.
    if (repetition) v = v <= 0.0f ? v * params_.repetition_penalty : v / params_.repetition_penalty;
    v -= static_cast<float>(count) * params_.frequency_penalty + params_.presence_penalty;
  }
}

int32_t Sampler::sample_top_k(float inverse_temperature) {
  // One pass with a heap of the k best so far, its worst on top: after the first few
  // thousand tokens almost every token loses one comparison and is never moved.
  const auto k = static_cast<size_t>(params_.top_k);
  candidates_.clear();
  for (size_t i = 0; i < token_values_.size(); ++i) {
    const float v = token_values_[i];
    if (candidates_.size() < k) {
      candidates_.emplace_back(v, static_cast<int32_t>(i));
      std::push_heap(candidates_.begin(), candidates_.end(), ranks_before);
    } else if (v > candidates_.front().first) {  // equal values: the lower id, kept, wins
      std::pop_heap(candidates_.begin(), candidates_.end(), ranks_before);
      candidates_.back() = {v, static_cast<int32_t>(i)};
      std::push_heap(candidates_.begin(), candidates_.end(), ranks_before);
    }
  }
  std::sort_heap(candidates_.begin(), candidates_.end(), ranks_before);

  // Softmax weights relative to the best (which gets 1), so nothing overflows.
  const float best = candidates_[0].first;
  double total_weight = 0;
  for (size_t i = 0; i < k; ++i) {
    const float weight = std::exp((candidates_[i].first - best) * inverse_temperature);
    candidates_[i].first = weight;
    total_weight += weight;
  }
  size_t keep = k;
  if (params_.top_p < 1.0f) keep = top_p_prefix(k, k, total_weight);
  if (params_.min_p > 0.0f) {
    // p_i / p_max is the weight itself, unchanged by renormalisation after top-p.
    const float threshold = std::min(params_.min_p, 1.0f);
    size_t min_p_keep = 1;
    while (min_p_keep < keep && candidates_[min_p_keep].first >= threshold) ++min_p_keep;
    keep = min_p_keep;
  }
  return draw_from_prefix(keep);
}

int32_t Sampler::sample_all(float best, float inverse_temperature) {
  const size_t n = token_values_.size();
  const bool use_top_p = params_.top_p < 1.0f;
  if (use_top_p) mass_by_log_weight_.assign(kMassBins + 1, 0.0);
  double total_weight = 0;
  for (size_t i = 0; i < n; ++i) {
    const float log_weight = (token_values_[i] - best) * inverse_temperature;
    const float weight = std::exp(log_weight);
    token_values_[i] = weight;
    total_weight += weight;
    if (use_top_p) mass_by_log_weight_[mass_bin(log_weight)] += weight;
  }
  // Top-p keeps a prefix of the ranked order and min-p keeps every weight >= min_p, itself
  // a prefix of that order, so applying them in sequence keeps their intersection.
  const float min_p_threshold = std::min(std::max(params_.min_p, 0.0f), 1.0f);

  if (use_top_p) {
    // Top-p's cut lies in the first bin where the mass counted from the top reaches top_p;
    // only tokens down to one bin below it (a margin for rounding) need ranking.
    const double target = static_cast<double>(params_.top_p) * total_weight;
    double mass = 0;
    size_t cut = 0;
    for (; cut < kMassBins; ++cut) {
      mass += mass_by_log_weight_[cut];
      if (mass >= target) break;
    }
    const float lowest_weight =
        cut + 2 > kMassBins ? 0.0f : std::exp(-static_cast<float>(cut + 2) * kMassBinWidth);
    candidates_.clear();
    for (size_t i = 0; i < n; ++i) {
      const float weight = token_values_[i];
      if (weight > 0.0f && weight >= min_p_threshold && weight >= lowest_weight) {
        candidates_.emplace_back(weight, static_cast<int32_t>(i));
      }
    }
    return draw_from_prefix(top_p_prefix(candidates_.size(), 0, total_weight));
  }

  // No ranking needed: draw straight over the ids, in id order.
  double kept_weight = 0;
  for (size_t i = 0; i < n; ++i) {
    if (token_values_[i] >= min_p_threshold) kept_weight += token_values_[i];
  }
  const double target = next_uniform() * kept_weight;
  double cumulative = 0;
  size_t last_drawable = 0;
  for (size_t i = 0; i < n; ++i) {
    const float weight = token_values_[i];
    if (weight <= 0.0f || weight < min_p_threshold) continue;
    cumulative += weight;
    last_drawable = i;
    if (target < cumulative) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last_drawable);  // rounding left the target at the very end
}

size_t Sampler::top_p_prefix(size_t count, size_t sorted, double total_weight) {
  // Keeps the best candidates until their probability reaches top_p (at least one), the
  // probability being over everything top-k left, before min-p.
  const double target = static_cast<double>(params_.top_p) * total_weight;
  const auto begin = candidates_.begin();
  double cumulative = 0;
  for (size_t i = 0; i < count; ++i) {
    if (i == sorted) {
      const size_t end = std::min(count, std::max(kFirstTopPChunk, sorted * 2));
      if (end < count) {
        std::nth_element(begin + static_cast<std::ptrdiff_t>(sorted),
                         begin + static_cast<std::ptrdiff_t>(end),
                         begin + static_cast<std::ptrdiff_t>(count), ranks_before);
      }
      std::sort(begin + static_cast<std::ptrdiff_t>(sorted),
                begin + static_cast<std::ptrdiff_t>(end), ranks_before);
      sorted = end;
    }
    cumulative += candidates_[i].first;
    if (cumulative >= target) return i + 1;
  }
  return count;
}

int32_t Sampler::draw_from_prefix(size_t count) {
  double kept_weight = 0;
  for (size_t i = 0; i < count; ++i) kept_weight += candidates_[i].first;
  const double target = next_uniform() * kept_weight;
  double cumulative = 0;
  for (size_t i = 0; i < count; ++i) {
    cumulative += candidates_[i].first;
    if (target < cumulative) return candidates_[i].second;
  }
  return candidates_[count - 1].second;  // rounding left the target at the very end
}

size_t find_stop_string(std::string_view text, const std::vector<std::string>& stops) {
  size_t earliest = std::string_view::npos;
  for (const std::string& stop : stops) {
    if (stop.empty()) continue;
    const size_t at = text.find(stop);
    if (at < earliest) earliest = at;
  }
  return earliest;
}

size_t stop_string_holdback(std::string_view text, const std::vector<std::string>& stops) {
  size_t longest = 0;
  for (const std::string& stop : stops) {
    // Longest first: the first suffix that matches is this stop's answer.
    for (size_t length = std::min(stop.size() - (stop.empty() ? 0 : 1), text.size());
         length > longest; --length) {
      if (text.substr(text.size() - length) == std::string_view(stop).substr(0, length)) {
        longest = length;
        break;
      }
    }
  }
  return longest;
}

}  // namespace granule
