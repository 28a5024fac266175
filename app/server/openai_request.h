// The OpenAI API's request and response bodies, without HTTP: a JSON body checked and turned
// into what the engine takes (messages or a prompt, sampling), the OpenAI error JSON, and the
// response and stream-chunk JSON. Pure functions, so they are tested without a server.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "granule/chat_template.h"
#include "granule/constraint.h"
#include "granule/engine.h"
#include "granule/sampling.h"
#include "tool_calls.h"

namespace granule::server {

// An error a client gets as {"error":{"message","type","param","code"}} with an HTTP status.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string type = "invalid_request_error",
           std::string param = "", std::string code = "")
      : std::runtime_error(message),
        status(status),
        type(std::move(type)),
        param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type;
  std::string param;  // "" is written as null
  std::string code;   // "" is written as null
};

nlohmann::json error_json(const ApiError& error);

// Throws a 400 ApiError naming the first keyword of `schema` the structured-output constraint
// would not enforce (the window checks its chats' schemas the same way); `param` names the
// schema in the message.
void check_schema_keywords(const nlohmann::ordered_json& schema, const std::string& param);

enum class Endpoint { ChatCompletions, Completions };

// A request as the engine will run it, with what the response needs to say about it.
struct ParsedRequest {
  Endpoint endpoint = Endpoint::ChatCompletions;
  std::vector<ChatMessage> messages;      // chat completions
  std::string prompt;                     // completions: raw text, tokenized as is, or
  std::vector<int32_t> prompt_token_ids;  // completions: token ids (OpenAI's array of integers)
  SamplingParams sampling;
  bool seeded = false;  // a seed was given (otherwise the server draws one)
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Log-probabilities: -1 none; else each token's with that many alternatives (chat:
  // logprobs + top_logprobs 0..20; completions: logprobs 0..5, the legacy field).
  int32_t top_logprobs = -1;
  // The chat template's variables: reasoning_effort (low/medium/high, gpt-oss) and
  // chat_template_kwargs.enable_thinking (Qwen3), as llama-server and vLLM take them.
  ChatOptions chat_options;
  // Structured output: response_format (json_object, json_schema), or llama-server's
  // `grammar` (GBNF) and `json_schema` extensions; None for free text.
  Constraint constraint;
  // Tool calling (chat): OpenAI's `tools` array (also in chat_options.tools_json for the
  // template), tool_choice and parallel_tool_calls. The server constrains the reply for
  // required / named and parses calls out of it for auto, required and named.
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();
  ToolChoice tool_choice = ToolChoice::None;
  std::string tool_name;  // ToolChoice::Named
  bool parallel_tool_calls = true;
};

// Limits the server applies while parsing.
struct RequestLimits {
  int32_t max_tokens_cap = kSamplingRanges.max_tokens.max;  // the largest max_tokens accepted
  int32_t default_max_tokens = kSamplingRanges.max_tokens.default_value;  // none given
};

// Parses a request body. Throws ApiError(400) for malformed JSON, a wrong type, a value out
// of range or a field the server cannot honour (n > 1), naming the field in `param`.
ParsedRequest parse_request(Endpoint endpoint, std::string_view body, const RequestLimits& limits);

// The "logprobs" object of a choice for these tokens: chat's {"content":[{token, logprob,
// bytes, top_logprobs}]}, or the legacy completions form {tokens, token_logprobs,
// top_logprobs, text_offset} with offsets counted from text_offset (bytes of text before).
nlohmann::json logprobs_json(Endpoint endpoint, const std::vector<TokenLogprobs>& tokens,
                             int64_t text_offset = 0);

// "stop" / "length" (the OpenAI names) for how a sequence ended; "" when it did not end
// by itself (cancelled, error).
std::string openai_finish_reason(FinishReason reason);

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // of prompt_tokens, whose KV was kept from an earlier request
  // Server-side timing (negative: not known yet): from the request reaching the engine
  // thread's queue to its first token (queue and prefill), and from its first token to its last.
  double prompt_ms = -1;
  double predicted_ms = -1;
};
nlohmann::json usage_json(const Usage& usage);
// llama-server's `timings` object (prompt_n, cache_n, prompt_ms, predicted_n, predicted_ms,
// predicted_per_second), sent beside `usage` in a finished response or final chunk.
nlohmann::json timings_json(const Usage& usage);

// What every response and chunk of one request shares.
struct ResponseHeader {
  std::string id;  // "chatcmpl-7", "cmpl-7"
  int64_t created = 0;
  std::string model;
};

// A whole (non-streamed) response.
// reasoning: the model's reasoning (chat), sent as message.reasoning_content when not empty,
// as llama-server and vLLM do.
nlohmann::json completion_json(Endpoint endpoint, const ResponseHeader& header,
                               const std::string& text, const std::string& finish_reason,
                               const Usage& usage, const std::string& reasoning = "",
                               const std::vector<ToolCall>& tool_calls = {});
// A stream chunk of a tool call as OpenAI sends it: the call's first piece with its index, id,
// type, name and arguments so far (all of them where a format releases a call once complete),
// a later piece with its index and more of its arguments.
nlohmann::json tool_call_chunk_json(const ResponseHeader& header, const ToolCallPiece& piece);
// A stream chunk carrying text (or, for chat, the assistant's role first with role = true),
// or the last chunk with a finish reason (text empty). finish_reason "" is written as null.
// A chat chunk's reasoning goes in delta.reasoning_content.
nlohmann::json chunk_json(Endpoint endpoint, const ResponseHeader& header, const std::string& text,
                          const std::string& finish_reason, bool role = false,
                          const std::string& reasoning = "");
// The chunk stream_options.include_usage asks for after the last: no choices, the usage.
nlohmann::json usage_chunk_json(Endpoint endpoint, const ResponseHeader& header,
                                const Usage& usage);
// "data: {...}\n\n"
std::string sse_event(const nlohmann::json& data);

}  // namespace granule::server
