// One request while the engine holds it: the one record the scheduler owns and plans over,
// and what the engine needs to sample, stop and stream it. As in vLLM's scheduler, there is
// no prefill or decode phase: a step computes a sequence's next uncomputed tokens, all of
// them the prompt at first, then the one token sampled last.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "granule/engine.h"
#include "granule/sampling.h"
#include "granule/tokenizer.h"
#include "runtime/token_constraint.h"

namespace granule {

struct Sequence {
  using Clock = std::chrono::steady_clock;

  Sequence(SequenceId id_, std::vector<TokenId> prompt, const SamplingParams& p)
      : id(id_),
        tokens(std::move(prompt)),
        prompt_tokens(static_cast<int64_t>(tokens.size())),
        params(p),
        sampler(p) {}

  // --- what the scheduler plans over
  SequenceId id = 0;
  std::vector<TokenId> tokens;  // the prompt, then every sampled token
  int64_t prompt_tokens = 0;    // the request's prompt, the first of `tokens`
  int64_t computed_tokens = 0;  // the first tokens whose KV is in the slot
  int32_t slot = -1;            // -1 while waiting for a slot (new, or preempted)
  int32_t preemptions = 0;      // times its KV was freed to make room, to be recomputed
  // KV reuse: the session it continues ("" none); at its first admission, the prompt tokens
  // whose KV was kept from an earlier sequence (of them, copied back from host memory).
  std::string session;
  int64_t reused_tokens = 0;
  int64_t swapped_in_tokens = 0;
  bool admitted_once = false;
  int32_t dropped_messages = 0;   // left out of the conversation to fit the context
  bool reasoning_opened = false;  // the prompt ends inside the model's reasoning (<think>)

  int64_t uncomputed_tokens() const {
    return static_cast<int64_t>(tokens.size()) - computed_tokens;
  }
  bool running() const { return slot >= 0; }

  // --- sampling and stopping
  SamplingParams params;
  std::vector<std::string> stop_strings;  // the request's, then the chat template's
  int64_t generated = 0;                  // tokens sampled (an end-of-generation one included)
  Sampler sampler;                        // the host's, where the backend does not sample
  bool cancel_requested = false;          // a sink asked during a step: ends after it
  int32_t top_logprobs = -1;              // Request::top_logprobs
  // Structured output (Request::constraint): the matcher, and the mask of the token the
  // current step predicts, filled while the device runs it (mask_ready), allowing any token
  // (mask_allowed) or none.
  std::unique_ptr<TokenConstraint> constraint;
  std::vector<uint32_t> mask;
  bool mask_ready = false;
  bool mask_allowed = false;

  // --- output
  TokenSink sink;
  std::optional<IncrementalDetokenizer> detokenizer;  // set by the engine
  std::string unsent_text;  // decoded but held back: it may begin a stop string
  Clock::time_point submitted;
  Clock::time_point first_token;
};

}  // namespace granule
