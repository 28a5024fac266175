// ChatTemplate's Jinja side: compiles a model's own tokenizer.chat_template with llama.cpp's
// Jinja engine (fetched by setup.sh jinja, built as granule_jinja) and renders conversations
// with it. Without that engine (GRANULE_HAVE_JINJA unset) it reports that it is missing.
#include "granule/chat_template.h"
#include "granule/error.h"

#ifdef GRANULE_HAVE_JINJA
#include <algorithm>
#include <nlohmann/json.hpp>  // the template's input, built here and handed over as text

#include "jinja/lexer.h"    // llama.cpp: source → tokens
#include "jinja/parser.h"   // tokens → program
#include "jinja/runtime.h"  // context, runtime, gather_string_parts
#include "jinja/value.h"    // global_from_json
#include "json.h"           // common_json, the engine's JSON input type
#endif

namespace granule {

#ifdef GRANULE_HAVE_JINJA

namespace {

// The first line of an error: llama.cpp's Jinja errors append the source around the fault on
// the following lines, and the engine's errors are one line.
std::string first_line(std::string_view what) {
  what.remove_prefix(std::min(what.size(), what.find_first_not_of('\n')));
  return std::string(what.substr(0, what.find('\n')));
}

// A run-time error as llama.cpp's runtime rethrows it ("\n----\nWhile executing CallExpression
// at 12:5 in source:\n<excerpt>\nError: <what>"): the innermost message, on one line.
std::string run_time_error(std::string_view what) {
  constexpr std::string_view kError = "\nError: ";
  const size_t at = what.rfind(kError);
  return first_line(at == std::string_view::npos ? what : what.substr(at + kError.size()));
}

}  // namespace

struct ChatTemplate::Jinja {
  jinja::program program;
  std::string source;  // as the lexer normalised it: the context's error reports point into it
};

bool ChatTemplate::jinja_available() { return true; }

std::shared_ptr<const ChatTemplate::Jinja> ChatTemplate::compile_jinja(std::string_view source) {
  try {
    jinja::lexer lexer;
    jinja::lexer_result tokens = lexer.tokenize(std::string(source));
    auto compiled = std::make_shared<Jinja>();
    compiled->program = jinja::parse_from_tokens(tokens);
    compiled->source = std::move(tokens.source);
    return compiled;
  } catch (const std::exception& e) {
    throw UnsupportedError("the chat template does not compile: " + first_line(e.what()));
  }
}

std::string ChatTemplate::render_jinja(const std::vector<ChatMessage>& messages,
                                       bool add_generation_prompt, std::string_view bos_text,
                                       const ChatOptions& options) const {
  using json = nlohmann::ordered_json;  // keys in the order given, as Python's dicts
  json input = json::object();
  json& turns = input["messages"] = json::array();
  for (const ChatMessage& m : messages) {
    json turn = {{"role", m.role}, {"content", m.content}};
    if (!m.tool_calls_json.empty()) {
      json calls = json::parse(m.tool_calls_json, nullptr, /*allow_exceptions=*/false);
      if (!calls.is_array()) throw UsageError("an assistant message's tool_calls must be an array");
      // Templates write the arguments with tojson: an object, as llama.cpp hands them over.
      for (json& call : calls) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object())
          continue;
        json& args = call["function"]["arguments"];
        if (args.is_string()) {
          json parsed = json::parse(args.get<std::string>(), nullptr, false);
          if (!parsed.is_discarded()) args = std::move(parsed);
        }
      }
      turn["tool_calls"] = std::move(calls);
    }
    if (!m.tool_call_id.empty()) turn["tool_call_id"] = m.tool_call_id;
    if (!m.name.empty()) turn["name"] = m.name;
    turns.push_back(std::move(turn));
  }
  input["bos_token"] = std::string(bos_text);
  input["eos_token"] = eos_text_;
  input["add_generation_prompt"] = add_generation_prompt;
  if (options.enable_thinking) input["enable_thinking"] = *options.enable_thinking;
  if (!options.reasoning_effort.empty()) {
    // gpt-oss reads reasoning_effort; some templates call it reasoning_strength.
    input["reasoning_effort"] = options.reasoning_effort;
    input["reasoning_strength"] = options.reasoning_effort;
  }
  if (!options.tools_json.empty()) {
    json tools = json::parse(options.tools_json, nullptr, /*allow_exceptions=*/false);
    if (!tools.is_array()) throw UsageError("tools must be a JSON array of tool definitions");
    input["tools"] = std::move(tools);
  }
  try {
    jinja::context ctx(jinja_->source);
    if (now_ != 0) ctx.current_time = now_;
    jinja::global_from_json(ctx, common_json::parse(input.dump()), /*mark_input=*/false);
    jinja::runtime runtime(ctx);
    const jinja::value results = runtime.execute(jinja_->program);
    return jinja::runtime::gather_string_parts(results)->as_string().str();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // raise_exception("...") arrives as "Jinja Exception: ..."; anything else the template
    // did wrong at run time says where.
    std::string what = run_time_error(e.what());
    constexpr std::string_view kRaised = "Jinja Exception: ";
    if (what.starts_with(kRaised)) {
      throw UsageError("the model's chat template refuses this conversation: " +
                       what.substr(kRaised.size()));
    }
    throw UsageError("the model's chat template failed: " + what);
  }
}

#else  // no Jinja engine in this build

struct ChatTemplate::Jinja {};

bool ChatTemplate::jinja_available() { return false; }

std::shared_ptr<const ChatTemplate::Jinja> ChatTemplate::compile_jinja(std::string_view) {
  throw UnsupportedError(
      "this build has no Jinja engine for chat templates (run 'bash packaging/setup.sh jinja' "
      "and rebuild)");
}

std::string ChatTemplate::render_jinja(const std::vector<ChatMessage>&, bool, std::string_view,
                                       const ChatOptions&) const {
  throw UnsupportedError("this build has no Jinja engine for chat templates");
}

#endif

}  // namespace granule
