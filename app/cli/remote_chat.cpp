// The remote chat loop: each line a user turn sent with the whole conversation, unchanged from
// turn to turn so the server's prefix cache hits; the answer streamed as it comes. A fault
// prints one line and keeps what arrived, marked as cut; /retry sends the turn again.
#include "remote_chat.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "remote/engine_metrics.h"
#include "remote/openai_client.h"

namespace granule::cli {
namespace {

std::atomic<bool> g_stop{false};
void on_interrupt(int) { g_stop.store(true); }

// Ctrl-C stops the reply being streamed, not the process (as a local chat does).
class StopScope {
 public:
  StopScope() {
    g_stop.store(false);
    struct sigaction action {};
    action.sa_handler = on_interrupt;
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, &previous_);
  }
  ~StopScope() { sigaction(SIGINT, &previous_, nullptr); }
  StopScope(const StopScope&) = delete;
  StopScope& operator=(const StopScope&) = delete;

 private:
  struct sigaction previous_ {};
};

constexpr const char* kHelp =
    "Commands (a line that is one of these is not sent to the model):\n"
    "  /help           this list\n"
    "  /retry          send the last turn again (after a fault, or for another answer)\n"
    "  /metrics        the server's load from its Prometheus /metrics, where it has them\n"
    "  /reset          forget the conversation (the system prompt stays)\n"
    "  /exit, /quit    leave (so does end of input, Ctrl-D)\n"
    "Ctrl-C stops a reply; what arrived stays in the conversation.\n";

bool is_command(const std::string& line) {
  return line.size() > 1 && line[0] == '/' && line.find_first_of(" \t") == std::string::npos;
}

std::string shown(const std::optional<double>& value, const char* format) {
  if (!value) return "unavailable";
  char text[64];
  std::snprintf(text, sizeof text, format, *value);
  return text;
}

// One line of what the window's panels show: "unavailable" where the server has no series.
void print_metrics(const remote::OpenAiClient& client) {
  const remote::OpenAiClient::MetricsText text = client.fetch_metrics();
  if (text.fault) {
    std::fprintf(stderr, "granule-cli: metrics: %s\n", text.fault.message.c_str());
    return;
  }
  const remote::EngineMetrics m = remote::read_engine_metrics(text.text);
  if (m.dialect == remote::MetricsDialect::None) {
    std::fputs("granule-cli: metrics: no vllm:, sglang:, llamacpp: or granule_ series\n", stderr);
    return;
  }
  const std::optional<double> kv_percent =
      m.kv_usage_fraction ? std::optional<double>(*m.kv_usage_fraction * 100) : std::nullopt;
  const std::optional<double> kv_mib =
      m.kv_used_bytes ? std::optional<double>(*m.kv_used_bytes / (1024.0 * 1024.0)) : std::nullopt;
  std::fprintf(stderr,
               "metrics (%s): running %s, waiting %s, KV usage %s, KV %s, prompt tokens %s, "
               "generated tokens %s, generation %s, prefix cache hits %s\n",
               remote::metrics_dialect_name(m.dialect), shown(m.requests_running, "%.0f").c_str(),
               shown(m.requests_waiting, "%.0f").c_str(), shown(kv_percent, "%.1f%%").c_str(),
               shown(kv_mib, "%.1f MiB").c_str(), shown(m.prompt_tokens_total, "%.0f").c_str(),
               shown(m.generation_tokens_total, "%.0f").c_str(),
               shown(m.generation_tokens_per_second, "%.1f tok/s").c_str(),
               shown(m.prefix_cache_hits_total, "%.0f tokens").c_str());
}

std::vector<remote::RemoteMessage> fresh_history(const GenerationOptions& options) {
  if (options.system.empty()) return {};
  return {{"system", options.system}};
}

}  // namespace

