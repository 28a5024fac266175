// OpenAI tool calling over the chat templates' own formats: which format a model writes its
// calls in, the constraint that makes it write one (tool_choice required or a named function),
// and the parser that turns its reply back into OpenAI `tool_calls`, whole or while streaming.
// Pure functions and a small state machine, tested without a server or a model.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "granule/chat_template.h"
#include "granule/constraint.h"

namespace granule::server {

// How a model writes a tool call in its reply.
enum class ToolCallFormat {
  Hermes,   // Hermes / Qwen: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
  Llama3,   // Llama 3.1+: {"name": ..., "parameters": {...}} as the whole reply
  Mistral,  // Mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
  Harmony,  // gpt-oss: a commentary message to=functions.NAME <|constrain|>json<|message|>{...}
};
ToolCallFormat tool_call_format(const ChatTemplate& chat_template);
const char* tool_call_format_name(ToolCallFormat format);

struct ToolCall {
  std::string id;  // "call_<request>_<index>"
  std::string name;
  std::string arguments;  // a JSON object's text, as OpenAI sends it
};

// A call as it streams, as OpenAI's tool_calls deltas: the first piece of call `index` carries
// its id and name, the pieces after it add to its arguments. A call found whole is one piece.
struct ToolCallPiece {
  int index = 0;
  std::string id;    // the first piece's
  std::string name;  // the first piece's
  std::string arguments;
};
// Adds `pieces` to the whole calls `calls` (the response that is not streamed).
void add_tool_call_pieces(std::vector<ToolCall>& calls, const std::vector<ToolCallPiece>& pieces);

// tool_choice: none (tools never called), auto (the model decides), required (at least one
// call), or one named function.
enum class ToolChoice { None, Auto, Required, Named };

// The constraint that makes the reply one call (or, with `parallel`, one or more calls) in
// `format`, of the tool named `name` or, when empty, any of `tools` (OpenAI's tool array).
// nullopt for harmony (whose markers are control tokens: see harmony_forced_call) and when no
// tool matches.
std::optional<Constraint> tool_call_constraint(ToolCallFormat format,
                                               const nlohmann::ordered_json& tools,
                                               const std::string& name, bool parallel);

// Harmony's forced call: the call's header is control tokens, which a constraint cannot emit,
// so it is forced instead, appended to the prompt after the generation prompt
// ("<|start|>assistant"), and the constraint covers the arguments alone (the tool's JSON
// schema); <|call|>, an end-of-generation token, ends the reply.
struct HarmonyForcedCall {
  std::string name;       // the function called
  std::string header;     // "<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>"
  Constraint constraint;  // the arguments: the tool's parameters schema
};
// The call to `name`, or when `name` is empty to the one tool of `tools`. nullopt when `name`
// is not among `tools`, or when it is empty and `tools` has several functions (the name sits
// between control tokens, so it cannot be left to a constraint).
std::optional<HarmonyForcedCall> harmony_forced_call(const nlohmann::ordered_json& tools,
                                                     const std::string& name);
// tool_choice required with several tools: the header forced up to the recipient's prefix
// ("<|channel|>commentary to=functions.", `name` empty), the rest constrained by a structural
// tag over every tool: its name, " <|constrain|>json<|message|>", its arguments' schema.
// `constrain_token` and `message_token` are the vocabulary's control tokens for the two
// markers (nullopt: the vocabulary spells them as text). nullopt when `tools` names no
// function.
std::optional<HarmonyForcedCall> harmony_required_call(const nlohmann::ordered_json& tools,
                                                       std::optional<int32_t> constrain_token,
                                                       std::optional<int32_t> message_token);

// Splits a streamed reply into its text and its tool calls. Text that may begin a call is held
// back until it is known not to; a call is released once complete.
// Harmony reads the raw reply, before the ReasoningParser: a call is a message whose header
// names the recipient, so the parser takes the call messages out and passes every other message
// on as it came, tags included, for the ReasoningParser to split into reasoning and answer. A
// harmony call streams: its name once the header is read, then its arguments as they come
// (without the whitespace between JSON tokens; a raw control character in a string escaped),
// also when the reply is cut short inside them (as OpenAI's, finish_reason "length").
class ToolCallParser {
 public:
  // `id_prefix` names the calls: "<id_prefix>_<index>".
  ToolCallParser(ToolCallFormat format, std::string id_prefix);

  struct Delta {
    std::string content;
    std::vector<ToolCallPiece> calls;
  };
  Delta push(std::string_view text);
  Delta finish();  // the end of the reply: what was held back (an unfinished call as text)
  // Harmony: the reply begins inside a call to `name` whose header the prompt forced
  // (harmony_forced_call); its arguments come first, ended by a tag or the reply's end. With
  // `name` empty, the prompt forced the header up to "to=functions." (harmony_required_call):
  // the reply begins with the function's name.
  void begin_call(std::string name);
  int calls() const { return next_index_; }

 private:
  void run(Delta& out, bool at_end);
  // Parses one call's JSON (Hermes, Llama 3) or array of calls (Mistral) into `out`; false
  // when it is not a call.
  bool take_json(std::string_view text, Delta& out);
  void run_harmony(Delta& out, bool at_end);
  void harmony_arguments(std::string_view text, Delta& out);

  ToolCallFormat format_;
  std::string id_prefix_;
  std::string pending_;
  bool at_start_ = true;  // Llama 3 / Mistral: nothing but whitespace released yet
  bool in_call_ = false;  // Hermes: after <tool_call>
  bool whole_ = false;    // Llama 3 / Mistral: the reply is a call; kept whole until the end
  int next_index_ = 0;
  // Harmony: where the parser is in the stream of messages.
  enum class Harmony { Header, Body, CallBody };
  Harmony harmony_ = Harmony::Header;  // the reply begins with a header ("<|start|>assistant" is
                                       // the prompt's)
  std::string call_name_;              // Harmony: the recipient of the call being read
  bool call_named_ = false;            // Harmony: its first piece (id and name) is out
  bool in_string_ = false;             // Harmony: where its arguments are, inside a string
  bool escaped_ = false;               // ... after a backslash
};

}  // namespace granule::server
