// Tool-call formats: detection from the chat template, the structural-tag constraint that
// forces a call, and the streaming parser of calls in a reply.
#include "tool_calls.h"

#include <algorithm>

namespace granule::server {
namespace {

using json = nlohmann::ordered_json;  // the client's key order, kept

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralMarker = "[TOOL_CALLS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";
// Harmony's control tokens, rendered as text by the detokenizer for harmony vocabularies.
constexpr std::string_view kHarmonyStart = "<|start|>";
constexpr std::string_view kHarmonyChannel = "<|channel|>";
constexpr std::string_view kHarmonyMessage = "<|message|>";
constexpr std::string_view kHarmonyCall = "<|call|>";
constexpr std::string_view kHarmonyEnd = "<|end|>";
constexpr std::string_view kHarmonyReturn = "<|return|>";
constexpr std::string_view kHarmonyRecipient = "to=functions.";
// A header longer than this without <|message|> is not a header (as the ReasoningParser).
constexpr size_t kMaxHarmonyHeaderBytes = 256;

// The longest suffix of `text` that is a proper prefix of `marker`.
size_t holdback(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

std::string_view trim_left(std::string_view s) {
  while (!s.empty() &&
         (s.front() == ' ' || s.front() == '\n' || s.front() == '\t' || s.front() == '\r'))
    s.remove_prefix(1);
  return s;
}

std::string_view trim(std::string_view s) {
  s = trim_left(s);
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\n' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return s;
}

// Parses a call's JSON; nlohmann refuses raw control characters inside strings, which the
// grammar's JSON allows (a raw tab in a string), so those are escaped first. Discarded when
// it is not JSON.
json parse_arguments(std::string_view text) {
  std::string escaped;
  escaped.reserve(text.size());
  bool in_string = false, escape = false;
  for (const char c : text) {
    if (in_string && !escape && static_cast<unsigned char>(c) < 0x20) {
      static constexpr char kHex[] = "0123456789abcdef";
      escaped += "\\u00";
      escaped += kHex[(c >> 4) & 0xf];
      escaped += kHex[c & 0xf];
      continue;
    }
    escaped += c;
    if (escape) {
      escape = false;
    } else if (in_string && c == '\\') {
      escape = true;
    } else if (c == '"') {
      in_string = !in_string;
    }
  }
  return json::parse(escaped, nullptr, /*allow_exceptions=*/false);
}

const json& function_of(const json& tool) {
  static const json empty = json::object();
  const auto it = tool.find("function");
  return it != tool.end() && it->is_object() ? *it : empty;
}

json parameters_of(const json& tool) {
  const json& f = function_of(tool);
  const auto it = f.find("parameters");
  if (it != f.end() && it->is_object() && !it->empty()) return *it;
  return json{{"type", "object"}};
}

// A structural tag's arguments: the tool's schema. Whitespace between JSON tokens comes one
// character at most (a structural tag's JSON otherwise allows any amount, which a small model
// fills a reply with).
json arguments_element(const json& tool) {
  return {{"type", "json_schema"}, {"json_schema", parameters_of(tool)}, {"max_whitespace_cnt", 1}};
}

}  // namespace

void add_tool_call_pieces(std::vector<ToolCall>& calls, const std::vector<ToolCallPiece>& pieces) {
  for (const ToolCallPiece& piece : pieces) {
    if (!piece.id.empty() || calls.empty()) {
      calls.push_back({piece.id, piece.name, piece.arguments});
    } else {
      calls.back().arguments += piece.arguments;
    }
  }
}

ToolCallFormat tool_call_format(const ChatTemplate& chat_template) {
  if (chat_template.reasoning_format() == ReasoningFormat::Harmony) return ToolCallFormat::Harmony;
  switch (chat_template.family()) {
    case TemplateFamily::Llama3:
      return ToolCallFormat::Llama3;
    case TemplateFamily::Mistral:
      return ToolCallFormat::Mistral;
    default:
      return ToolCallFormat::Hermes;  // ChatML (Qwen, Hermes, SmolLM) and the rest
  }
}

const char* tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::Hermes:
      return "hermes";
    case ToolCallFormat::Llama3:
      return "llama3";
    case ToolCallFormat::Mistral:
      return "mistral";
    case ToolCallFormat::Harmony:
      return "harmony";
  }
  return "unknown";
}

