// A Constraint compiled against the model's vocabulary (xgrammar), and the per-sequence matcher
// that gives the allowed tokens of each step as a bitmask and follows the tokens drawn.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "granule/constraint.h"
#include "granule/tokenizer.h"

namespace granule {

// One sequence's constraint state. Not thread-safe; the engine thread drives it.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Fills `mask` (one bit per token id of the model's logits, 32 per word, bit set = allowed)
  // for the next token; returns whether it allows any (false: the constraint is stuck).
  virtual bool fill_mask(std::vector<uint32_t>& mask) = 0;
  // Follows a drawn token; false when the constraint does not allow it.
  virtual bool accept(TokenId token) = 0;
  // The constraint's text is complete: only an end-of-generation token may follow.
  virtual bool finished() const = 0;
};

// Compiles constraints for one vocabulary; compiled grammars are cached by source.
class ConstraintCompiler {
 public:
  // `n_vocab`: the logits' width (the embedding rows; may exceed the tokenizer's vocabulary).
  ConstraintCompiler(const Tokenizer& tokenizer, int64_t n_vocab);
  ~ConstraintCompiler();
  // Throws UsageError naming what is wrong with the schema, grammar or expression, and
  // UnsupportedError (kNoStructuredOutputMessage) in a build without xgrammar.
  std::unique_ptr<TokenConstraint> compile(const Constraint& constraint);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Sets every logit whose bit in `mask` is clear to -inf.
void apply_token_mask(std::span<float> logits, const std::vector<uint32_t>& mask);

}  // namespace granule
