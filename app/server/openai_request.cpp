// Parsing and checking OpenAI request bodies, and writing the response and error JSON.
#include "openai_request.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "json_schema_support.h"

namespace granule::server {
namespace {

using nlohmann::json;

ApiError bad(const std::string& param, const std::string& message) {
  return ApiError(400, message, "invalid_request_error", param);
}

const char* type_name(const json& value) {
  switch (value.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    default:
      return "a number";
  }
}

// The field's number, or nullopt when absent or null; a non-number or a value outside
// [low, high] is a 400 naming the field.
std::optional<double> number_field(const json& body, const char* name, double low, double high) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) {
    throw bad(name, std::string("'") + name + "' must be a number, not " + type_name(*it));
  }
  const double value = it->get<double>();
  if (!std::isfinite(value) || value < low || value > high) {
    throw bad(name, std::string("'") + name + "' must be between " + json(low).dump() + " and " +
                        json(high).dump() + ", not " + it->dump());
  }
  return value;
}

std::optional<int64_t> integer_field(const json& body, const char* name, int64_t low,
                                     int64_t high) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) {
    throw bad(name, std::string("'") + name + "' must be an integer, not " + type_name(*it));
  }
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(high)) {
    throw bad(name, std::string("'") + name + "' must be at most " + std::to_string(high));
  }
  const int64_t value = it->get<int64_t>();
  if (value < low || value > high) {
    throw bad(name, std::string("'") + name + "' must be between " + std::to_string(low) + " and " +
                        std::to_string(high) + ", not " + std::to_string(value));
  }
  return value;
}

// A sampling field checked against the engine's range for it (granule/sampling.h), the one
// the CLI and the window use.
std::optional<float> sampling_field(const json& body, const char* name,
                                    const SamplingRange<double>& range) {
  const auto v = number_field(body, name, range.min, range.max);
  return v ? std::optional(static_cast<float>(*v)) : std::nullopt;
}
std::optional<int32_t> sampling_field(const json& body, const char* name,
                                      const SamplingRange<int32_t>& range) {
  const auto v = integer_field(body, name, range.min, range.max);
  return v ? std::optional(static_cast<int32_t>(*v)) : std::nullopt;
}

std::optional<bool> bool_field(const json& body, const char* name) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) {
    throw bad(name, std::string("'") + name + "' must be a boolean, not " + type_name(*it));
  }
  return it->get<bool>();
}

// A message's content: a string, or an array of {"type":"text","text":...} parts joined.
std::string message_content(const json& content, size_t index) {
  const std::string param = "messages[" + std::to_string(index) + "].content";
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return "";
  if (!content.is_array())
    throw bad(param, "'" + param + "' must be a string or an array of parts");
  std::string text;
  for (const json& part : content) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      throw bad(param,
                "'" + param + "' may only hold text parts ({\"type\":\"text\",\"text\":...})");
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

std::vector<ChatMessage> parse_messages(const json& body) {
  const auto it = body.find("messages");
  if (it == body.end()) throw bad("messages", "'messages' is required");
  if (!it->is_array())
    throw bad("messages", std::string("'messages' must be an array, not ") + type_name(*it));
  if (it->empty()) throw bad("messages", "'messages' must hold at least one message");
  std::vector<ChatMessage> messages;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& message = (*it)[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!message.is_object()) throw bad(param, "'" + param + "' must be an object");
    const auto role = message.find("role");
    if (role == message.end() || !role->is_string()) {
      throw bad(param + ".role", "'" + param + ".role' must be a string");
    }
    std::string role_name = role->get<std::string>();
    if (role_name == "developer") role_name = "system";  // the newer name of the system role
    if (role_name != "system" && role_name != "user" && role_name != "assistant" &&
        role_name != "tool") {
      throw bad(param + ".role", "'" + param +
                                     ".role' must be system, developer, user, assistant or "
                                     "tool, not '" +
                                     role_name + "'");
    }
    const auto content = message.find("content");
    ChatMessage m{role_name, content == message.end() ? "" : message_content(*content, i)};
    if (const auto calls = message.find("tool_calls");
        calls != message.end() && !calls->is_null()) {
      if (role_name != "assistant")
        throw bad(param + ".tool_calls", "only an assistant message has 'tool_calls'");
      if (!calls->is_array())
        throw bad(param + ".tool_calls", "'" + param + ".tool_calls' must be an array");
      for (const json& call : *calls) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object() ||
            !call["function"].value("name", json()).is_string())
          throw bad(param + ".tool_calls",
                    "each of '" + param +
                        ".tool_calls' must be {\"id\", \"type\": \"function\", \"function\": "
                        "{\"name\", \"arguments\"}}");
      }
      m.tool_calls_json = calls->dump();
    }
    if (role_name == "tool") {
      const auto id = message.find("tool_call_id");
      if (id == message.end() || !id->is_string())
        throw bad(param + ".tool_call_id", "a tool message needs 'tool_call_id' (a string)");
      m.tool_call_id = id->get<std::string>();
    }
    if (const auto name = message.find("name"); name != message.end() && name->is_string())
      m.name = name->get<std::string>();
    messages.push_back(std::move(m));
  }
  return messages;
}

