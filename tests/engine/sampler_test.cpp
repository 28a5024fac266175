// Tests for the host Sampler (greedy, penalties, top-k, temperature, top-p, min-p, seeded
// draws) and the stop-string helpers. Expected distributions come from
// tests/reference/sampler_reference.py (float64, full sort), pasted below; draws are
// compared with them by a chi-square statistic under a fixed seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "granule/error.h"
#include "granule/sampling.h"

namespace granule {
namespace {

SamplingParams plain(float temperature) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  return p;
}

std::vector<int> draw_counts(Sampler& sampler, const std::vector<float>& logits,
                             const std::vector<int32_t>& history, int draws) {
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) ++counts[sampler.sample(logits, history)];
  return counts;
}

// Pearson's chi-square of counts against expected probabilities. A token with
// probability 0 that was drawn even once fails the test outright.
void expect_matches_distribution(const std::vector<int>& counts,
                                 const std::vector<double>& expected, int draws) {
  ASSERT_EQ(counts.size(), expected.size());
  double chi_square = 0;
  int categories = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " should be excluded";
      continue;
    }
    const double e = expected[i] * draws;
    chi_square += (counts[i] - e) * (counts[i] - e) / e;
    ++categories;
    // Each token on its own within 5 standard deviations of its binomial count (+1 for the
    // counts' discreteness): the sum above spreads one token's error over the degrees of
    // freedom, this does not (1 point of probability on a 40% token at 200,000 draws is 2,000
    // counts, 9 deviations).
    const double sd = std::sqrt(e * (1.0 - expected[i]));
    EXPECT_LE(std::abs(counts[i] - e), 5 * sd + 1)
        << "token " << i << ": " << counts[i] << " draws, expected " << e << " +- " << sd;
  }
  // For k - 1 degrees of freedom the statistic has mean k - 1 and deviation sqrt(2(k - 1));
  // the bound is far out (the seed is fixed, so this is about a gross mismatch, not luck).
  const double dof = std::max(1, categories - 1);
  EXPECT_LT(chi_square, dof + 8 * std::sqrt(2 * dof) + 10) << "chi-square over " << categories;
}

TEST(Sampler, GreedyIsArgmaxAndTiesGoToTheLowestId) {
  Sampler sampler(SamplingParams::greedy());
  EXPECT_EQ(sampler.sample(std::vector<float>{0.1f, 3.0f, -2.0f, 2.9f}, {}), 1);
  EXPECT_EQ(sampler.sample(std::vector<float>{1.0f, 5.0f, 5.0f, 5.0f}, {}), 1);
  EXPECT_EQ(sampler.sample(std::vector<float>{-1.0f, -1.0f}, {}), 0);
  // Negative temperatures are greedy too.
  Sampler negative(plain(-1.0f));
  EXPECT_EQ(negative.sample(std::vector<float>{0.0f, 0.5f, 0.25f}, {}), 1);
}

TEST(Sampler, NanLogitsNeverWinAndAllInvalidLogitsThrow) {
  const float nan = std::nanf("");
  const float inf = std::numeric_limits<float>::infinity();
  Sampler greedy(SamplingParams::greedy());
  EXPECT_EQ(greedy.sample(std::vector<float>{nan, 1.0f, nan}, {}), 1);
  EXPECT_EQ(greedy.sample(std::vector<float>{1.0f, inf, 2.0f}, {}), 1);
  EXPECT_THROW(greedy.sample(std::vector<float>{nan, -inf}, {}), UsageError);
  EXPECT_THROW(greedy.sample(std::vector<float>{}, {}), UsageError);
  Sampler random(plain(1.0f));
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(random.sample(std::vector<float>{nan, 0.0f, -inf, inf}, {}), 3);
  }
}