std::optional<Constraint> tool_call_constraint(ToolCallFormat format, const json& tools,
                                               const std::string& name, bool parallel) {
  if (format == ToolCallFormat::Harmony) return std::nullopt;
  json tags = json::array();
  for (const json& tool : tools) {
    const std::string tool_name = function_of(tool).value("name", "");
    if (tool_name.empty() || (!name.empty() && tool_name != name)) continue;
    const std::string quoted = json(tool_name).dump();
    std::string begin, end;
    switch (format) {
      case ToolCallFormat::Hermes:
        begin = std::string(kHermesOpen) + "\n{\"name\": " + quoted + ", \"arguments\": ";
        end = "}\n" + std::string(kHermesClose);
        break;
      case ToolCallFormat::Llama3:
        begin = "{\"name\": " + quoted + ", \"parameters\": ";
        end = "}";
        break;
      case ToolCallFormat::Mistral:
        begin = "[{\"name\": " + quoted + ", \"arguments\": ";
        end = "}]";
        break;
      case ToolCallFormat::Harmony:
        break;
    }
    tags.push_back(
        {{"type", "tag"}, {"begin", begin}, {"content", arguments_element(tool)}, {"end", end}});
  }
  if (tags.empty()) return std::nullopt;
  // Only Hermes writes several calls one after another; the others, one call per reply.
  const bool several = parallel && format == ToolCallFormat::Hermes;
  const json format_json = {{"type", "tags_with_separator"},
                            {"tags", tags},
                            {"separator", "\n"},
                            {"at_least_one", true},
                            {"stop_after_first", !several}};
  return Constraint::structural_tag(
      json{{"type", "structural_tag"}, {"format", format_json}}.dump());
}

std::optional<HarmonyForcedCall> harmony_forced_call(const json& tools, const std::string& name) {
  const json* chosen = nullptr;
  int functions = 0;
  for (const json& tool : tools) {
    const std::string tool_name = function_of(tool).value("name", "");
    if (tool_name.empty()) continue;
    ++functions;
    if (name.empty() ? chosen == nullptr : tool_name == name) chosen = &tool;
  }
  if (chosen == nullptr || (name.empty() && functions != 1)) return std::nullopt;
  HarmonyForcedCall call;
  call.name = function_of(*chosen).value("name", "");
  // As gpt-oss writes a call after "<|start|>assistant" (the harmony format's own example).
  call.header = std::string(kHarmonyChannel) + "commentary " + std::string(kHarmonyRecipient) +
                call.name + " <|constrain|>json" + std::string(kHarmonyMessage);
  call.constraint = Constraint::json_schema(parameters_of(*chosen).dump());
  return call;
}

std::optional<HarmonyForcedCall> harmony_required_call(const json& tools,
                                                       std::optional<int32_t> constrain_token,
                                                       std::optional<int32_t> message_token) {
  // A marker is its control token where the vocabulary has one (a constraint cannot write it
  // as text), else its text.
  const auto marker = [](std::optional<int32_t> token, std::string_view text) {
    return token ? json{{"type", "token"}, {"token", *token}}
                 : json{{"type", "const_string"}, {"value", text}};
  };
  json calls = json::array();
  for (const json& tool : tools) {
    const std::string name = function_of(tool).value("name", "");
    if (name.empty()) continue;
    calls.push_back({{"type", "sequence"},
                     {"elements",
                      {{{"type", "const_string"}, {"value", name + " "}},
                       marker(constrain_token, "<|constrain|>"),
                       {{"type", "const_string"}, {"value", "json"}},
                       marker(message_token, kHarmonyMessage),
                       arguments_element(tool)}}});
  }
  if (calls.empty()) return std::nullopt;
  HarmonyForcedCall call;
  call.header = std::string(kHarmonyChannel) + "commentary " + std::string(kHarmonyRecipient);
  call.constraint = Constraint::structural_tag(
      json{{"type", "structural_tag"}, {"format", {{"type", "or"}, {"elements", calls}}}}.dump());
  return call;
}

ToolCallParser::ToolCallParser(ToolCallFormat format, std::string id_prefix)
    : format_(format), id_prefix_(std::move(id_prefix)) {}

ToolCallParser::Delta ToolCallParser::push(std::string_view text) {
  pending_ += text;
  Delta out;
  run(out, false);
  return out;
}

void ToolCallParser::begin_call(std::string name) {
  if (name.empty()) {  // the reply goes on from "to=functions." in the prompt
    pending_ = std::string(kHarmonyRecipient);
    harmony_ = Harmony::Header;
    return;
  }
  call_name_ = std::move(name);  // its header is in the prompt, not the reply
  harmony_ = Harmony::CallBody;
}

ToolCallParser::Delta ToolCallParser::finish() {
  Delta out;
  run(out, true);
  return out;
}

