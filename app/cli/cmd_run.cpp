// `granule-cli run MODEL -p PROMPT`: one reply to one prompt, streamed to stdout, with the
// chat template applied (or the prompt used as is with --raw).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli.h"
#include "generation.h"
#include "granule/error.h"

namespace granule::cli {
namespace {

struct RunOptions {
  GenerationOptions generation;
  std::string prompt;
  bool raw = false;
};

int run_once(const RunOptions& options) {
  // Opened before the model loads, so a bad path fails at once; its error names the file.
  std::unique_ptr<TelemetryRecorder> telemetry;
  try {
    telemetry = open_telemetry(options.generation);
  } catch (const Error& e) {
    std::fprintf(stderr, "granule-cli: %s\n", e.what());
    return 1;
  }
  const std::unique_ptr<Engine> engine = open_engine(options.generation);
  Request request;
  request.sampling = sampling_from(options.generation);
  int64_t prompt_tokens = 0;
  if (options.raw) {
    const Tokenizer& tokenizer = engine->tokenizer();
    std::vector<TokenId> tokens =
        tokenizer.encode(options.prompt, tokenizer.add_bos_by_default(), /*parse_special=*/true);
    prompt_tokens = static_cast<int64_t>(tokens.size());
    request.prompt_tokens = std::move(tokens);
  } else {
    const ChatTemplate& tmpl = require_chat_template(*engine, options.generation);
    if (!options.generation.system.empty())
      request.messages.push_back({"system", options.generation.system});
    request.messages.push_back({"user", options.prompt});
    request.sampling.stop_strings = tmpl.stop_strings();
    prompt_tokens = count_prompt_tokens(*engine, request.messages);
  }
  const ReplyResult reply = stream_reply(*engine, std::move(request), telemetry.get());
  if (reply.finish == FinishReason::Error) throw Error(reply.error);
  if (!options.generation.quiet_stats) print_speeds(reply, prompt_tokens);
  return 0;
}

}  // namespace

Command add_run_command(CLI::App& parent) {
  auto options = std::make_shared<RunOptions>();
  CLI::App* app = parent.add_subcommand("run", "Generate one reply to a prompt");
  add_generation_options(*app, options->generation);
  add_vram_budget_option(*app, options->generation.vram_budget_bytes);
  app->add_option("-p,--prompt", options->prompt, "The prompt")->required();
  app->add_flag("--raw", options->raw,
                "Use the prompt as is (control tokens written as text are parsed), without the "
                "chat template");
  return {app, [options] { return run_once(*options); }, &options->generation.model};
}

}  // namespace granule::cli