void parse_prompt(const json& body, ParsedRequest& request) {
  const auto it = body.find("prompt");
  if (it == body.end()) throw bad("prompt", "'prompt' is required");
  if (it->is_string()) {
    request.prompt = it->get<std::string>();
    return;
  }
  // An array of token ids is one prompt, used as is (OpenAI's "array of integers").
  if (it->is_array() && !it->empty() && (*it)[0].is_number()) {
    for (const json& id : *it) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() > std::numeric_limits<int32_t>::max())
        throw bad("prompt",
                  "'prompt' as an array of token ids must hold only non-negative integers");
      request.prompt_token_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    return;
  }
  // A one-element array of strings is a single prompt; more would be several choices.
  if (it->is_array() && it->size() == 1 && (*it)[0].is_string()) {
    request.prompt = (*it)[0].get<std::string>();
    return;
  }
  if (it->is_array())
    throw bad("prompt",
              "'prompt' must be one string or one array of token ids (batches of prompts are not "
              "supported)");
  throw bad("prompt", std::string("'prompt' must be a string, not ") + type_name(*it));
}

// reasoning_effort (OpenAI's name, gpt-oss's template variable) and chat_template_kwargs (the
// template variables llama-server and vLLM pass through): only what the engine's templates
// use is accepted, the rest is refused rather than silently ignored.
ChatOptions parse_chat_options(const json& body) {
  ChatOptions options;
  if (const auto it = body.find("reasoning_effort"); it != body.end() && !it->is_null()) {
    if (!it->is_string())
      throw bad("reasoning_effort",
                std::string("'reasoning_effort' must be a string, not ") + type_name(*it));
    const std::string effort = it->get<std::string>();
    if (effort != "low" && effort != "medium" && effort != "high")
      throw bad("reasoning_effort",
                "'reasoning_effort' must be low, medium or high, not '" + effort + "'");
    options.reasoning_effort = effort;
  }
  if (const auto it = body.find("chat_template_kwargs"); it != body.end() && !it->is_null()) {
    if (!it->is_object())
      throw bad("chat_template_kwargs",
                std::string("'chat_template_kwargs' must be an object, not ") + type_name(*it));
    for (const auto& [key, value] : it->items()) {
      const std::string param = "chat_template_kwargs." + key;
      if (key == "enable_thinking") {
        if (!value.is_boolean())
          throw bad(param, "'" + param + "' must be true or false, not " + type_name(value));
        options.enable_thinking = value.get<bool>();
      } else if (key == "reasoning_effort" && value.is_string()) {
        // Some clients put it here; the same checks as the top-level field.
        options.reasoning_effort =
            parse_chat_options({{"reasoning_effort", value}}).reasoning_effort;
      } else {
        throw bad(param, "'" + param +
                             "' is not supported: this server passes only enable_thinking "
                             "and reasoning_effort to the chat template");
      }
    }
  }
  return options;
}

// Parsed again with the keys in the client's order: a schema's property order is the order
// the reply writes them in.
using ojson = nlohmann::ordered_json;