bool ToolCallParser::take_json(std::string_view text, Delta& out) {
  const json value = parse_arguments(trim(text));
  if (value.is_discarded()) return false;
  std::vector<json> items;
  if (value.is_array()) {
    items.assign(value.begin(), value.end());
  } else {
    items.push_back(value);
  }
  std::vector<ToolCallPiece> calls;
  for (const json& item : items) {
    if (!item.is_object()) return false;
    const auto name = item.find("name");
    if (name == item.end() || !name->is_string()) return false;
    auto args = item.find("arguments");
    if (args == item.end()) args = item.find("parameters");
    ToolCallPiece call;
    call.name = name->get<std::string>();
    if (args == item.end() || args->is_null()) {
      call.arguments = "{}";
    } else if (args->is_string()) {
      call.arguments = args->get<std::string>();  // already JSON text
    } else {
      call.arguments = args->dump();
    }
    calls.push_back(std::move(call));
  }
  if (calls.empty()) return false;
  for (ToolCallPiece& call : calls) {
    call.index = next_index_;
    call.id = id_prefix_ + "_" + std::to_string(next_index_++);
    out.calls.push_back(std::move(call));
  }
  return true;
}

void ToolCallParser::run(Delta& out, bool at_end) {
  if (format_ == ToolCallFormat::Harmony) {
    run_harmony(out, at_end);
    return;
  }
  if (format_ == ToolCallFormat::Llama3 || format_ == ToolCallFormat::Mistral) {
    if (at_start_) {
      const std::string_view head = trim_left(pending_);
      if (head.empty() && !at_end) return;
      // The call markers, or a held-back beginning of them.
      const std::vector<std::string_view> starts =
          format_ == ToolCallFormat::Llama3
              ? std::vector<std::string_view>{kPythonTag, "{"}
              : std::vector<std::string_view>{kMistralMarker, "[{", "[ {"};
      bool maybe = false;
      for (std::string_view s : starts) {
        if (head.starts_with(s)) whole_ = true;
        if (s.starts_with(head)) maybe = true;
      }
      if (!whole_ && maybe && !at_end) return;
      at_start_ = false;
    }
    if (!whole_) {
      out.content += pending_;
      pending_.clear();
      return;
    }
    if (!at_end) return;
    std::string_view body = trim_left(pending_);
    if (body.starts_with(kPythonTag)) body.remove_prefix(kPythonTag.size());
    body = trim_left(body);
    if (body.starts_with(kMistralMarker)) body.remove_prefix(kMistralMarker.size());
    if (!take_json(body, out)) out.content += pending_;
    pending_.clear();
    return;
  }
  // Hermes: calls between <tool_call> and </tool_call>, text around them.
  for (;;) {
    if (!in_call_) {
      const size_t open = pending_.find(kHermesOpen);
      if (open == std::string::npos) {
        const size_t keep = at_end ? 0 : holdback(pending_, kHermesOpen);
        out.content += pending_.substr(0, pending_.size() - keep);
        pending_.erase(0, pending_.size() - keep);
        return;
      }
      out.content += pending_.substr(0, open);
      pending_.erase(0, open + kHermesOpen.size());
      in_call_ = true;
    }
    const size_t close = pending_.find(kHermesClose);
    if (close == std::string::npos) {
      if (!at_end) return;
      // The reply ended inside a call: a complete JSON is still a call (also when the limit cut
      // its closing tag short), else it is text.
      const std::string_view body =
          std::string_view(pending_).substr(0, pending_.size() - holdback(pending_, kHermesClose));
      if (!take_json(body, out)) out.content += std::string(kHermesOpen) + pending_;
      pending_.clear();
      in_call_ = false;
      return;
    }
    const std::string body = pending_.substr(0, close);
    if (!take_json(body, out))
      out.content += std::string(kHermesOpen) + body + std::string(kHermesClose);
    pending_.erase(0, close + kHermesClose.size());
    in_call_ = false;
  }
}

