// Constraints compiled with xgrammar (its C++ core, fetched by setup.sh xgrammar): the
// vocabulary as raw bytes (each token's piece; control tokens never allowed as text, only as
// a structural tag's token), the model's end-of-generation tokens as the tokens that end a
// complete text.
#include "runtime/token_constraint.h"

#include <algorithm>
#include <limits>
#include <map>
#include <mutex>

#include "granule/error.h"

#ifdef GRANULE_HAVE_XGRAMMAR
#include <xgrammar/xgrammar.h>
#endif

namespace granule {

const char* constraint_kind_name(ConstraintKind kind) {
  switch (kind) {
    case ConstraintKind::None:
      return "none";
    case ConstraintKind::JsonObject:
      return "json_object";
    case ConstraintKind::JsonSchema:
      return "json_schema";
    case ConstraintKind::Grammar:
      return "grammar";
    case ConstraintKind::Regex:
      return "regex";
    case ConstraintKind::StructuralTag:
      return "structural_tag";
  }
  return "unknown";
}

void apply_token_mask(std::span<float> logits, const std::vector<uint32_t>& mask) {
  const float minus_infinity = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    const size_t word = i >> 5;
    if (word >= mask.size() || !((mask[word] >> (i & 31)) & 1u)) logits[i] = minus_infinity;
  }
}

#ifdef GRANULE_HAVE_XGRAMMAR

bool structured_output_available() { return true; }

namespace {

class XgrammarConstraint final : public TokenConstraint {
 public:
  XgrammarConstraint(const xgrammar::CompiledGrammar& grammar, int64_t n_vocab)
      : matcher_(grammar), n_vocab_(n_vocab) {}

  bool fill_mask(std::vector<uint32_t>& mask) override {
    const auto words = static_cast<size_t>(xgrammar::GetBitmaskSize(static_cast<int>(n_vocab_)));
    mask.assign(words, 0);
    int64_t shape[1] = {static_cast<int64_t>(words)};
    DLTensor tensor{};
    tensor.data = mask.data();
    tensor.device = DLDevice{kDLCPU, 0};
    tensor.ndim = 1;
    tensor.dtype = xgrammar::GetBitmaskDLType();
    tensor.shape = shape;
    tensor.strides = nullptr;
    tensor.byte_offset = 0;
    matcher_.FillNextTokenBitmask(&tensor);
    // Whether any bit is set, not how many: a count of 4,008 words (a 128k vocabulary) took
    // ~30 us a mask through libgcc's popcount (the build targets x86-64 without POPCNT), twice
    // xgrammar's own time for the synthetic 8B model's masks.
    return std::any_of(mask.begin(), mask.end(), [](uint32_t w) { return w != 0; });
  }

  bool accept(TokenId token) override { return matcher_.AcceptToken(token); }
  bool finished() const override { return matcher_.IsTerminated(); }

 private:
  xgrammar::GrammarMatcher matcher_;
  int64_t n_vocab_;
};

}  // namespace

struct ConstraintCompiler::Impl {
  const Tokenizer& tokenizer;
  int64_t n_vocab;
  std::unique_ptr<xgrammar::GrammarCompiler> compiler;  // built at the first constraint

