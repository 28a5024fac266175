// The reply's parsers chained in the order the template's formats need.
#include "reply_parser.h"

#include "granule/error.h"

#ifdef GRANULE_WINDOW_SERVER
#include "tool_calls.h"
#endif

namespace granule::app {

struct ReplyParser::Impl {
  std::optional<ReasoningParser> reasoning;
#ifdef GRANULE_WINDOW_SERVER
  std::optional<server::ToolCallParser> tools;
  // The parser streams a call as pieces (harmony: its name, then argument fragments); the window
  // takes whole calls, so a call goes out once the next one starts or the reply ends.
  std::vector<server::ToolCall> calls;
  size_t emitted = 0;
#endif
  bool harmony_calls = false;  // the calls are taken from the raw reply, before the reasoning
};

namespace {

#ifdef GRANULE_WINDOW_SERVER
void take_calls(std::vector<server::ToolCall>& calls, size_t& emitted, QList<ToolCallText>& out,
                const std::vector<server::ToolCallPiece>& pieces, bool reply_ended) {
  server::add_tool_call_pieces(calls, pieces);
  const size_t whole = reply_ended ? calls.size() : (calls.empty() ? 0 : calls.size() - 1);
  for (; emitted < whole; ++emitted) {
    const server::ToolCall& c = calls[emitted];
    out.append({QString::fromStdString(c.id), QString::fromStdString(c.name),
                QString::fromStdString(c.arguments)});
  }
}
#endif

}  // namespace

ReplyParser::ReplyParser(ReasoningFormat reasoning, const ChatTemplate* tmpl, bool tools,
                         const std::string& id_prefix)
    : impl_(std::make_unique<Impl>()) {
  if (reasoning != ReasoningFormat::None) impl_->reasoning.emplace(reasoning);
#ifdef GRANULE_WINDOW_SERVER
  if (tools && tmpl) {
    const server::ToolCallFormat format = server::tool_call_format(*tmpl);
    impl_->tools.emplace(format, id_prefix);
    impl_->harmony_calls = format == server::ToolCallFormat::Harmony && impl_->reasoning;
  }
#else
  (void)tmpl;
  (void)tools;
  (void)id_prefix;
#endif
}

ReplyParser::~ReplyParser() = default;
ReplyParser::ReplyParser(ReplyParser&&) noexcept = default;
ReplyParser& ReplyParser::operator=(ReplyParser&&) noexcept = default;

void ReplyParser::start_in_reasoning() {
  impl_->reasoning.emplace(ReasoningFormat::Think, /*starts_in_reasoning=*/true);
}

ReplyDelta ReplyParser::push(std::string_view text) {
  ReplyDelta out;
  std::string answer(text);
#ifdef GRANULE_WINDOW_SERVER
  if (impl_->harmony_calls) {
    server::ToolCallParser::Delta d = impl_->tools->push(text);
    take_calls(impl_->calls, impl_->emitted, out.calls, d.calls, false);
    answer = std::move(d.content);
  }
#endif
  if (impl_->reasoning) {
    ReasoningDelta r = impl_->reasoning->push(answer);
    out.reasoning = std::move(r.reasoning);
    answer = std::move(r.content);
  }
#ifdef GRANULE_WINDOW_SERVER
  if (impl_->tools && !impl_->harmony_calls) {
    server::ToolCallParser::Delta d = impl_->tools->push(answer);
    take_calls(impl_->calls, impl_->emitted, out.calls, d.calls, false);
    answer = std::move(d.content);
  }
#endif
  out.content = std::move(answer);
  return out;
}

ReplyDelta ReplyParser::finish() {
  ReplyDelta out;
  std::string answer;
#ifdef GRANULE_WINDOW_SERVER
  if (impl_->harmony_calls) {
    server::ToolCallParser::Delta d = impl_->tools->finish();
    take_calls(impl_->calls, impl_->emitted, out.calls, d.calls, true);
    answer = std::move(d.content);
  }
#endif
  if (impl_->reasoning) {
    ReasoningDelta r = impl_->reasoning->push(answer);
    ReasoningDelta rest = impl_->reasoning->finish();
    out.reasoning = r.reasoning + rest.reasoning;
    answer = r.content + rest.content;
  }
#ifdef GRANULE_WINDOW_SERVER
  if (impl_->tools && !impl_->harmony_calls) {
    server::ToolCallParser::Delta d = impl_->tools->push(answer);
    server::ToolCallParser::Delta rest = impl_->tools->finish();
    take_calls(impl_->calls, impl_->emitted, out.calls, d.calls, false);
    take_calls(impl_->calls, impl_->emitted, out.calls, rest.calls, true);
    answer = d.content + rest.content;
  }
#endif
  out.content = std::move(answer);
  return out;
}

bool toolCallsAvailable() {
#ifdef GRANULE_WINDOW_SERVER
  return true;
#else
  return false;
#endif
}

Constraint toolChoiceConstraint(const ChatTemplate* tmpl, const std::string& tools_json,
                                const std::string& choice) {
#ifdef GRANULE_WINDOW_SERVER
  if (!tmpl) throw UsageError("the model has no chat template: it cannot call tools");
  const auto tools = nlohmann::ordered_json::parse(tools_json, nullptr, false);
  if (!tools.is_array()) throw UsageError("the chat's tools are not a JSON array");
  const server::ToolCallFormat format = server::tool_call_format(*tmpl);
  std::optional<Constraint> c = server::tool_call_constraint(
      format, tools, choice == "required" ? std::string() : choice, /*parallel=*/false);
  if (!c)
    throw UsageError(std::string("a required tool call cannot be constrained for this model's "
                                 "tool-call format (") +
                     server::tool_call_format_name(format) + ")" +
                     (choice == "required" ? "" : " or no tool is named '" + choice + "'"));
  return std::move(*c);
#else
  (void)tmpl;
  (void)tools_json;
  (void)choice;
  throw UsageError("this build parses no tool calls (it has no server library)");
#endif
}

}  // namespace granule::app