TEST(Sampler, TopKOfOneIsGreedyAtAnyTemperature) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  SamplingParams params = plain(1.5f);
  params.top_k = 1;
  Sampler top1(params);
  Sampler greedy(SamplingParams::greedy());
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<float> logits(1000);
    for (float& v : logits) v = normal(rng);
    logits[rng() % 1000] = 100.0f;
    logits[rng() % 1000] = 100.0f;  // sometimes a tie: both must pick the lower id
    EXPECT_EQ(top1.sample(logits, {}), greedy.sample(logits, {})) << "trial " << trial;
  }
}

TEST(Sampler, SameSeedSameTokensAndDifferentSeedsDiffer) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> logits(5000);
  for (float& v : logits) v = normal(rng);
  SamplingParams params;  // the defaults: top-k 40, top-p 0.95, min-p 0.05, T 0.7
  params.temperature = 1.5f;
  params.seed = 1234;
  Sampler a(params), b(params);
  params.seed = 1235;
  Sampler c(params);
  int differences = 0;
  for (int i = 0; i < 1000; ++i) {
    const int32_t from_a = a.sample(logits, {});
    EXPECT_EQ(from_a, b.sample(logits, {})) << "draw " << i;
    differences += from_a != c.sample(logits, {});
  }
  EXPECT_GT(differences, 500);
}

TEST(Sampler, DrawsFollowSplitmix64Exactly) {
  // Uniform logits over 1000 tokens: every weight is exactly 1, so draw i is
  // floor(u_i * 1000) with u_i the top 24 bits of splitmix64 at seed + (i + 1) * gamma,
  // the device sampler's formula. Values from sampler_reference.py (seed 42); they pin
  // the generator across platforms and backends.
  const std::vector<int32_t> expected = {741, 159, 278, 344, 38, 868, 218, 800, 339, 618};
  SamplingParams params = plain(1.0f);
  params.seed = 42;
  Sampler sampler(params);
  const std::vector<float> logits(1000, 0.25f);
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(sampler.sample(logits, {}), expected[i]) << "draw " << i;
  }
}

TEST(Sampler, LowTemperatureApproachesGreedy) {
  const std::vector<float> logits = {1.0f, 2.0f, 1.9f, -3.0f, 1.99f};
  for (float temperature : {1e-40f, 1e-4f, 1e-3f}) {  // 1 / 1e-40 overflows a float
    SamplingParams params = plain(temperature);
    params.seed = 5;
    Sampler sampler(params);
    for (int i = 0; i < 2000; ++i) ASSERT_EQ(sampler.sample(logits, {}), 1) << temperature;
  }
  // At T = 0.1 the runner-up (0.01 behind) still wins 40% of draws: the limit is
  // approached smoothly, not switched on. Weights e^((l - 2) / 0.1) in closed form.
  SamplingParams params = plain(0.1f);
  Sampler sampler(params);
  const auto counts = draw_counts(sampler, logits, {}, 20000);
  const double e1 = 1.0, e4 = std::exp(-0.1), e2 = std::exp(-1.0);
  const double total = e1 + e4 + e2;  // tokens 0 and 3 are ~e^-10 and below
  expect_matches_distribution(
      counts, {std::exp(-10.0) / total, e1 / total, e2 / total, 0.0, e4 / total}, 20000);
}

TEST(Sampler, TemperatureOneMatchesSoftmax) {
  // sampler_reference.py: SoftmaxAtTemperatureOne.
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 1.0f, 0.0f, -0.5f, 1.5f, -2.0f};
  const std::vector<double> expected = {0.089860844316, 0.020050664583, 0.402728363822,
                                        0.148155485427, 0.054503357185, 0.033057957190,
                                        0.244267100194, 0.007376227282};
  SamplingParams params = plain(1.0f);
  params.seed = 99;
  Sampler sampler(params);
  constexpr int kDraws = 200000;
  expect_matches_distribution(draw_counts(sampler, logits, {}, kDraws), expected, kDraws);
}

