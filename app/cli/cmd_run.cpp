// `granule-cli run MODEL -p PROMPT`: one reply to one prompt, streamed to stdout, with the
// chat template applied (or the prompt used as is with --raw).
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli.h"
#include "generation.h"
#include "granule/error.h"
#ifdef GRANULE_HAVE_SERVER
#include "json_schema_support.h"  // the server's rules for a schema
#include "openai_request.h"       // ApiError
#endif

namespace granule::cli {
namespace {

struct RunOptions {
  GenerationOptions generation;
  std::string prompt;
  bool raw = false;
  int32_t logprobs = -1;         // --logprobs N: JSON with each token's log-probability
  std::string json_schema_file;  // --json-schema FILE: the reply is JSON valid under it
  std::string grammar_file;      // --grammar FILE: the reply follows this GBNF grammar
};

std::string read_text_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(std::string("cannot read the ") + what + " file '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// --json-schema / --grammar as the engine's constraint (none without them).
Constraint constraint_from(const RunOptions& options) {
  if (!options.json_schema_file.empty()) {
    std::string schema = read_text_file(options.json_schema_file, "JSON schema");
    const auto parsed = nlohmann::ordered_json::parse(schema, nullptr, false);
    if (parsed.is_discarded())
      throw UsageError("the JSON schema file '" + options.json_schema_file + "' is not valid JSON");
#ifdef GRANULE_HAVE_SERVER
    // As the server takes it: a keyword the constraint would not enforce is refused.
    try {
      schema = server::enforceable_json_schema(parsed, "--json-schema").dump();
    } catch (const server::ApiError& e) {
      throw UsageError(e.what());
    }
#endif
    return Constraint::json_schema(std::move(schema));
  }
  if (!options.grammar_file.empty())
    return Constraint::grammar(read_text_file(options.grammar_file, "grammar"));
  return {};
}

nlohmann::json bytes_of(const std::string& piece) {
  nlohmann::json bytes = nlohmann::json::array();
  for (const char c : piece) bytes.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return bytes;
}

nlohmann::json logprob_json(const TokenLogprob& t) {
  return {
      {"id", t.token}, {"token", t.piece}, {"bytes", bytes_of(t.piece)}, {"logprob", t.logprob}};
}

int run_once(const RunOptions& options) {
  // Opened before the model loads, so a bad path fails at once; its error names the file.
  std::unique_ptr<TelemetryRecorder> telemetry;
  try {
    telemetry = open_telemetry(options.generation);
  } catch (const Error& e) {
    std::fprintf(stderr, "granule-cli: %s\n", e.what());
    return 1;
  }
  Constraint constraint;
  try {
    constraint = constraint_from(options);
    if (constraint.active() && !structured_output_available())
      throw UnsupportedError(kNoStructuredOutputMessage);
  } catch (const Error& e) {
    std::fprintf(stderr, "granule-cli: %s\n", e.what());
    return 1;
  }
  const std::unique_ptr<Engine> engine = open_engine(options.generation);
  Request request;
  request.sampling = sampling_from(options.generation);
  request.constraint = std::move(constraint);
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
    request.chat_options = chat_options_from(options.generation);
    prompt_tokens = count_prompt_tokens(*engine, request.messages, request.chat_options);
  }
  // --logprobs: stdout is one JSON document (text, finish reason, every token's
  // log-probability with the N most likely alternatives) instead of the streamed text.
  const bool json_out = options.logprobs >= 0;
  nlohmann::json tokens = nlohmann::json::array();
  if (json_out) {
    request.top_logprobs = options.logprobs;
    request.sink.on_logprobs = [&tokens](SequenceId, const TokenLogprobs& lp) {
      nlohmann::json entry = logprob_json(lp.chosen);
      nlohmann::json top = nlohmann::json::array();
      for (const TokenLogprob& alt : lp.top) top.push_back(logprob_json(alt));
      entry["top_logprobs"] = top;
      tokens.push_back(entry);
    };
  }
  const ReplyResult reply =
      stream_reply(*engine, std::move(request), telemetry.get(), /*echo=*/!json_out,
                   /*show_reasoning=*/options.generation.reasoning == "show");
  if (reply.finish == FinishReason::Error) throw Error(reply.error);
  if (json_out) {
    nlohmann::json out = {{"text", reply.text},
                          {"finish_reason", finish_reason_name(reply.finish)},
                          {"prompt_tokens", prompt_tokens},
                          {"tokens", tokens}};
    if (!reply.reasoning.empty()) out["reasoning"] = reply.reasoning;
    std::printf("%s\n", out.dump(1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
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
  app->add_option("--logprobs", options->logprobs,
                  "Print JSON instead of the text: each token's log-probability and the N most "
                  "likely tokens beside it (0-20)")
      ->check(integer_in(0, kMaxTopLogprobs));
  auto* schema = app->add_option("--json-schema", options->json_schema_file,
                                 "Constrain the reply to JSON valid under the JSON Schema in FILE");
  schema->type_name("FILE");
  app->add_option("--grammar", options->grammar_file,
                  "Constrain the reply to the GBNF grammar in FILE (llama.cpp's format, rule root)")
      ->type_name("FILE")
      ->excludes(schema);
  return {app, [options] { return run_once(*options); }, &options->generation.model};
}

}  // namespace granule::cli