// response_format, and llama-server's `grammar` and `json_schema` extensions.
Constraint parse_constraint(const ojson& body) {
  Constraint constraint;
  int given = 0;
  if (const auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    if (!it->is_object() || !it->value("type", ojson()).is_string())
      throw bad("response_format",
                "'response_format' must be an object with a 'type' (text, json_object or "
                "json_schema)");
    const std::string type = (*it)["type"].get<std::string>();
    if (type == "json_object") {
      constraint = Constraint::json_object();
      ++given;
    } else if (type == "json_schema") {
      const auto spec = it->find("json_schema");
      if (spec == it->end() || !spec->is_object())
        throw bad("response_format.json_schema",
                  "'response_format.json_schema' must be an object with 'name' and 'schema'");
      const auto schema = spec->find("schema");
      if (schema == spec->end() || !schema->is_object())
        throw bad("response_format.json_schema.schema",
                  "'response_format.json_schema.schema' must be a JSON Schema object");
      if (const auto strict = spec->find("strict");
          strict != spec->end() && !strict->is_null() && !strict->is_boolean())
        throw bad("response_format.json_schema.strict",
                  "'response_format.json_schema.strict' must be a boolean");
      // strict or not, the reply is decoded under the schema: it always validates.
      constraint = Constraint::json_schema(
          enforceable_json_schema(*schema, "response_format.json_schema.schema").dump());
      ++given;
    } else if (type != "text") {
      throw bad("response_format.type",
                "'response_format.type' must be text, json_object or "
                "json_schema, not '" +
                    type + "'");
    }
  }
  if (const auto it = body.find("json_schema"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) throw bad("json_schema", "'json_schema' must be a JSON Schema object");
    constraint = Constraint::json_schema(enforceable_json_schema(*it, "json_schema").dump());
    ++given;
  }
  if (const auto it = body.find("grammar"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) throw bad("grammar", "'grammar' must be a GBNF grammar (a string)");
    constraint = Constraint::grammar(it->get<std::string>());
    ++given;
  }
  if (given > 1)
    throw bad("response_format",
              "give one of 'response_format' (json), 'json_schema' and 'grammar', not several");
  return constraint;
}

void parse_tools(const ojson& body, ParsedRequest& request) {
  const auto tools = body.find("tools");
  const bool has_tools = tools != body.end() && !tools->is_null();
  if (has_tools) {
    if (!tools->is_array()) throw bad("tools", "'tools' must be an array of tools");
    for (size_t i = 0; i < tools->size(); ++i) {
      const ojson& tool = (*tools)[i];
      const std::string param = "tools[" + std::to_string(i) + "]";
      if (!tool.is_object() || tool.value("type", "") != "function" || !tool.contains("function") ||
          !tool["function"].is_object() || !tool["function"].value("name", ojson()).is_string())
        throw bad(param, "'" + param +
                             "' must be {\"type\": \"function\", \"function\": {\"name\", "
                             "\"description\", \"parameters\"}}");
      const auto parameters = tool["function"].find("parameters");
      if (parameters != tool["function"].end() && !parameters->is_null() &&
          !parameters->is_object())
        throw bad(param + ".function.parameters",
                  "'" + param + ".function.parameters' must be a JSON Schema object");
    }
    if (!tools->empty()) {
      request.tools = *tools;
      request.chat_options.tools_json = tools->dump();
      request.tool_choice = ToolChoice::Auto;
    }
  }
  if (const auto it = body.find("parallel_tool_calls"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean())
      throw bad("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    request.parallel_tool_calls = it->get<bool>();
  }
  const auto choice = body.find("tool_choice");
  if (choice == body.end() || choice->is_null()) return;
  if (choice->is_string()) {
    const std::string c = choice->get<std::string>();
    if (c == "none") {
      request.tool_choice = ToolChoice::None;
      return;
    }
    if (c != "auto" && c != "required")
      throw bad("tool_choice",
                "'tool_choice' must be none, auto, required or "
                "{\"type\": \"function\", \"function\": {\"name\"}}, not '" +
                    c + "'");
    if (request.tools.empty()) throw bad("tool_choice", "'tool_choice' " + c + " needs 'tools'");
    request.tool_choice = c == "auto" ? ToolChoice::Auto : ToolChoice::Required;
    return;
  }
  if (!choice->is_object() || choice->value("type", "") != "function" ||
      !choice->contains("function") || !(*choice)["function"].is_object() ||
      !(*choice)["function"].value("name", ojson()).is_string())
    throw bad("tool_choice",
              "'tool_choice' must be none, auto, required or {\"type\": \"function\", "
              "\"function\": {\"name\"}}");
  const std::string name = (*choice)["function"]["name"].get<std::string>();
  bool known = false;
  for (const ojson& tool : request.tools) known |= tool["function"].value("name", "") == name;
  if (!known)
    throw bad("tool_choice",
              "'tool_choice' names the function '" + name + "', which is not among 'tools'");
  request.tool_choice = ToolChoice::Named;
  request.tool_name = name;
}

// The tools whose arguments the reply is constrained to (all for required, the one for a named
// choice) get their parameters checked, and kept as the constraint takes them.
void check_tool_parameters(ParsedRequest& request) {
  if (request.tool_choice != ToolChoice::Required && request.tool_choice != ToolChoice::Named)
    return;
  for (size_t i = 0; i < request.tools.size(); ++i) {
    ojson& function = request.tools[i]["function"];
    if (request.tool_choice == ToolChoice::Named && function["name"] != request.tool_name) continue;
    const auto parameters = function.find("parameters");
    if (parameters == function.end() || parameters->is_null()) continue;
    *parameters = enforceable_json_schema(*parameters,
                                          "tools[" + std::to_string(i) + "].function.parameters");
  }
}

std::vector<std::string> parse_stop(const json& body) {
  const auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return {};
  if (it->is_string()) return {it->get<std::string>()};
  if (!it->is_array())
    throw bad("stop",
              std::string("'stop' must be a string or an array of strings, not ") + type_name(*it));
  constexpr size_t kMaxStops = 16;
  if (it->size() > kMaxStops) throw bad("stop", "'stop' holds at most 16 strings");
  std::vector<std::string> stops;
  for (const json& stop : *it) {
    if (!stop.is_string()) throw bad("stop", "'stop' must hold only strings");
    stops.push_back(stop.get<std::string>());
  }
  return stops;
}

}  // namespace