TEST(Sampler, TopPKeepsTheSmallestPrefixReachingP) {
  // sampler_reference.py: TopPOnly. Softmax gives 0.442, 0.268, 0.163, ...: the first
  // token alone is short of 0.7, the first two reach 0.710, so exactly two are kept.
  const std::vector<float> logits = {3.0f, 2.5f, 2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -3.0f};
  const std::vector<double> expected = {0.622459331202, 0.377540668798, 0, 0, 0, 0, 0, 0};
  SamplingParams params = plain(1.0f);
  params.top_p = 0.7f;
  params.seed = 3;
  Sampler sampler(params);
  constexpr int kDraws = 100000;
  expect_matches_distribution(draw_counts(sampler, logits, {}, kDraws), expected, kDraws);
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheBest) {
  // sampler_reference.py: MinPOnly. e^(1 - 3) = 0.135 < 0.2 drops token 3 and below.
  const std::vector<float> logits = {3.0f, 2.5f, 2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -3.0f};
  const std::vector<double> expected = {
      0.506480391056, 0.307195885718, 0.186323723226, 0, 0, 0, 0, 0};
  SamplingParams params = plain(1.0f);
  params.min_p = 0.2f;
  params.seed = 4;
  Sampler sampler(params);
  constexpr int kDraws = 100000;
  expect_matches_distribution(draw_counts(sampler, logits, {}, kDraws), expected, kDraws);
}

TEST(Sampler, TopPThenMinPWithoutTopK) {
  // sampler_reference.py: TopPAndMinPWithoutTopK (T 1.5, top-p 0.8, min-p 0.3).
  const std::vector<float> logits = {1.0f, 2.8f, 2.5f, 0.2f, 2.9f, 0.0f, -1.0f, 1.7f};
  const std::vector<double> expected = {0, 0.296914303853, 0.243092871593, 0, 0.317383310444, 0,
                                        0, 0.142609514110};
  SamplingParams params = plain(1.5f);
  params.top_p = 0.8f;
  params.min_p = 0.3f;
  params.seed = 8;
  Sampler sampler(params);
  constexpr int kDraws = 100000;
  expect_matches_distribution(draw_counts(sampler, logits, {}, kDraws), expected, kDraws);
}

TEST(Sampler, EveryStageInOrderWithPenalties) {
  // sampler_reference.py: AllStagesTogether. Penalties (repetition 1.3, frequency 0.2,
  // presence 0.5 over history 0,0,3,6,9) move token 0 from first to fourth; top-k 6 drops
  // 5,6,7,9; top-p 0.9 at T 0.8 drops 4 and 3; min-p 0.25 drops token 0.
  const std::vector<float> logits = {2.0f, 1.5f, 1.2f, 0.9f, 0.3f, -0.2f, -0.4f, -1.0f, 1.9f, 0.0f};
  const std::vector<int32_t> history = {0, 0, 3, 6, 9};
  const std::vector<double> expected = {
      0, 0.299759243913, 0.206021314560, 0, 0, 0, 0, 0, 0.494219441528, 0};
  SamplingParams params;
  params.temperature = 0.8f;
  params.top_k = 6;
  params.top_p = 0.9f;
  params.min_p = 0.25f;
  params.repetition_penalty = 1.3f;
  params.frequency_penalty = 0.2f;
  params.presence_penalty = 0.5f;
  params.seed = 17;
  Sampler sampler(params);
  constexpr int kDraws = 100000;
  expect_matches_distribution(draw_counts(sampler, logits, history, kDraws), expected, kDraws);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  SamplingParams params = SamplingParams::greedy();
  params.repetition_penalty = 1.2f;
  // 2.0 / 1.2 = 1.67 falls below 1.8.
  EXPECT_EQ(Sampler(params).sample(std::vector<float>{2.0f, 1.8f}, std::vector<int32_t>{0}), 1);
  params.repetition_penalty = 1.1f;  // 2.0 / 1.1 = 1.82 stays above
  EXPECT_EQ(Sampler(params).sample(std::vector<float>{2.0f, 1.8f}, std::vector<int32_t>{0}), 0);
  // -0.4 * 1.3 = -0.52 falls below -0.5 (dividing would have raised it to -0.31).
  params.repetition_penalty = 1.3f;
  EXPECT_EQ(Sampler(params).sample(std::vector<float>{-0.5f, -0.4f}, std::vector<int32_t>{1}), 0);
  // Tokens outside the vocabulary in the history are ignored.
  EXPECT_EQ(
      Sampler(params).sample(std::vector<float>{-0.5f, -0.4f}, std::vector<int32_t>{-1, 7, 1000}),
      1);
}

