// An incremental reader of a server-sent event stream (text/event-stream, as the OpenAI API
// streams completions): bytes in as they arrive, whole events out.
#pragma once
#include <functional>
#include <string>
#include <string_view>

namespace granule::remote {

struct SseEvent {
  std::string event;  // "" when the event named none ("message")
  std::string data;   // its data lines joined with "\n"
};

class SseStream {
 public:
  using Handler = std::function<void(const SseEvent&)>;
  explicit SseStream(Handler handler) : handler_(std::move(handler)) {}
  // Any split of the stream into chunks gives the same events.
  void feed(std::string_view bytes);
  // Bytes received that do not yet form a whole event (a stream cut mid-event leaves some).
  bool has_partial_event() const { return !line_.empty() || !data_.empty() || has_data_; }

 private:
  void line(std::string_view text);
  Handler handler_;
  std::string line_;
  std::string event_;
  std::string data_;
  bool has_data_ = false;
  bool last_was_cr_ = false;
};

}  // namespace granule::remote
