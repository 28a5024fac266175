// Server-sent events as the HTML standard defines them: lines end with CR, LF or CRLF; a
// blank line dispatches; "data:" lines accumulate; lines starting with ":" are comments.
#include "remote/sse_stream.h"

namespace granule::remote {

void SseStream::feed(std::string_view bytes) {
  for (const char c : bytes) {
    if (c == '\n' && last_was_cr_) {  // the LF of a CRLF already ended the line
      last_was_cr_ = false;
      continue;
    }
    last_was_cr_ = c == '\r';
    if (c == '\r' || c == '\n') {
      const std::string text = std::move(line_);
      line_.clear();
      line(text);
    } else {
      line_.push_back(c);
    }
  }
}

void SseStream::line(std::string_view text) {
  if (text.empty()) {
    if (has_data_) handler_({event_, data_});
    event_.clear();
    data_.clear();
    has_data_ = false;
    return;
  }
  if (text.front() == ':') return;  // a comment (servers send them as keep-alives)
  const size_t colon = text.find(':');
  std::string_view field = text.substr(0, colon);
  std::string_view value =
      colon == std::string_view::npos ? std::string_view{} : text.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (field == "data") {
    if (has_data_) data_.push_back('\n');
    data_.append(value);
    has_data_ = true;
  } else if (field == "event") {
    event_ = std::string(value);
  }  // id and retry do not matter to a completion stream
}

}  // namespace granule::remote