int run_remote_chat(const RemoteChatOptions& remote_options, const GenerationOptions& options) {
  remote::Endpoint endpoint;
  endpoint.base_url = remote_options.endpoint;
  endpoint.stall_timeout_seconds = remote_options.stall_timeout_seconds;
  if (!remote_options.api_key_env.empty()) {
    const char* key = std::getenv(remote_options.api_key_env.c_str());
    if (key == nullptr || *key == '\0') {
      std::fprintf(stderr, "granule-cli: --api-key-env: the environment variable %s is not set\n",
                   remote_options.api_key_env.c_str());
      return 1;
    }
    endpoint.api_key = key;
  }
  const remote::OpenAiClient client(endpoint);
  const remote::ModelList listed = client.list_models();
  if (listed.fault) {
    std::fprintf(stderr, "granule-cli: %s: %s\n", client.api_base().c_str(),
                 listed.fault.message.c_str());
    return 1;
  }
  const remote::RemoteModel* model = nullptr;
  std::string names;
  for (const remote::RemoteModel& m : listed.models) {
    names += (names.empty() ? "" : ", ") + m.id;
    if (m.id == remote_options.model) model = &m;
  }
  if (remote_options.model.empty() && listed.models.size() == 1) model = &listed.models.front();
  if (model == nullptr) {
    std::fprintf(stderr, "granule-cli: %s: %s; it serves: %s\n", client.api_base().c_str(),
                 remote_options.model.empty() ? "name the model with --model"
                                              : ("no model " + remote_options.model).c_str(),
                 names.empty() ? "no models" : names.c_str());
    return 1;
  }
  const remote::ServerKind server = remote::server_kind(model->owned_by);

  remote::ChatRequest request;
  request.model = model->id;
  request.server = server;
  const SamplingOptions& s = options.sampling;
  request.sampling.temperature = s.temperature;
  request.sampling.top_p = s.top_p;
  request.sampling.top_k = s.top_k;
  request.sampling.min_p = s.min_p;
  request.sampling.repeat_penalty = s.repeat_penalty;
  request.sampling.seed = s.seed;
  request.sampling.max_tokens = options.max_tokens;
  if (s.repeat_last_n) {
    std::fputs("granule-cli: --repeat-last-n has no OpenAI API field: not sent\n", stderr);
  }
  if (remote_options.preset_given) {
    std::fputs(
        "granule-cli: --preset is the local engine's; on an endpoint only the sampling "
        "options given are sent, the rest are the server's defaults\n",
        stderr);
  }
  request.messages = fresh_history(options);
  for (const std::string& note : remote::chat_request_body(request).not_sent) {
    std::fprintf(stderr, "granule-cli: %s\n", note.c_str());
  }

  const bool interactive = isatty(STDIN_FILENO) != 0;
  const bool terminal = isatty(STDOUT_FILENO) != 0;
  if (interactive) {
    std::fprintf(stderr,
                 "granule-cli: %s on %s (%s). /help lists the commands; Ctrl-C stops a "
                 "reply.\n",
                 model->id.c_str(), client.api_base().c_str(), remote::server_kind_name(server));
  }
  std::vector<remote::RemoteMessage>& history = request.messages;
  int unanswered_turns = 0;
  bool last_turn_failed = false;  // turns that ended in a fault and were not retried to an answer
  bool retrying_failed = false;
  bool pending_retry = false;  // the last turn's user message is in history, without an answer
  std::string line;
  while (true) {
    if (!pending_retry) {
      if (interactive) {
        std::fputs("> ", stdout);
        std::fflush(stdout);
      }
      if (!std::getline(std::cin, line)) break;
      if (is_command(line)) {
        if (line == "/exit" || line == "/quit") break;
        if (line == "/help") {
          std::fputs(kHelp, stderr);
        } else if (line == "/reset") {
          history = fresh_history(options);
          std::fputs("(history cleared)\n", stderr);
        } else if (line == "/metrics") {
          print_metrics(client);
        } else if (line == "/retry") {
          // Back to the last user turn: its answer (cut or whole) goes, the turn is sent again.
          while (!history.empty() && history.back().role == "assistant") history.pop_back();
          if (history.empty() || history.back().role != "user") {
            std::fputs("granule-cli: nothing to retry\n", stderr);
          } else {
            pending_retry = true;
          }
        } else {
          std::fprintf(stderr, "granule-cli: unknown command %s; /help lists the commands\n",
                       line.c_str());
        }
        continue;
      }
      if (line.empty()) continue;
      // A turn that failed before any answer and was not retried gives way to this one.
      if (!history.empty() && history.back().role == "user") history.pop_back();
      history.push_back({"user", line});
    }
    retrying_failed = pending_retry && last_turn_failed;
    pending_retry = false;

    bool reasoning_open = false;
    const bool show_reasoning = options.reasoning == "show";
    remote::StreamCallbacks callbacks;
    callbacks.on_reasoning = [&](std::string_view text) {
      if (!show_reasoning) return;
      if (!reasoning_open) std::fputs(terminal ? "\x1b[2m" : "<think>\n", stdout);
      reasoning_open = true;
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    };
    callbacks.on_content = [&](std::string_view text) {
      if (reasoning_open) std::fputs(terminal ? "\x1b[0m\n\n" : "\n</think>\n\n", stdout);
      reasoning_open = false;
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    };
    remote::ChatResult result;
    {
      StopScope stop;
      result = client.stream_chat(request, callbacks, &g_stop);
    }
    if (reasoning_open) std::fputs(terminal ? "\x1b[0m" : "\n</think>", stdout);
    // Ends the answer's line; a turn that printed nothing (refused at once) prints nothing.
    if (!result.content.empty() || (show_reasoning && !result.reasoning.empty())) {
      std::fputs("\n", stdout);
    }
    std::fflush(stdout);
    if (result.fault && !retrying_failed) ++unanswered_turns;
    if (!result.fault && retrying_failed) --unanswered_turns;
    last_turn_failed = static_cast<bool>(result.fault);
    if (result.fault) {
      const bool partial = !result.content.empty() || !result.reasoning.empty();
      std::fprintf(stderr, "granule-cli: %s%s%s\n", result.fault.message.c_str(),
                   partial ? " [the answer above is cut: kept as far as it got]" : "",
                   result.fault.retryable() ? " (/retry sends the turn again)" : "");
    }
    // What was shown stays in the conversation, cut or stopped, so the next turn's prefix is
    // what the user saw; /retry takes it out again.
    if (!result.content.empty() || (!result.fault && !result.cancelled)) {
      history.push_back({"assistant", result.content});
    } else if (result.cancelled) {
      history.pop_back();  // stopped before any answer: as if the turn was not sent
    }
    if (result.cancelled && !result.usage) {
      std::fputs("stop: cancelled (the server's token counts went with the stream)\n", stderr);
    }
    if (!options.quiet_stats && result.usage) {
      const remote::Usage& u = *result.usage;
      const double gen_seconds = result.total_seconds - result.first_token_seconds;
      std::string cached;
      if (u.cached_prompt_tokens >= 0)
        cached = " (" + std::to_string(u.cached_prompt_tokens) + " cached)";
      std::string context;
      if (model->context_tokens) {
        context = " | context: " + std::to_string(u.prompt_tokens + u.completion_tokens) + " of " +
                  std::to_string(*model->context_tokens);
      }
      std::fprintf(
          stderr,
          "prompt: %lld tokens%s, first token after %.1f ms | generation: %lld tokens, "
          "%.1f tok/s | stop: %s%s\n",
          static_cast<long long>(u.prompt_tokens), cached.c_str(),
          result.first_token_seconds * 1000.0, static_cast<long long>(u.completion_tokens),
          gen_seconds > 0 && u.completion_tokens > 1 ? (u.completion_tokens - 1) / gen_seconds
                                                     : 0.0,
          result.cancelled ? "cancelled"
                           : (result.finish_reason.empty() ? "none" : result.finish_reason.c_str()),
          context.c_str());
    }
  }
  if (interactive) std::fputs("\n", stdout);
  // Piped input: a turn that failed and was not retried to an answer fails the run.
  return (!interactive && unanswered_turns > 0) ? 1 : 0;
}

}  // namespace granule::cli
