// ReplyParser: one reply of the model split as it streams into reasoning, answer and tool calls
// — the ReasoningParser for the template's reasoning format, and, when the chat offers tools,
// the server's ToolCallParser for the template's tool-call format (harmony calls are whole
// messages, so for gpt-oss the calls come out first and the rest goes on to the reasoning).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "granule/chat_template.h"
#include "granule/constraint.h"
#include "granule/reasoning.h"
#include "worker_types.h"

namespace granule::app {

struct ReplyDelta {
  std::string reasoning;
  std::string content;
  QList<ToolCallText> calls;
};

class ReplyParser {
 public:
  // `tmpl`: the model's template (null for an engine that has none: no tool calls parsed).
  // `tools`: the request offered tools; calls are named "<id_prefix>_<n>".
  ReplyParser(ReasoningFormat reasoning, const ChatTemplate* tmpl, bool tools,
              const std::string& id_prefix);
  ~ReplyParser();
  ReplyParser(ReplyParser&&) noexcept;
  ReplyParser& operator=(ReplyParser&&) noexcept;

  ReplyDelta push(std::string_view text);
  ReplyDelta finish();
  // The prompt opened <think>: the reply starts inside the reasoning.
  void start_in_reasoning();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Whether this build parses tool calls (the window is built with the server library).
bool toolCallsAvailable();

// The constraint that makes the reply a call in the template's format: to any of `tools_json`
// (OpenAI's array) for "required", to the named tool otherwise. Throws granule::UsageError when
// the format cannot be constrained (harmony) or no tool matches.
Constraint toolChoiceConstraint(const ChatTemplate* tmpl, const std::string& tools_json,
                                const std::string& choice);

}  // namespace granule::app
