// ReasoningParser: a small state machine over the streamed reply. Text is held back only while
// it may still turn out to be (the start of) a tag, so reasoning and answer stream as they come.
#include "granule/reasoning.h"

#include <algorithm>
#include <array>

namespace granule {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kWhitespace = " \t\r\n";

// Harmony's control tokens, which the detokenizer renders as text for harmony vocabularies.
constexpr std::string_view kStart = "<|start|>";
constexpr std::string_view kChannel = "<|channel|>";
constexpr std::string_view kMessage = "<|message|>";
constexpr std::string_view kEnd = "<|end|>";
constexpr std::string_view kReturn = "<|return|>";
constexpr std::string_view kCall = "<|call|>";
constexpr std::array<std::string_view, 5> kMessageEnds = {kEnd, kReturn, kCall, kStart, kChannel};
// A header longer than this without <|message|> is not a header: the text is the answer.
constexpr size_t kMaxHeaderBytes = 256;

// The length of the longest end of `text` that is the beginning of `tag` (but not all of it):
// what must wait for the next piece.
size_t partial_tag_suffix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

ReasoningParser::ReasoningParser(ReasoningFormat format, bool starts_in_reasoning)
    : format_(format) {
  if (format_ == ReasoningFormat::Harmony) {
    // The generation prompt ends with "<|start|>assistant": a channel header comes first.
    state_ = State::Header;
  } else if (format_ == ReasoningFormat::Think && starts_in_reasoning) {
    state_ = State::Reasoning;
    saw_reasoning_ = true;
    strip_leading_ = true;
  } else {
    state_ = format_ == ReasoningFormat::Think ? State::Start : State::Content;
  }
}

ReasoningDelta ReasoningParser::push(std::string_view text) {
  pending_.append(text);
  ReasoningDelta out;
  run(out, false);
  return out;
}

ReasoningDelta ReasoningParser::finish() {
  ReasoningDelta out;
  run(out, true);
  return out;
}

void ReasoningParser::release_text(ReasoningDelta& out, std::string_view text) {
  if (strip_leading_) {
    const size_t first = text.find_first_not_of("\r\n");
    if (first == std::string_view::npos) return;  // still only newlines: keep stripping
    text.remove_prefix(first);
    strip_leading_ = false;
  }
  if (text.empty()) return;
  if (state_ == State::Reasoning) {
    out.reasoning.append(text);
    saw_reasoning_ = true;
  } else {
    out.content.append(text);
  }
}

void ReasoningParser::run(ReasoningDelta& out, bool at_end) {
  if (format_ == ReasoningFormat::Harmony) {
    run_harmony(out, at_end);
  } else if (format_ == ReasoningFormat::Think) {
    run_think(out, at_end);
  } else {
    release_text(out, pending_);
    pending_.clear();
  }
}

void ReasoningParser::run_think(ReasoningDelta& out, bool at_end) {
  for (;;) {
    if (state_ == State::Start) {
      const size_t first = pending_.find_first_not_of(kWhitespace);
      const std::string_view rest = first == std::string::npos
                                        ? std::string_view()
                                        : std::string_view(pending_).substr(first);
      if (rest.starts_with(kThinkOpen)) {
        pending_.erase(0, first + kThinkOpen.size());
        state_ = State::Reasoning;
        saw_reasoning_ = true;
        strip_leading_ = true;
        continue;
      }
      if (!at_end && kThinkOpen.starts_with(rest)) return;  // "", or "<thi": wait
      state_ = State::Content;
      continue;
    }
    if (state_ == State::Reasoning) {
      const size_t close = pending_.find(kThinkClose);
      if (close != std::string::npos) {
        // The reasoning's trailing newlines belong to the tag's layout, not to the reasoning.
        const size_t end = pending_.find_last_not_of(kWhitespace, close == 0 ? 0 : close - 1);
        if (close > 0 && end != std::string::npos)
          release_text(out, std::string_view(pending_).substr(0, end + 1));
        pending_.erase(0, close + kThinkClose.size());
        state_ = State::Content;
        strip_leading_ = true;
        continue;
      }
      if (at_end) {
        release_text(out, pending_);
        pending_.clear();
        return;
      }
      // Hold back a possible "</thi" and trailing whitespace (it may precede the tag).
      size_t keep = partial_tag_suffix(pending_, kThinkClose);
      const size_t body_end = pending_.size() - keep;
      const size_t last = pending_.find_last_not_of(kWhitespace, body_end == 0 ? 0 : body_end - 1);
      const size_t release = (body_end == 0 || last == std::string::npos) ? 0 : last + 1;
      release_text(out, std::string_view(pending_).substr(0, release));
      pending_.erase(0, release);
      return;
    }
    // Content: everything is the answer.
    release_text(out, pending_);
    pending_.clear();
    return;
  }
}

void ReasoningParser::run_harmony(ReasoningDelta& out, bool at_end) {
  for (;;) {
    if (state_ == State::Header) {
      const size_t message = pending_.find(kMessage);
      if (message != std::string::npos) {
        const std::string_view header = std::string_view(pending_).substr(0, message);
        const size_t channel_at = header.find(kChannel);
        std::string_view channel;
        if (channel_at != std::string_view::npos) {
          channel = header.substr(channel_at + kChannel.size());
          channel = channel.substr(0, channel.find_first_of(" <"));
        }
        message_state_ = channel == "analysis" ? State::Reasoning : State::Content;
        pending_.erase(0, message + kMessage.size());
        state_ = message_state_;
        after_start_ = false;
        continue;
      }
      // Not a header after all: text that does not start like one (a model that answers in
      // plain text) is the answer from here on; an unfinished or overlong header is released
      // as the answer whole (it may begin with a tag, which must not send it back here).
      state_ = State::Content;
      message_state_ = State::Content;
      if (!pending_.empty() && pending_.front() != '<' && !after_start_) continue;
      if (at_end || pending_.size() > kMaxHeaderBytes) {
        release_text(out, pending_);
        pending_.clear();
        return;
      }
      state_ = State::Header;
      return;
    }
    if (state_ == State::Between) {
      const size_t first = pending_.find_first_not_of(kWhitespace);
      if (first == std::string::npos) {
        if (at_end) pending_.clear();
        return;
      }
      const std::string_view rest = std::string_view(pending_).substr(first);
      if (rest.starts_with(kStart)) {
        pending_.erase(0, first + kStart.size());
        state_ = State::Header;
        after_start_ = true;
        continue;
      }
      if (rest.starts_with(kChannel)) {
        pending_.erase(0, first);
        state_ = State::Header;
        continue;
      }
      if (!at_end && (kStart.starts_with(rest) || kChannel.starts_with(rest))) return;
      state_ = State::Content;  // text outside a message: show it as the answer
      message_state_ = State::Content;
      continue;
    }
    // Inside a message (Reasoning or Content): up to the first tag that ends it.
    size_t cut = std::string::npos;
    std::string_view tag;
    for (std::string_view end : kMessageEnds) {
      const size_t at = pending_.find(end);
      if (at < cut) {
        cut = at;
        tag = end;
      }
    }
    if (cut != std::string::npos) {
      release_text(out, std::string_view(pending_).substr(0, cut));
      if (tag == kChannel) {
        pending_.erase(0, cut);  // the header parses it
        state_ = State::Header;
      } else if (tag == kStart) {
        pending_.erase(0, cut + tag.size());
        state_ = State::Header;
        after_start_ = true;
      } else {
        pending_.erase(0, cut + tag.size());
        state_ = State::Between;
      }
      continue;
    }
    if (at_end) {
      release_text(out, pending_);
      pending_.clear();
      return;
    }
    size_t keep = 0;
    for (std::string_view end : kMessageEnds)
      keep = std::max(keep, partial_tag_suffix(pending_, end));
    release_text(out, std::string_view(pending_).substr(0, pending_.size() - keep));
    pending_.erase(0, pending_.size() - keep);
    return;
  }
}

}  // namespace granule
