// `granule-cli chat MODEL`: an interactive conversation with history. Each line read is a
// user turn; lines that are one word starting with "/" are commands (/help lists them) and
// never reach the model. The engine keeps each reply's KV, so a turn computes only its new
// tokens ("prompt: N new tokens, M reused" on stderr). Input is read only between turns: on
// a terminal, what is typed while a reply streams is neither echoed into the reply nor sent
// afterwards (it is discarded when the reply ends).
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli.h"
#include "generation.h"
#include "granule/error.h"
#ifdef GRANULE_HAVE_REMOTE
#include "remote_chat.h"
#endif

namespace granule::cli {
namespace {

struct ChatOptions {
  GenerationOptions generation;
  bool no_kv_reuse = false;
#ifdef GRANULE_HAVE_REMOTE
  RemoteChatOptions remote;
#endif
};

std::vector<ChatMessage> fresh_history(const GenerationOptions& options) {
  if (options.system.empty()) return {};
  return {{"system", options.system}};
}

constexpr const char* kHelp =
    "Commands (a line that is one of these is not sent to the model):\n"
    "  /help           this list\n"
    "  /reset          forget the conversation (the system prompt stays)\n"
    "  /exit, /quit    leave (so does end of input, Ctrl-D)\n"
    "Ctrl-C stops a reply. Input is read between replies: text typed while a reply streams\n"
    "is not shown and is discarded when the reply ends. When the conversation outgrows the\n"
    "context, its oldest turns are left out (the system prompt stays) and this says so.\n";

// While a reply streams on a terminal: typed keys are not echoed into the reply, and what was
// typed is thrown away when it ends, so it never becomes the next turn unseen. Ctrl-C still
// works (only ECHO is turned off, not ISIG).
class QuietInputScope {
 public:
  explicit QuietInputScope(bool terminal) {
    if (!terminal || tcgetattr(STDIN_FILENO, &saved_) != 0) return;
    termios quiet = saved_;
    quiet.c_lflag &= ~static_cast<tcflag_t>(ECHO);
    active_ = tcsetattr(STDIN_FILENO, TCSANOW, &quiet) == 0;
  }
  ~QuietInputScope() {
    if (!active_) return;
    tcflush(STDIN_FILENO, TCIFLUSH);
    tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  QuietInputScope(const QuietInputScope&) = delete;
  QuietInputScope& operator=(const QuietInputScope&) = delete;

 private:
  termios saved_{};
  bool active_ = false;
};

// A line that is a command rather than a message: "/" and one word.
bool is_command(const std::string& line) {
  return line.size() > 1 && line[0] == '/' && line.find_first_of(" \t") == std::string::npos;
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
                 "granule-cli: %s on %s, template %s. /help lists the commands; Ctrl-C stops a "
                 "reply.\n",
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
    if (is_command(line)) {
      if (line == "/exit" || line == "/quit") break;
      if (line == "/help") {
        std::fputs(kHelp, stderr);
      } else if (line == "/reset") {
        history = fresh_history(options.generation);
        engine->drop_kept_kv();
        std::fputs("(history cleared)\n", stderr);
      } else {
        std::fprintf(stderr, "granule-cli: unknown command %s; /help lists the commands\n",
                     line.c_str());
      }
      continue;
    }
    if (line.empty()) continue;

    history.push_back({"user", line});
    Request request;
    request.messages = history;
    request.sampling = sampling_from(options.generation);
    request.sampling.stop_strings = tmpl.stop_strings();
    request.chat_options = chat_options_from(options.generation);
    PromptInfo prompt;
    request.sink.on_prompt = [&](SequenceId, const PromptInfo& info) {
      prompt = info;
      if (info.dropped_messages > 0) {
        std::fprintf(stderr,
                     "(the conversation outgrew the context of %lld tokens: the model no longer "
                     "sees its %d oldest messages)\n",
                     static_cast<long long>(engine->options().context_length),
                     info.dropped_messages);
      }
      if (!options.generation.quiet_stats) {
        std::fprintf(stderr, "prompt: %lld new tokens, %lld reused\n",
                     static_cast<long long>(info.computed_tokens),
                     static_cast<long long>(info.reused_tokens));
      }
    };
    ReplyResult reply;
    try {
      QuietInputScope quiet_input(interactive);
      reply = stream_reply(*engine, std::move(request), telemetry.get(), /*echo=*/true,
                           /*show_reasoning=*/options.generation.reasoning == "show");
    } catch (const CapacityError& e) {
      // Even the last message alone does not fit: keep the chat alive and say how to go on.
      history.pop_back();
      std::fprintf(stderr, "granule-cli: %s (type /reset to start over)\n", e.what());
      continue;
    }
    if (reply.finish == FinishReason::Error) {
      history.pop_back();
      std::fprintf(stderr, "granule-cli: %s\n", reply.error.c_str());
      continue;
    }
    // What the model no longer sees leaves the history too, so the next turn begins where
    // this one's view began (and its KV, kept by the engine, serves again).
    if (prompt.dropped_messages > 0) {
      size_t system = 0;
      while (system < history.size() && history[system].role == "system") ++system;
      const auto dropped = std::min<size_t>(static_cast<size_t>(prompt.dropped_messages),
                                            history.size() - system - 1);
      history.erase(history.begin() + static_cast<std::ptrdiff_t>(system),
                    history.begin() + static_cast<std::ptrdiff_t>(system + dropped));
    }
    // A cancelled answer stays in the history as far as it got: the user saw it.
    history.push_back({"assistant", reply.text});
    if (!options.generation.quiet_stats) print_speeds(reply, prompt.prompt_tokens, &prompt);
  }
  if (interactive) std::fputs("\n", stdout);
  return 0;
}

}  // namespace

Command add_chat_command(CLI::App& parent) {
  auto options = std::make_shared<ChatOptions>();
  CLI::App* app =
      parent.add_subcommand("chat", "Chat with a model interactively (/help, /reset, /exit)");
  add_generation_options(*app, options->generation);
  add_vram_budget_option(*app, options->generation.vram_budget_bytes);
  app->add_flag("--no-kv-reuse", options->no_kv_reuse,
                "Compute the whole conversation again every turn instead of keeping each "
                "reply's KV (for comparison)");
#ifdef GRANULE_HAVE_REMOTE
  // On an endpoint the model is the server's: MODEL (a file) gives way to --model.
  app->get_option("model")->required(false);
  CLI::Option* endpoint = app->add_option(
      "--endpoint", options->remote.endpoint,
      "Chat with a model of an OpenAI-compatible server instead (vLLM, SGLang, llama-server, "
      "granule-cli serve): its base URL, e.g. http://host:8000/v1");
  app->add_option("--api-key-env", options->remote.api_key_env,
                  "With --endpoint: the environment variable that holds the API key")
      ->needs(endpoint);
  app->add_option("--model", options->remote.model,
                  "With --endpoint: the server's model to chat with (as its /v1/models lists "
                  "it; may be left out when it serves one)")
      ->needs(endpoint);
  app->add_option("--stall-timeout", options->remote.stall_timeout_seconds,
                  "With --endpoint: seconds without a byte from the server (a long prompt's "
                  "prefill on a slow server) before the answer counts as stalled")
      ->check(integer_in(1, 3600))
      ->capture_default_str()
      ->needs(endpoint);
  app->callback([app, options] {
    const bool has_file = app->count("model") > 0;
    if (options->remote.endpoint.empty() && !has_file) {
      throw CLI::RequiredError("model");
    }
    if (!options->remote.endpoint.empty() && has_file) {
      throw CLI::ValidationError("--endpoint",
                                 "chats with the server's model: give it with --model, not a "
                                 "model file");
    }
    options->remote.preset_given = app->count("--preset") > 0;
  });
#endif
  return {app,
          [options] {
            options->generation.kv_reuse = !options->no_kv_reuse;
#ifdef GRANULE_HAVE_REMOTE
            if (!options->remote.endpoint.empty()) {
              return run_remote_chat(options->remote, options->generation);
            }
#endif
            return run_chat(*options);
          },
          &options->generation.model};
}

}  // namespace granule::cli
