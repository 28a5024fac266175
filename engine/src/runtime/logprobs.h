// The log-probabilities the engine reports with a generated token (Request::top_logprobs):
// log-softmax of the raw logits row, the chosen token's and the most likely ones'.
#pragma once
#include <cstdint>
#include <span>

#include "granule/engine.h"
#include "granule/tokenizer.h"

namespace granule {

// `token`'s entry and the `top` most likely tokens (equal logits in id order, as the greedy
// sampler breaks ties), their pieces rendered by `tokenizer`.
TokenLogprobs token_logprobs(std::span<const float> row, int32_t token, int32_t top,
                             const Tokenizer& tokenizer);

}  // namespace granule