  xgrammar::GrammarCompiler& get() {
    if (compiler) return *compiler;
    std::vector<std::string> vocab(static_cast<size_t>(n_vocab));
    const auto known = static_cast<TokenId>(
        std::min<int64_t>(n_vocab, static_cast<int64_t>(tokenizer.vocab_size())));
    for (TokenId id = 0; id < known; ++id) {
      const TokenAttr attr = tokenizer.token_attr(id);
      if ((attr == TokenAttr::Control && !tokenizer.is_end_of_generation(id)) ||
          attr == TokenAttr::Unused) {
        // A byte no UTF-8 text holds, then its name: no text grammar ever allows it, a
        // structural tag's {"type": "token", "token": ID} does (harmony's <|constrain|> and
        // <|message|> in a forced call's header). Unused tokens too, rather than "": xgrammar
        // takes every "" for a special token, clears each one's bit in every mask and looks
        // each accepted token up among them (a vocabulary padded with 127k unused tokens, as
        // the synthetic 8B model's is, then costs ~230 us a mask and ~25 us an accept).
        vocab[static_cast<size_t>(id)] = "\xff" + tokenizer.token_text(id);
        continue;
      }
      if (attr == TokenAttr::Control || attr == TokenAttr::Unknown)
        continue;  // "": xgrammar never allows it
      vocab[static_cast<size_t>(id)] = tokenizer.token_to_piece(id);
    }
    std::vector<int32_t> stops;
    for (TokenId id : tokenizer.end_of_generation_tokens())
      if (id >= 0 && id < n_vocab) stops.push_back(id);
    xgrammar::TokenizerInfo info(vocab, xgrammar::VocabType::RAW, static_cast<int>(n_vocab), stops,
                                 false);
    // Compiling uses a few threads; the cache keeps every compiled schema by its text.
    compiler = std::make_unique<xgrammar::GrammarCompiler>(info, 4, true, 256ll << 20);
    return *compiler;
  }
};

ConstraintCompiler::ConstraintCompiler(const Tokenizer& tokenizer, int64_t n_vocab)
    : impl_(new Impl{tokenizer, n_vocab, nullptr}) {}
ConstraintCompiler::~ConstraintCompiler() = default;

std::unique_ptr<TokenConstraint> ConstraintCompiler::compile(const Constraint& constraint) {
  if (!constraint.active()) return nullptr;
  xgrammar::GrammarCompiler& compiler = impl_->get();
  // Compact JSON (no free whitespace): a small model otherwise fills a reply with spaces and
  // newlines, which a schema allows anywhere between tokens.
  constexpr bool kAnyWhitespace = false;
  try {
    switch (constraint.kind) {
      case ConstraintKind::JsonObject:
        return std::make_unique<XgrammarConstraint>(
            compiler.CompileJSONSchema(R"({"type":"object"})", kAnyWhitespace), impl_->n_vocab);
      case ConstraintKind::JsonSchema:
        return std::make_unique<XgrammarConstraint>(
            compiler.CompileJSONSchema(constraint.source, kAnyWhitespace), impl_->n_vocab);
      case ConstraintKind::Grammar:
        return std::make_unique<XgrammarConstraint>(compiler.CompileGrammar(constraint.source),
                                                    impl_->n_vocab);
      case ConstraintKind::Regex:
        return std::make_unique<XgrammarConstraint>(compiler.CompileRegex(constraint.source),
                                                    impl_->n_vocab);
      case ConstraintKind::StructuralTag:
        return std::make_unique<XgrammarConstraint>(
            compiler.CompileStructuralTag(constraint.source), impl_->n_vocab);
      case ConstraintKind::None:
        break;
    }
  } catch (const std::exception& e) {
    std::string what = e.what();
    // xgrammar's messages may run over several lines: the first says what is wrong.
    if (const auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
    // ... and begins with its log prefix, "[time] path/file.cc:line: ".
    if (what.starts_with("[")) {
      if (const auto at = what.find(".cc:"); at != std::string::npos) {
        if (const auto colon = what.find(": ", at); colon != std::string::npos)
          what.erase(0, colon + 2);
      }
    }
    throw UsageError(std::string("invalid ") + constraint_kind_name(constraint.kind) + ": " + what);
  }
  return nullptr;
}

#else  // no xgrammar

bool structured_output_available() { return false; }

struct ConstraintCompiler::Impl {};

ConstraintCompiler::ConstraintCompiler(const Tokenizer&, int64_t) {}
ConstraintCompiler::~ConstraintCompiler() = default;

std::unique_ptr<TokenConstraint> ConstraintCompiler::compile(const Constraint& constraint) {
  if (!constraint.active()) return nullptr;
  throw UnsupportedError(kNoStructuredOutputMessage);
}

#endif

}  // namespace granule
