// `granule-cli chat MODEL`: an interactive conversation with history. Each line read is a
// user turn; /reset forgets the history, /exit (or end of input) leaves.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli.h"
#include "generation.h"
#include "granule/error.h"

namespace granule::cli {
namespace {

struct ChatOptions {
  GenerationOptions generation;
};

std::vector<ChatMessage> fresh_history(const GenerationOptions& options) {
  if (options.system.empty()) return {};
  return {{"system", options.system}};
}

int run_chat(const ChatOptions& options) {
  // Opened before the model loads, so a bad path fails at once; its error names the file.
  std::unique_ptr<TelemetryRecorder> telemetry;
  try {
    telemetry = open_telemetry(options.generation);
  } catch (const Error& e) {
    std::fprintf(stderr, "granule-cli: %s\n", e.what());
    return 1;
  }
  const std::unique_ptr<Engine> engine = open_engine(options.generation);
  const ChatTemplate& tmpl = require_chat_template(*engine, options.generation);
  const bool interactive = isatty(STDIN_FILENO) != 0;
  if (interactive) {
    std::fprintf(stderr,
                 "granule-cli: %s on %s, template %s. /reset clears the chat, /exit leaves; "
                 "Ctrl-C stops a reply.\n",
                 options.generation.model.filename().c_str(), engine->device_name().c_str(),
                 tmpl.name().c_str());
  }

  std::vector<ChatMessage> history = fresh_history(options.generation);
  std::string line;
  while (true) {
    if (interactive) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;  // end of input
    if (line == "/exit" || line == "/quit") break;
    if (line == "/reset") {
      history = fresh_history(options.generation);
      if (interactive) std::fputs("(history cleared)\n", stderr);
      continue;
    }
    if (line.empty()) continue;

    history.push_back({"user", line});
    Request request;
    request.messages = history;
    request.sampling = sampling_from(options.generation);
    request.sampling.stop_strings = tmpl.stop_strings();
    const int64_t prompt_tokens = count_prompt_tokens(*engine, history);
    ReplyResult reply;
    try {
      reply = stream_reply(*engine, std::move(request), telemetry.get());
    } catch (const CapacityError& e) {
      // The history outgrew the context: keep the chat alive and say how to go on.
      history.pop_back();
      std::fprintf(stderr, "granule-cli: %s (type /reset to start over)\n", e.what());
      continue;
    }
    if (reply.finish == FinishReason::Error) {
      history.pop_back();
      std::fprintf(stderr, "granule-cli: %s\n", reply.error.c_str());
      continue;
    }
    // A cancelled answer stays in the history as far as it got: the user saw it.
    history.push_back({"assistant", reply.text});
    if (!options.generation.quiet_stats) print_speeds(reply, prompt_tokens);
  }
  if (interactive) std::fputs("\n", stdout);
  return 0;
}

}  // namespace

Command add_chat_command(CLI::App& parent) {
  auto options = std::make_shared<ChatOptions>();
  CLI::App* app = parent.add_subcommand("chat", "Chat with a model interactively (/reset, /exit)");
  add_generation_options(*app, options->generation);
  add_vram_budget_option(*app, options->generation.vram_budget_bytes);
  return {app, [options] { return run_chat(*options); }, &options->generation.model};
}

}  // namespace granule::cli