TEST(Sampler, FrequencyPenaltyScalesWithCountAndPresenceDoesNot) {
  SamplingParams params = SamplingParams::greedy();
  params.frequency_penalty = 0.2f;
  const std::vector<float> logits = {1.0f, 0.5f};
  EXPECT_EQ(Sampler(params).sample(logits, std::vector<int32_t>{0}), 0);        // 0.8 > 0.5
  EXPECT_EQ(Sampler(params).sample(logits, std::vector<int32_t>{0, 0, 0}), 1);  // 0.4 < 0.5
  params.frequency_penalty = 0.0f;
  params.presence_penalty = 0.3f;
  const std::vector<float> close = {1.0f, 0.6f};
  EXPECT_EQ(Sampler(params).sample(close, std::vector<int32_t>{0, 0, 0}), 0);  // 0.7 > 0.6
  params.presence_penalty = 0.5f;
  EXPECT_EQ(Sampler(params).sample(close, std::vector<int32_t>{0}), 1);  // 0.5 < 0.6
}

TEST(Sampler, PenaltiesLookOnlyAtTheLastNTokens) {
  SamplingParams params = SamplingParams::greedy();
  params.repetition_penalty = 2.0f;
  params.penalty_last_n = 3;
  const std::vector<float> logits = {2.0f, 1.5f, 0.0f};
  // Token 0 is four tokens back: outside the window, so not penalised.
  EXPECT_EQ(Sampler(params).sample(logits, std::vector<int32_t>{0, 2, 2, 2}), 0);
  EXPECT_EQ(Sampler(params).sample(logits, std::vector<int32_t>{2, 0, 2, 2}), 1);
  params.penalty_last_n = 0;  // off
  EXPECT_EQ(Sampler(params).sample(logits, std::vector<int32_t>{0, 0}), 0);
  params.penalty_last_n = -1;  // the whole history
  std::vector<int32_t> long_history(500, 2);
  long_history[0] = 0;
  EXPECT_EQ(Sampler(params).sample(logits, long_history), 1);
}

