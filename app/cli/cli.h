// granule-cli's subcommands and the helpers they share: each cmd_*.cpp registers one
// subcommand's options and returns the function that runs it once the line is parsed.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

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
#ifdef GRANULE_HAVE_SERVER
Command add_serve_command(CLI::App& parent);  // cmd_serve.cpp, built when cpp-httplib is found
#endif

// --vram-budget SIZE (byte_size.h: "6GiB", "6144MiB"; a bare number is MiB) into `bytes`,
// left at 0 (the backend's default) when not given. A size it cannot read is a parse error:
// "--vram-budget: '12XB' is not a size; write it like 6GiB or 6144MiB".
CLI::Option* add_vram_budget_option(CLI::App& app, uint64_t& bytes);

// The one stderr line for an error about `file`: "granule-cli: FILE: what", without
// repeating the file when the message already starts with it, and with newlines folded.
std::string error_line(const std::filesystem::path& file, std::string_view what);

// "93.8 MiB"
std::string human_bytes(uint64_t bytes);

}  // namespace granule::cli