// Harmony: messages are "<header><|message|><body><end tag>", a header beginning at the reply's
// start, at <|start|> or at <|channel|>. A message whose header names a recipient
// "to=functions.NAME" is a call whose body is the arguments' JSON, ended by <|call|> (or by the
// reply's end, when <|call|> stops generation and is not written).
void ToolCallParser::run_harmony(Delta& out, bool at_end) {
  const auto release = [&](size_t n) {
    out.content.append(pending_, 0, n);
    pending_.erase(0, n);
  };
  for (;;) {
    if (harmony_ == Harmony::Body) {
      const size_t at = std::min(pending_.find(kHarmonyStart), pending_.find(kHarmonyChannel));
      if (at == std::string::npos) {
        const size_t keep = at_end ? 0
                                   : std::max(holdback(pending_, kHarmonyStart),
                                              holdback(pending_, kHarmonyChannel));
        release(pending_.size() - keep);
        return;
      }
      release(at);
      harmony_ = Harmony::Header;
      continue;
    }
    if (harmony_ == Harmony::Header) {
      // A plain-text reply (no header at all) is not held back.
      const std::string_view head = pending_;
      const bool may_be_header = head.starts_with("<") || head.starts_with(" to=") ||
                                 head.starts_with("to=") ||
                                 std::string_view(" to=").starts_with(head);
      if (!head.empty() && !may_be_header) {
        harmony_ = Harmony::Body;
        continue;
      }
      const size_t message = pending_.find(kHarmonyMessage);
      if (message == std::string::npos) {
        if (at_end || pending_.size() > kMaxHarmonyHeaderBytes) {
          release(pending_.size());
          harmony_ = Harmony::Body;
        }
        return;
      }
      const std::string_view header = head.substr(0, message);
      const size_t to = header.find(kHarmonyRecipient);
      if (to == std::string_view::npos) {  // another message: passed on whole
        release(message + kHarmonyMessage.size());
        harmony_ = Harmony::Body;
        continue;
      }
      std::string_view name = header.substr(to + kHarmonyRecipient.size());
      name = name.substr(0, name.find_first_of(" \t\r\n<"));
      if (name.empty()) {  // no function named: not a call
        release(message + kHarmonyMessage.size());
        harmony_ = Harmony::Body;
        continue;
      }
      call_name_ = std::string(name);
      pending_.erase(0, message + kHarmonyMessage.size());
      harmony_ = Harmony::CallBody;
      continue;
    }
    // The call: its name first, then its arguments as they come, up to the tag that ends the
    // message (or the reply's end: <|call|> stops generation and is not written).
    if (!call_named_) {
      out.calls.push_back(
          {next_index_, id_prefix_ + "_" + std::to_string(next_index_), call_name_, ""});
      call_named_ = true;
    }
    size_t cut = std::string::npos;
    std::string_view tag;
    size_t keep = 0;  // what may begin a tag, held back
    for (std::string_view end :
         {kHarmonyCall, kHarmonyEnd, kHarmonyReturn, kHarmonyStart, kHarmonyChannel}) {
      const size_t at = pending_.find(end);
      if (at < cut) {
        cut = at;
        tag = end;
      }
      keep = std::max(keep, holdback(pending_, end));
    }
    if (cut == std::string::npos) {
      const size_t upto = pending_.size() - (at_end ? 0 : keep);
      harmony_arguments(std::string_view(pending_).substr(0, upto), out);
      pending_.erase(0, upto);
      if (!at_end) return;
    } else {
      harmony_arguments(std::string_view(pending_).substr(0, cut), out);
      const bool ends_message = tag == kHarmonyCall || tag == kHarmonyEnd || tag == kHarmonyReturn;
      pending_.erase(0, ends_message ? cut + tag.size() : cut);
    }
    ++next_index_;
    call_name_.clear();
    call_named_ = in_string_ = escaped_ = false;
    harmony_ = Harmony::Body;
  }
}

// A harmony call's arguments as they come: the whitespace between JSON tokens left out, a raw
// control character in a string (the grammar's JSON allows a raw tab) escaped, so the pieces
// join into the JSON a client parses.
void ToolCallParser::harmony_arguments(std::string_view text, Delta& out) {
  std::string piece;
  for (const char c : text) {
    if (!in_string_) {
      if (c == ' ' || c == '\n' || c == '\t' || c == '\r') continue;
      piece += c;
      in_string_ = c == '"';
      continue;
    }
    if (escaped_) {
      escaped_ = false;
    } else if (c == '\\') {
      escaped_ = true;
    } else if (c == '"') {
      in_string_ = false;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      // As a JSON writer escapes it.
      static constexpr char kHex[] = "0123456789abcdef";
      static constexpr std::string_view kShort = "btn_fr";  // \b \t \n, -, \f \r from 8
      if (c >= 8 && c <= 13 && c != 11) {
        piece += '\\';
        piece += kShort[static_cast<size_t>(c - 8)];
      } else {
        piece += "\\u00";
        piece += kHex[(c >> 4) & 0xf];
        piece += kHex[c & 0xf];
      }
      continue;
    }
    piece += c;
  }
  if (piece.empty()) return;
  // The call's first piece stays its name alone, as OpenAI's first delta.
  if (!out.calls.empty() && out.calls.back().index == next_index_ && out.calls.back().id.empty()) {
    out.calls.back().arguments += piece;
  } else {
    out.calls.push_back({next_index_, "", "", std::move(piece)});
  }
}

}  // namespace granule::server
