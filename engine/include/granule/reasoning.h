// ReasoningParser: splits a model's streamed reply into its reasoning and its answer, for the
// formats ChatTemplate::reasoning_format() names: Qwen3 / DeepSeek-R1 <think>...</think>, and
// gpt-oss's harmony channels (analysis = reasoning; final and commentary = answer).
#pragma once
#include <string>
#include <string_view>

#include "granule/chat_template.h"

namespace granule {

// What one push() released: reasoning text and answer text, in that order within the push.
struct ReasoningDelta {
  std::string reasoning;
  std::string content;
  bool empty() const { return reasoning.empty() && content.empty(); }
};

class ReasoningParser {
 public:
  // starts_in_reasoning: the prompt already opened the reasoning (PromptInfo::reasoning_opened),
  // so the reply begins inside it, without its own <think>.
  explicit ReasoningParser(ReasoningFormat format, bool starts_in_reasoning = false);

  // Takes the next piece of the reply, split anywhere (a tag may span pieces). Text that may
  // be the start of a tag is held back until the next push() or finish(); the tags themselves
  // never appear in the output.
  ReasoningDelta push(std::string_view text);
  // The end of the reply: releases what was held back.
  ReasoningDelta finish();

  bool in_reasoning() const { return state_ == State::Reasoning; }
  // True once any reasoning was seen (the window's "Thinking" block exists).
  bool saw_reasoning() const { return saw_reasoning_; }

 private:
  enum class State {
    Start,      // Think: nothing but whitespace yet; a <think> may open the reasoning
    Reasoning,  // inside <think> or harmony's analysis channel
    Content,    // the answer
    Header,     // harmony: between <|start|> / <|channel|> and <|message|>
    Between,    // harmony: after <|end|>, before the next <|start|>
  };
  void run(ReasoningDelta& out, bool at_end);
  void run_think(ReasoningDelta& out, bool at_end);
  void run_harmony(ReasoningDelta& out, bool at_end);
  void release_text(ReasoningDelta& out, std::string_view text);

  ReasoningFormat format_;
  State state_;
  std::string pending_;         // received, not yet released
  bool strip_leading_ = false;  // drop the newlines a tag is followed by
  bool saw_reasoning_ = false;
  State message_state_ = State::Content;  // harmony: where the current message's text goes
  bool after_start_ = false;  // harmony: the header follows <|start|> (it names a role first)
};

}  // namespace granule