// The kept set computed the obvious way: rank everything, apply each filter in turn.
std::vector<bool> reference_kept(const std::vector<float>& logits, float temperature, int32_t top_k,
                                 float top_p, float min_p) {
  std::vector<int32_t> ranked(logits.size());
  std::iota(ranked.begin(), ranked.end(), 0);
  std::stable_sort(ranked.begin(), ranked.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (top_k > 0 && static_cast<size_t>(top_k) < ranked.size()) ranked.resize(top_k);
  const double best = logits[ranked[0]];
  double total = 0;
  for (int32_t id : ranked) total += std::exp((logits[id] - best) / temperature);
  size_t keep = ranked.size();
  double mass = 0;
  for (size_t i = 0; i < ranked.size() && top_p < 1.0f; ++i) {
    mass += std::exp((logits[ranked[i]] - best) / temperature) / total;
    if (mass >= top_p) {
      keep = i + 1;
      break;
    }
  }
  std::vector<bool> kept(logits.size(), false);
  for (size_t i = 0; i < keep; ++i) {
    if (i == 0 || std::exp((logits[ranked[i]] - best) / temperature) >= min_p) {
      kept[ranked[i]] = true;
    }
  }
  return kept;
}

TEST(Sampler, LargeVocabularyDrawsStayInsideTheFilteredSet) {
  // A 150k vocabulary exercises the partial sorts (nth_element chunks) rather than the
  // small cases above; every draw must fall in the set a plain full sort keeps.
  std::mt19937 rng(2026);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(150000);
  for (float& v : logits) v = normal(rng);
  struct Case {
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
  };
  for (const Case& c :
       {Case{1.0f, 0, 0.5f, 0.0f}, Case{0.7f, 40, 0.95f, 0.05f}, Case{1.2f, 0, 0.9f, 0.01f},
        Case{1.0f, 0, 1.0f, 0.3f}, Case{2.0f, 1000, 0.99f, 0.0f}}) {
    SamplingParams params = plain(c.temperature);
    params.top_k = c.top_k;
    params.top_p = c.top_p;
    params.min_p = c.min_p;
    params.seed = 77;
    Sampler sampler(params);
    const std::vector<bool> kept = reference_kept(logits, c.temperature, c.top_k, c.top_p, c.min_p);
    const auto kept_count = std::count(kept.begin(), kept.end(), true);
    std::vector<bool> seen(logits.size(), false);
    for (int i = 0; i < 300; ++i) {
      const int32_t token = sampler.sample(logits, {});
      ASSERT_TRUE(kept[token]) << "token " << token << " outside the kept set of " << kept_count
                               << " (T " << c.temperature << ", top-k " << c.top_k << ", top-p "
                               << c.top_p << ", min-p " << c.min_p << ")";
      seen[token] = true;
    }
    // More than one token was ever drawn whenever more than one was kept.
    if (kept_count > 1) EXPECT_GT(std::count(seen.begin(), seen.end(), true), 1);
  }
}

TEST(StopStrings, FindsTheEarliestCompleteStop) {
  const std::vector<std::string> stops = {"END", "STOP", ""};
  EXPECT_EQ(find_stop_string("abc STOP xyz END", stops), 4u);
  EXPECT_EQ(find_stop_string("ENDSTOP", stops), 0u);
  EXPECT_EQ(find_stop_string("no stop here", stops), std::string_view::npos);
  EXPECT_EQ(find_stop_string("Hello</s>", {"</s>"}), 5u);
  EXPECT_EQ(find_stop_string("anything", {}), std::string_view::npos);
  EXPECT_EQ(find_stop_string("anything", {""}), std::string_view::npos);
}

TEST(StopStrings, HoldsBackTheLongestSuffixThatCouldStartAStop) {
  const std::vector<std::string> stops = {"</s>"};
  EXPECT_EQ(stop_string_holdback("Hello", stops), 0u);
  EXPECT_EQ(stop_string_holdback("Hello <", stops), 1u);
  EXPECT_EQ(stop_string_holdback("Hello </", stops), 2u);
  EXPECT_EQ(stop_string_holdback("Hello </s", stops), 3u);
  EXPECT_EQ(stop_string_holdback("</", stops), 2u);
  EXPECT_EQ(stop_string_holdback("", stops), 0u);
  // A complete stop is found by find_stop_string, not held back.
  EXPECT_EQ(stop_string_holdback("</s>", stops), 0u);
  // Several stops: the longest candidate wins.
  EXPECT_EQ(stop_string_holdback("<|im_e", {"<|im_end|>", "\n\n"}), 6u);
  EXPECT_EQ(stop_string_holdback("line\n", {"<|im_end|>", "\n\nUser:"}), 1u);
  // Self-overlapping stops: "xaaa" ends with "aa", a prefix of "aab".
  EXPECT_EQ(stop_string_holdback("xaaa", {"aab"}), 2u);
  EXPECT_EQ(stop_string_holdback("text", {""}), 0u);
  // UTF-8: the held-back part starts on the stop's first byte, a character boundary.
  EXPECT_EQ(stop_string_holdback("你好\xE3\x80", {"\xE3\x80\x82"}), 2u);  // "。"
}

TEST(StopStrings, StreamingWithTheHelpersSendsExactlyTheTextBeforeTheStop) {
  // What the engine does per token: append, cut at a complete stop, otherwise send all
  // but the hold-back. Random chunkings of the same text must send the same prefix.
  const std::string text = "The answer is 42.\n\nUser: and again <|im_end|> trailing";
  const std::vector<std::string> stops = {"<|im_end|>", "\n\nUser:"};
  const std::string want = "The answer is 42.";
  std::mt19937 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::string pending, sent;
    bool stopped = false;
    for (size_t at = 0; at < text.size() && !stopped;) {
      const size_t chunk = std::min(text.size() - at, size_t{1} + rng() % 4);
      pending += text.substr(at, chunk);
      at += chunk;
      const size_t stop_at = find_stop_string(pending, stops);
      if (stop_at != std::string_view::npos) {
        sent += pending.substr(0, stop_at);
        stopped = true;
        break;
      }
      const size_t hold = stop_string_holdback(pending, stops);
      sent += pending.substr(0, pending.size() - hold);
      pending.erase(0, pending.size() - hold);
    }
    ASSERT_TRUE(stopped);
    ASSERT_EQ(sent, want) << "trial " << trial;
  }
}

