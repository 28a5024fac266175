// check_stop: end of generation first (the token itself is never text), then a stop string
// anywhere in the unsent text (sent up to it), then the length limits.
#include "runtime/stop_check.h"

#include "granule/sampling.h"

namespace granule {

StopDecision check_stop(const StopInputs& in) {
  StopDecision d;
  if (in.end_of_generation) {
    d.reason = FinishReason::Eos;
    return d;
  }
  static const std::vector<std::string> kNone;
  const std::vector<std::string>& stops = in.stop_strings ? *in.stop_strings : kNone;
  const size_t stop_at = find_stop_string(in.unsent_text, stops);
  if (stop_at != std::string::npos) {
    d.reason = FinishReason::StopString;
    d.send_bytes = stop_at;
    return d;
  }
  d.send_bytes = in.unsent_text.size() - stop_string_holdback(in.unsent_text, stops);
  if (in.generated >= in.max_tokens || in.tokens >= in.context_length)
    d.reason = FinishReason::MaxTokens;
  return d;
}

}  // namespace granule
