// granule-cli: model info, the fit preview, tokenizer, one-shot generation and chat from the
// terminal. Every failure ends with exit code 1 and one line on stderr, never a signal.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "byte_size.h"
#include "cli.h"
#include "granule/error.h"
#include "granule/log.h"

namespace granule::cli {

std::string error_line(const std::filesystem::path& file, std::string_view what) {
  std::string message;
  for (char c : what) message += (c == '\n' || c == '\r') ? ' ' : c;
  const std::string full = file.string();
  const std::string name = file.filename().string();
  const bool names_file = !full.empty() && (message.starts_with(full + ":") ||
                                            (!name.empty() && message.starts_with(name + ":")));
  if (full.empty() || names_file) return "granule-cli: " + message;
  return "granule-cli: " + full + ": " + message;
}

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
  return text;
}

CLI::Option* add_vram_budget_option(CLI::App& app, uint64_t& bytes) {
  constexpr const char* kName = "--vram-budget";
  return app
      .add_option_function<std::string>(
          kName,
          [&bytes](const std::string& text) {
            try {
              bytes = parse_byte_size(text);
            } catch (const granule::Error& e) {
              throw CLI::ValidationError(kName, e.what());
            }
          },
          "Device memory the engine may use, e.g. 6GiB or 6144MiB (a bare number is MiB); "
          "default: the GPU's free memory minus a margin")
      ->type_name("SIZE");
}

}  // namespace granule::cli

namespace {

spdlog::level::level_enum level_for(int verbosity) {
  if (verbosity >= 2) return spdlog::level::debug;
  if (verbosity == 1) return spdlog::level::info;
  return spdlog::level::warn;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace granule::cli;
  CLI::App app{"Granule: run local language models from the terminal", "granule-cli"};
  app.set_version_flag("--version", std::string("granule-cli ") + GRANULE_VERSION);
  app.require_subcommand(1);
  app.fallthrough();  // -v also after the subcommand: granule-cli run MODEL -p hi -v
  int verbosity = 0;
  app.add_flag("-v,--verbose", verbosity, "More log output on stderr (-v info, -vv debug)");

  std::vector<Command> commands = {add_info_command(app), add_tokenize_command(app),
                                   add_run_command(app), add_chat_command(app),
                                   add_fit_command(app)};
#ifdef GRANULE_HAVE_SERVER
  commands.push_back(add_serve_command(app));
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::fprintf(stderr, "granule-cli: %s (see granule-cli --help)\n", e.what());
    return 1;
  }
  granule::set_log_level(level_for(verbosity));

  for (const Command& command : commands) {
    if (!command.app->parsed()) continue;
    try {
      return command.run();
    } catch (const std::exception& e) {  // granule::Error and anything else the run threw
      std::fprintf(stderr, "%s\n",
                   error_line(command.model ? *command.model : "", e.what()).c_str());
      return 1;
    }
  }
  return 1;  // require_subcommand(1) makes this unreachable
}