// The case: the named presets. "balanced" is exactly the defaults, every name maps back to
// itself, greedy turns the penalty off, and an unknown name is a UsageError that lists them.
TEST(SamplerPresets, NamesDefaultsAndUnknownName) {
  const auto names = SamplingParams::preset_names();
  ASSERT_EQ(names.size(), 4u);
  EXPECT_EQ(names[0], "precise");
  EXPECT_EQ(names[1], "balanced");
  EXPECT_EQ(names[2], "creative");
  EXPECT_EQ(names[3], "greedy");
  EXPECT_EQ(SamplingParams::preset_name_of(SamplingParams{}), "balanced");
  for (std::string_view name : names) {
    EXPECT_EQ(SamplingParams::preset_name_of(SamplingParams::preset(name)), name);
  }
  const SamplingParams greedy = SamplingParams::preset("greedy");
  EXPECT_EQ(greedy.temperature, 0.0f);
  EXPECT_EQ(greedy.repetition_penalty, 1.0f);
  EXPECT_GT(SamplingParams::preset("creative").temperature, SamplingParams{}.temperature);
  EXPECT_LT(SamplingParams::preset("precise").temperature, SamplingParams{}.temperature);
  SamplingParams changed;
  changed.temperature = 0.5f;
  EXPECT_EQ(SamplingParams::preset_name_of(changed), "");
  try {
    SamplingParams::preset("wild");
    FAIL() << "no error for an unknown preset";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(),
                 "unknown sampling preset 'wild'; presets: precise, balanced, creative, greedy");
  }
}

