// The sampling options of `run` and `chat` (presets, each parameter with its default in
// --help, the seed rule) and the validators that give readable messages for bad numbers.
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>

#include "cli.h"
#include "granule/log.h"

namespace granule::cli {
namespace {

std::string format_number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

// The presets and what each sets, for --preset's help line.
std::string preset_help() {
  std::string help = "Sampling preset; the options below override its values. ";
  for (std::string_view name : SamplingParams::preset_names()) {
    const SamplingParams p = SamplingParams::preset(name);
    help += std::string(name) + ": temp " + format_number(p.temperature) + ", top-k " +
            std::to_string(p.top_k) + ", top-p " + format_number(p.top_p) + ", min-p " +
            format_number(p.min_p) + ", repeat-penalty " + format_number(p.repetition_penalty);
    help += name == SamplingParams::preset_names().back() ? "" : "; ";
  }
  return help;
}

// Any 64-bit seed but kRandomSeed, so a seed printed at -v can always be given back.
CLI::Validator seed_value() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [at, error] = std::from_chars(text.data(), end, value);
        if (text.empty() || error != std::errc() || at != end || value == kRandomSeed) {
          return "expects an integer from 0 to " + std::to_string(kRandomSeed - 1) + ", got '" +
                 text + "'";
        }
        return {};
      },
      std::string());
}

}  // namespace

CLI::Validator integer_in(int64_t min, int64_t max) {
  const std::string range = std::to_string(min) + " to " + std::to_string(max);
  return CLI::Validator(
      [min, max, range](std::string& text) -> std::string {
        int64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [at, error] = std::from_chars(text.data(), end, value);
        if (text.empty() || error == std::errc::invalid_argument || at != end)
          return "expects an integer, got '" + text + "'";
        if (error == std::errc::result_out_of_range || value < min || value > max)
          return "must be from " + range + ", got " + text;
        return {};
      },
      std::string());  // the help shows the type and the default; the range is in the message
}

CLI::Validator number_in(double min, double max) {
  const std::string range = format_number(min) + " to " + format_number(max);
  return CLI::Validator(
      [min, max, range](std::string& text) -> std::string {
        double value = 0;
        const char* end = text.data() + text.size();
        const auto [at, error] = std::from_chars(text.data(), end, value);
        if (text.empty() || error == std::errc::invalid_argument || at != end || std::isnan(value))
          return "expects a number, got '" + text + "'";
        if (error == std::errc::result_out_of_range || value < min || value > max)
          return "must be from " + range + ", got " + text;
        return {};
      },
      std::string());
}

namespace {

// A sampling option's check: the engine's range for the field (granule/sampling.h), which
// the server and the window use too.
CLI::Validator in_range(const SamplingRange<double>& range) {
  return number_in(range.min, range.max);
}
CLI::Validator in_range(const SamplingRange<int32_t>& range) {
  return integer_in(range.min, range.max);
}

}  // namespace

void add_sampling_options(CLI::App& app, SamplingOptions& options) {
  const SamplingRanges& r = kSamplingRanges;
  std::vector<std::string> names(SamplingParams::preset_names().begin(),
                                 SamplingParams::preset_names().end());
  app.add_option("--preset", options.preset, preset_help())
      ->check(CLI::IsMember(names))
      ->capture_default_str();
  app.add_option("--temp", options.temperature, "Sampling temperature (0 = greedy)")
      ->check(in_range(r.temperature))
      ->default_str(format_number(r.temperature.default_value));
  app.add_option("--top-k", options.top_k, "Keep the k most likely tokens (0 = off)")
      ->check(in_range(r.top_k))
      ->default_str(std::to_string(r.top_k.default_value));
  app.add_option("--top-p", options.top_p, "Nucleus sampling mass (1 = off)")
      ->check(in_range(r.top_p))
      ->default_str(format_number(r.top_p.default_value));
  app.add_option("--min-p", options.min_p, "Drop tokens below this fraction of the best (0 = off)")
      ->check(in_range(r.min_p))
      ->default_str(format_number(r.min_p.default_value));
  app.add_option("--repeat-penalty", options.repeat_penalty,
                 "Penalty on tokens seen in the last --repeat-last-n tokens (1 = off)")
      ->check(in_range(r.repetition_penalty))
      ->default_str(format_number(r.repetition_penalty.default_value));
  app.add_option("--repeat-last-n", options.repeat_last_n,
                 "How many recent tokens the repeat penalty looks at (-1 = all)")
      ->check(in_range(r.penalty_last_n))
      ->default_str(std::to_string(r.penalty_last_n.default_value));
  app.add_option("--seed", options.seed,
                 "Seed of the sampler: the same seed, prompt and settings give the same text "
                 "(0 is a seed too); by default a new random seed per reply, printed with -v")
      ->check(seed_value())
      ->default_str("random");
}

SamplingParams sampling_params(const SamplingOptions& options) {
  SamplingParams params = SamplingParams::preset(options.preset);
  if (options.temperature) params.temperature = *options.temperature;
  if (options.top_k) params.top_k = *options.top_k;
  if (options.top_p) params.top_p = *options.top_p;
  if (options.min_p) params.min_p = *options.min_p;
  if (options.repeat_penalty) params.repetition_penalty = *options.repeat_penalty;
  if (options.repeat_last_n) params.penalty_last_n = *options.repeat_last_n;
  // Resolved here rather than by Engine::submit so -v can say which seed a reply used.
  params.seed = resolve_seed(options.seed ? *options.seed : kRandomSeed);
  logger("app")->info(
      "sampling: preset {}, temp {}, top-k {}, top-p {}, min-p {}, "
      "repeat-penalty {} over {} tokens, seed {}",
      options.preset, params.temperature, params.top_k, params.top_p, params.min_p,
      params.repetition_penalty, params.penalty_last_n, params.seed);
  return params;
}

}  // namespace granule::cli