void check_schema_keywords(const nlohmann::ordered_json& schema, const std::string& param) {
  // The caller compiles the schema it checked: nothing may be rewritten.
  enforceable_json_schema(schema, param, /*allow_rewrite=*/false);
}

json error_json(const ApiError& error) {
  return {{"error",
           {{"message", error.what()},
            {"type", error.type},
            {"param", error.param.empty() ? json(nullptr) : json(error.param)},
            {"code", error.code.empty() ? json(nullptr) : json(error.code)}}}};
}

ParsedRequest parse_request(Endpoint endpoint, std::string_view body_text,
                            const RequestLimits& limits) {
  json body = json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) throw bad("", "the request body is not valid JSON");
  if (!body.is_object()) throw bad("", "the request body must be a JSON object");

  const ojson ordered = ojson::parse(body_text, nullptr, /*allow_exceptions=*/false);
  ParsedRequest request;
  request.endpoint = endpoint;
  if (endpoint == Endpoint::ChatCompletions) {
    request.messages = parse_messages(body);
    request.chat_options = parse_chat_options(body);
    parse_tools(ordered, request);
    check_tool_parameters(request);
  } else {
    parse_prompt(body, request);
    for (const char* field : {"tools", "tool_choice", "response_format"}) {
      if (const auto it = body.find(field); it != body.end() && !it->is_null())
        throw bad(field, std::string("'") + field + "' is only for /v1/chat/completions");
    }
  }
  request.constraint = parse_constraint(ordered);
  if (request.constraint.active() &&
      (request.tool_choice == ToolChoice::Required || request.tool_choice == ToolChoice::Named))
    throw bad("tool_choice",
              "a reply cannot both follow 'response_format' and be a tool call: use tool_choice "
              "auto or none with it");
  if (const auto it = body.find("model"); it != body.end() && !it->is_null() && !it->is_string()) {
    throw bad("model", std::string("'model' must be a string, not ") + type_name(*it));
  }
  if (auto n = integer_field(body, "n", 1, 1000); n && *n != 1) {
    throw bad("n", "'n' must be 1: this server returns one choice per request");
  }

  SamplingParams& s = request.sampling;
  // OpenAI's defaults: temperature 1 and top_p 1; top_k and min_p keep the engine's. OpenAI's
  // API has no repetition penalty (only presence/frequency): off unless repeat_penalty asks.
  s.temperature = 1.0f;
  s.top_p = 1.0f;
  s.repetition_penalty = 1.0f;
  s.max_tokens = limits.default_max_tokens;
  const SamplingRanges& r = kSamplingRanges;
  const auto cap = std::min<int64_t>(limits.max_tokens_cap, r.max_tokens.max);
  // max_completion_tokens is the newer name; it wins when both are given.
  if (auto v = integer_field(body, "max_tokens", r.max_tokens.min, cap))
    s.max_tokens = static_cast<int32_t>(*v);
  if (endpoint == Endpoint::ChatCompletions) {
    if (auto v = integer_field(body, "max_completion_tokens", r.max_tokens.min, cap))
      s.max_tokens = static_cast<int32_t>(*v);
  }
  if (auto v = sampling_field(body, "temperature", r.temperature)) s.temperature = *v;
  if (auto v = sampling_field(body, "top_p", r.top_p)) s.top_p = *v;
  if (auto v = sampling_field(body, "presence_penalty", r.presence_penalty))
    s.presence_penalty = *v;
  if (auto v = sampling_field(body, "frequency_penalty", r.frequency_penalty))
    s.frequency_penalty = *v;
  // Extensions llama-server also takes.
  if (auto v = sampling_field(body, "top_k", r.top_k)) s.top_k = *v;
  if (auto v = sampling_field(body, "min_p", r.min_p)) s.min_p = *v;
  if (auto v = sampling_field(body, "repeat_penalty", r.repetition_penalty))
    s.repetition_penalty = *v;
  if (auto v = integer_field(body, "seed", std::numeric_limits<int64_t>::min(),
                             std::numeric_limits<int64_t>::max())) {
    s.seed = static_cast<uint64_t>(*v);
    request.seeded = true;
  }
  // llama-server's extension: keep generating past the end-of-text token (benchmarks).
  if (auto v = bool_field(body, "ignore_eos")) s.ignore_eos = *v;
  s.stop_strings = parse_stop(body);
  request.stream = bool_field(body, "stream").value_or(false);
  if (const auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) throw bad("stream_options", "'stream_options' must be an object");
    if (!request.stream)
      throw bad("stream_options", "'stream_options' is only allowed with 'stream': true");
    request.include_usage = bool_field(*it, "include_usage").value_or(false);
  }
  if (endpoint == Endpoint::ChatCompletions) {
    const bool wanted = bool_field(body, "logprobs").value_or(false);
    const auto top = integer_field(body, "top_logprobs", 0, kMaxTopLogprobs);
    if (top && !wanted) throw bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    if (wanted) request.top_logprobs = static_cast<int32_t>(top.value_or(0));
  } else if (auto v = integer_field(body, "logprobs", 0, 5)) {
    request.top_logprobs = static_cast<int32_t>(*v);
  }
  return request;
}