// The case: the preset table and the range table are one source. Each preset's values are
// its row of kSamplingPresets (the same floats as before the table: precise 0.3/0.9/0.1,
// creative 1.0/100/0.98), every preset lies inside the ranges, and a default SamplingParams
// holds each range's default.
TEST(SamplerPresets, PresetsAndDefaultsComeFromTheTables) {
  ASSERT_EQ(std::size(kSamplingPresets), SamplingParams::preset_names().size());
  for (const SamplingPreset& row : kSamplingPresets) {
    const SamplingParams p = SamplingParams::preset(row.name);
    EXPECT_EQ(p.temperature, static_cast<float>(row.temperature)) << row.name;
    EXPECT_EQ(p.top_k, row.top_k) << row.name;
    EXPECT_EQ(p.top_p, static_cast<float>(row.top_p)) << row.name;
    EXPECT_EQ(p.min_p, static_cast<float>(row.min_p)) << row.name;
    EXPECT_EQ(p.repetition_penalty, static_cast<float>(row.repetition_penalty)) << row.name;
    EXPECT_TRUE(kSamplingRanges.temperature.contains(row.temperature)) << row.name;
    EXPECT_TRUE(kSamplingRanges.top_k.contains(row.top_k)) << row.name;
    EXPECT_TRUE(kSamplingRanges.top_p.contains(row.top_p)) << row.name;
    EXPECT_TRUE(kSamplingRanges.min_p.contains(row.min_p)) << row.name;
    EXPECT_TRUE(kSamplingRanges.repetition_penalty.contains(row.repetition_penalty)) << row.name;
  }
  const SamplingParams precise = SamplingParams::preset("precise");
  EXPECT_EQ(precise.temperature, 0.3f);
  EXPECT_EQ(precise.top_k, 40);
  EXPECT_EQ(precise.top_p, 0.9f);
  EXPECT_EQ(precise.min_p, 0.1f);
  EXPECT_EQ(precise.repetition_penalty, 1.1f);
  const SamplingParams creative = SamplingParams::preset("creative");
  EXPECT_EQ(creative.temperature, 1.0f);
  EXPECT_EQ(creative.top_k, 100);
  EXPECT_EQ(creative.top_p, 0.98f);
  EXPECT_EQ(creative.min_p, 0.05f);
  const SamplingParams d;
  EXPECT_EQ(d.temperature, 0.7f);
  EXPECT_EQ(d.top_k, kSamplingRanges.top_k.default_value);
  EXPECT_EQ(d.top_p, 0.95f);
  EXPECT_EQ(d.min_p, 0.05f);
  EXPECT_EQ(d.repetition_penalty, 1.1f);
  EXPECT_EQ(d.frequency_penalty, 0.0f);
  EXPECT_EQ(d.presence_penalty, 0.0f);
  EXPECT_EQ(d.penalty_last_n, kSamplingRanges.penalty_last_n.default_value);
  EXPECT_EQ(d.max_tokens, kSamplingRanges.max_tokens.default_value);
  const SamplingParams greedy = SamplingParams::greedy();
  EXPECT_EQ(greedy.seed, 0u);
  EXPECT_EQ(SamplingParams::preset_name_of(greedy), "greedy");
}

// The case: a range clamps and says what it contains, ends included.
TEST(SamplerPresets, RangesClampAndContain) {
  constexpr SamplingRange<double> r = kSamplingRanges.temperature;
  static_assert(r.clamp(-1.0) == r.min && r.clamp(99.0) == r.max && r.clamp(0.5) == 0.5);
  EXPECT_TRUE(r.contains(r.min));
  EXPECT_TRUE(r.contains(r.max));
  EXPECT_FALSE(r.contains(r.max + 0.001));
  EXPECT_EQ(kSamplingRanges.top_k.clamp(-3), 0);
  EXPECT_EQ(kSamplingRanges.max_tokens.clamp(0), 1);
}

// The case: the seed rule. The default seed is kRandomSeed, which resolve_seed replaces with
// a fresh seed each time; every other seed, 0 included, is kept.
TEST(SamplerSeed, RandomSeedIsResolvedAndFixedSeedsAreKept) {
  EXPECT_EQ(SamplingParams{}.seed, kRandomSeed);
  EXPECT_EQ(resolve_seed(0), 0u);
  EXPECT_EQ(resolve_seed(42), 42u);
  EXPECT_EQ(resolve_seed(kRandomSeed - 1), kRandomSeed - 1);
  const uint64_t a = resolve_seed(kRandomSeed);
  const uint64_t b = resolve_seed(kRandomSeed);
  EXPECT_NE(a, kRandomSeed);
  EXPECT_NE(b, kRandomSeed);
  EXPECT_NE(a, b);  // equal with probability 2^-64
}

}  // namespace
}  // namespace granule
