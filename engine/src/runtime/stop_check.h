// When a sequence ends after a sampled token, and how much of its decoded text goes out now:
// one pure function, so every stop rule (end of generation, stop strings, the max-tokens and
// context limits) is decided and tested in one place.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "granule/engine.h"

namespace granule {

struct StopInputs {
  bool end_of_generation = false;  // the token ends generation (EOS/EOT) and is not ignored
  std::string_view unsent_text;    // decoded text not sent yet, the new token's included
  const std::vector<std::string>* stop_strings = nullptr;
  int64_t generated = 0;       // tokens sampled, this one included
  int64_t max_tokens = 0;      // the request's limit
  int64_t tokens = 0;          // prompt + sampled tokens, this one included
  int64_t context_length = 0;  // the slot's limit
};

struct StopDecision {
  FinishReason reason = FinishReason::None;  // None: the sequence goes on
  // Bytes at the start of unsent_text to send now. The rest is held back (it may begin a
  // stop string) while the sequence goes on, and dropped when a stop string ended it; after
  // Eos or MaxTokens the caller flushes it with the detokenizer's remainder.
  size_t send_bytes = 0;
};

StopDecision check_stop(const StopInputs& in);

}  // namespace granule