namespace {
json bytes_json(const std::string& piece) {
  json bytes = json::array();
  for (const char c : piece) bytes.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return bytes;
}
}  // namespace

json logprobs_json(Endpoint endpoint, const std::vector<TokenLogprobs>& tokens,
                   int64_t text_offset) {
  if (endpoint == Endpoint::ChatCompletions) {
    json content = json::array();
    for (const TokenLogprobs& t : tokens) {
      json top = json::array();
      for (const TokenLogprob& alt : t.top) {
        top.push_back(
            {{"token", alt.piece}, {"logprob", alt.logprob}, {"bytes", bytes_json(alt.piece)}});
      }
      content.push_back({{"token", t.chosen.piece},
                         {"logprob", t.chosen.logprob},
                         {"bytes", bytes_json(t.chosen.piece)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json pieces = json::array(), values = json::array(), top = json::array(), offsets = json::array();
  for (const TokenLogprobs& t : tokens) {
    pieces.push_back(t.chosen.piece);
    values.push_back(t.chosen.logprob);
    json alternatives = json::object();
    for (const TokenLogprob& alt : t.top) alternatives[alt.piece] = alt.logprob;
    top.push_back(alternatives);
    offsets.push_back(text_offset);
    text_offset += static_cast<int64_t>(t.chosen.piece.size());
  }
  return {{"tokens", pieces},
          {"token_logprobs", values},
          {"top_logprobs", top},
          {"text_offset", offsets}};
}

std::string openai_finish_reason(FinishReason reason) {
  switch (reason) {
    case FinishReason::Eos:
    case FinishReason::StopString:
      return "stop";
    case FinishReason::MaxTokens:
      return "length";
    default:
      return "";
  }
}

json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
}

json timings_json(const Usage& usage) {
  const int64_t n = usage.completion_tokens;
  const double decode_s = usage.predicted_ms / 1000.0;
  return {{"prompt_n", usage.prompt_tokens - usage.cached_tokens},
          {"cache_n", usage.cached_tokens},
          {"prompt_ms", std::max(usage.prompt_ms, 0.0)},
          {"predicted_n", n},
          {"predicted_ms", std::max(usage.predicted_ms, 0.0)},
          // Intervals between tokens: the first token's time belongs to the prompt.
          {"predicted_per_second",
           n > 1 && decode_s > 0 ? static_cast<double>(n - 1) / decode_s : 0.0}};
}

namespace {

json base_json(const ResponseHeader& header, const char* object) {
  return {
      {"id", header.id}, {"object", object}, {"created", header.created}, {"model", header.model}};
}

json nullable(const std::string& text) { return text.empty() ? json(nullptr) : json(text); }

}  // namespace

json tool_call_json(const ToolCall& call) {
  return {{"id", call.id},
          {"type", "function"},
          {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
}

json tool_call_chunk_json(const ResponseHeader& header, const ToolCallPiece& piece) {
  json chunk = base_json(header, "chat.completion.chunk");
  // The call's first piece names it; the others add to its arguments.
  json entry = {{"index", piece.index}};
  if (!piece.id.empty()) {
    entry["id"] = piece.id;
    entry["type"] = "function";
    entry["function"] = {{"name", piece.name}, {"arguments", piece.arguments}};
  } else {
    entry["function"] = {{"arguments", piece.arguments}};
  }
  json choice = {{"index", 0},
                 {"logprobs", nullptr},
                 {"finish_reason", nullptr},
                 {"delta", {{"tool_calls", json::array({entry})}}}};
  chunk["choices"] = json::array({choice});
  return chunk;
}

json completion_json(Endpoint endpoint, const ResponseHeader& header, const std::string& text,
                     const std::string& finish_reason, const Usage& usage,
                     const std::string& reasoning, const std::vector<ToolCall>& tool_calls) {
  const bool chat = endpoint == Endpoint::ChatCompletions;
  json response = base_json(header, chat ? "chat.completion" : "text_completion");
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullable(finish_reason)}};
  if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
    if (!reasoning.empty()) choice["message"]["reasoning_content"] = reasoning;
    if (!tool_calls.empty()) {
      json calls = json::array();
      for (const ToolCall& call : tool_calls) calls.push_back(tool_call_json(call));
      choice["message"]["tool_calls"] = calls;
      // As OpenAI: no text beside the calls is null content.
      if (text.find_first_not_of(" \n\t\r") == std::string::npos)
        choice["message"]["content"] = nullptr;
    }
  } else {
    choice["text"] = text;
  }
  response["choices"] = json::array({choice});
  response["usage"] = usage_json(usage);
  if (usage.prompt_ms >= 0) response["timings"] = timings_json(usage);
  return response;
}

json chunk_json(Endpoint endpoint, const ResponseHeader& header, const std::string& text,
                const std::string& finish_reason, bool role, const std::string& reasoning) {
  const bool chat = endpoint == Endpoint::ChatCompletions;
  json chunk = base_json(header, chat ? "chat.completion.chunk" : "text_completion");
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", nullable(finish_reason)}};
  if (chat) {
    json delta = json::object();
    if (role) delta["role"] = "assistant";
    if (!reasoning.empty()) delta["reasoning_content"] = reasoning;
    if (role || !text.empty()) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  chunk["choices"] = json::array({choice});
  return chunk;
}

json usage_chunk_json(Endpoint endpoint, const ResponseHeader& header, const Usage& usage) {
  const bool chat = endpoint == Endpoint::ChatCompletions;
  json chunk = base_json(header, chat ? "chat.completion.chunk" : "text_completion");
  chunk["choices"] = json::array();
  chunk["usage"] = usage_json(usage);
  return chunk;
}

std::string sse_event(const json& data) {
  // dump() replaces invalid UTF-8 rather than throwing: model text is valid, but be safe.
  return "data: " + data.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
}

}  // namespace granule::server
