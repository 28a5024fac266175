// granule-cli: model info, the fit preview, tokenizer, one-shot generation and chat from the
// terminal. Every failure ends with exit code 1 and one line on stderr, never a signal.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
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

std::string read_text_input(const std::string& file) {
  std::FILE* stream = file == "-" ? stdin : std::fopen(file.c_str(), "rb");
  if (stream == nullptr) throw Error(file + ": cannot open: " + std::strerror(errno));
  std::string text;
  char buffer[1 << 16];
  size_t got = 0;
  while ((got = std::fread(buffer, 1, sizeof buffer, stream)) > 0) text.append(buffer, got);
  const bool failed = std::ferror(stream) != 0;
  const int read_errno = errno;
  if (stream != stdin) std::fclose(stream);
  if (failed) {
    throw Error((file == "-" ? std::string("standard input") : file) +
                ": cannot read: " + std::strerror(read_errno));
  }
  return text;
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

std::string command_names(const CLI::App& app) {
  std::string names;
  for (const CLI::App* sub : app.get_subcommands({}))
    names += (names.empty() ? "" : ", ") + sub->get_name();
  return names;
}

// The command word on the line: the first argument that is not one of the top-level flags
// (none of which takes a value); "" when there is none.
std::string command_word(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--") return i + 1 < argc ? argv[i + 1] : "";
    if (!arg.starts_with("-")) return std::string(arg);
  }
  return "";
}

// The option of `app` or of one of its subcommands that CLI11 calls `name`, or null.
const CLI::Option* find_option(const CLI::App& app, std::string_view name) {
  for (const CLI::Option* option : app.get_options()) {
    if (option->get_name() == name) return option;
  }
  for (const CLI::App* sub : app.get_subcommands({})) {
    if (!sub->parsed()) continue;
    if (const CLI::Option* option = find_option(*sub, name)) return option;
  }
  return nullptr;
}

// "-c/--ctx-size": the first short and the first long name, as a user may have typed it.
std::string display_names(const CLI::Option& option) {
  std::string names;
  if (!option.get_snames().empty()) names = "-" + option.get_snames().front();
  if (!option.get_lnames().empty())
    names += (names.empty() ? "--" : "/--") + option.get_lnames().front();
  return names.empty() ? option.get_name() : names;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The deepest parsed command: the one whose options a stray argument was meant for.
const CLI::App& innermost(const CLI::App& app) {
  for (const CLI::App* sub : app.get_subcommands({})) {
    if (sub->parsed()) return innermost(*sub);
  }
  return app;
}

// "unknown option --tmp (did you mean --temp?)" or "unexpected argument 'x'".
std::string extras_message(const CLI::App& app) {
  const CLI::App& command = innermost(app);
  std::vector<std::string> extras = app.remaining(true);
  for (const std::string& arg : extras) {
    if (!arg.starts_with("-") || arg == "-") continue;
    const std::string name = arg.substr(0, arg.find('='));
    std::string message = "unknown option " + name;
    std::string best;
    size_t best_distance = 3;  // suggest only close names
    for (const CLI::Option* option : command.get_options()) {
      for (const std::string& long_name : option->get_lnames()) {
        const size_t d = edit_distance(name, "--" + long_name);
        if (d < best_distance) best_distance = d, best = "--" + long_name;
      }
    }
    if (!best.empty()) message += " (did you mean " + best + "?)";
    return message;
  }
  if (!extras.empty()) return "unexpected argument '" + extras.front() + "'";
  return "unexpected arguments";
}

// One line for a command line CLI11 could not take.
std::string parse_error_message(const CLI::App& app, const CLI::ParseError& e) {
  const std::string what = e.what();
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) return extras_message(app);
  if (dynamic_cast<const CLI::ValidationError*>(&e) != nullptr) {
    // CLI11 writes "NAME: MESSAGE"; name the option as the user may have typed it.
    const size_t colon = what.find(": ");
    if (colon != std::string::npos) {
      if (const CLI::Option* option = find_option(app, what.substr(0, colon))) {
        const std::string message = what.substr(colon + 2);
        const bool reads_on = message.starts_with("expects ") || message.starts_with("must ");
        return display_names(*option) + (reads_on ? " " : ": ") + message;
      }
    }
  }
  return what;
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
                                   add_run_command(app),  add_chat_command(app),
                                   add_fit_command(app),  add_perplexity_command(app)};
#ifdef GRANULE_HAVE_SERVER
  commands.push_back(add_serve_command(app));
#endif
#ifdef GRANULE_HAVE_HUB
  commands.push_back(add_search_command(app));
  commands.push_back(add_pull_command(app));
#endif
  // A misspelt or missing command is named before CLI11 reads the line (its own messages
  // for these are "A subcommand is required" and a list of unexpected arguments).
  const std::string word = command_word(argc, argv);
  const bool asks_help_or_version = [&] {
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      if (arg == "-h" || arg == "--help" || arg == "--version") return true;
    }
    return false;
  }();
  const auto subcommands = app.get_subcommands({});
  const bool known = std::any_of(subcommands.begin(), subcommands.end(),
                                 [&](const CLI::App* sub) { return sub->check_name(word); });
  if (!word.empty() && !known) {
    std::fprintf(stderr, "granule-cli: unknown command '%s'; commands: %s\n", word.c_str(),
                 command_names(app).c_str());
    return 1;
  }
  if (word.empty() && !asks_help_or_version) {
    std::fprintf(stderr, "granule-cli: no command given; commands: %s (see granule-cli --help)\n",
                 command_names(app).c_str());
    return 1;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    std::fprintf(stderr, "granule-cli: %s\n", parse_error_message(app, e).c_str());
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
