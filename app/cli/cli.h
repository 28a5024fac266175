// granule-cli's subcommands and the helpers they share: each cmd_*.cpp registers one
// subcommand's options and returns the function that runs it once the line is parsed.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "granule/sampling.h"

namespace granule::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;  // returns the process exit code; throws on errors
  // The model file the command works on, named in the error line (owned by `run`'s state).
  const std::filesystem::path* model = nullptr;
};

Command add_info_command(CLI::App& parent);
Command add_tokenize_command(CLI::App& parent);
Command add_run_command(CLI::App& parent);
Command add_chat_command(CLI::App& parent);
Command add_fit_command(CLI::App& parent);
Command add_perplexity_command(CLI::App& parent);
#ifdef GRANULE_HAVE_HUB
Command add_search_command(CLI::App& parent);  // cmd_search.cpp, cmd_pull.cpp: with the Hub client
Command add_pull_command(CLI::App& parent);
#endif
#ifdef GRANULE_HAVE_SERVER
Command add_serve_command(CLI::App& parent);  // cmd_serve.cpp, built when cpp-httplib is found
#endif

// --vram-budget SIZE (byte_size.h: "6GiB", "6144MiB"; a bare number is MiB) into `bytes`,
// left at 0 (the backend's default) when not given. A size it cannot read is a parse error:
// "--vram-budget: '12XB' is not a size; write it like 6GiB or 6144MiB".
CLI::Option* add_vram_budget_option(CLI::App& app, uint64_t& bytes);

// The sampling options `run` and `chat` share (sampling_options.cpp). Unset options come
// from the preset; --help shows each option's default (the "balanced" preset's value).
struct SamplingOptions {
  std::string preset = "balanced";
  std::optional<float> temperature;
  std::optional<int32_t> top_k;
  std::optional<float> top_p;
  std::optional<float> min_p;
  std::optional<float> repeat_penalty;
  std::optional<int32_t> repeat_last_n;
  std::optional<uint64_t> seed;  // unset: a random seed per reply (kRandomSeed)
};

// --preset, --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n, --seed.
void add_sampling_options(CLI::App& app, SamplingOptions& options);

// The preset with the given options applied, and the seed: the one given, else a fresh random
// one (a new one per call, so per reply), logged with the settings at -v.
SamplingParams sampling_params(const SamplingOptions& options);

// Validators whose messages read well after the option's names (main.cpp joins them):
// "-c/--ctx-size expects an integer, got 'abc'", "--top-p must be from 0 to 1, got 2".
CLI::Validator integer_in(int64_t min, int64_t max);
CLI::Validator number_in(double min, double max);

// The one stderr line for an error about `file`: "granule-cli: FILE: what", without
// repeating the file when the message already starts with it, and with newlines folded.
std::string error_line(const std::filesystem::path& file, std::string_view what);

// The whole text of FILE, or of standard input for "-" (read in binary, any size). Throws
// Error naming the file when it cannot be read.
std::string read_text_input(const std::string& file);

// "93.8 MiB"
std::string human_bytes(uint64_t bytes);

}  // namespace granule::cli
