// Tokenizer's public side: choosing the implementation for a GGUF's tokenizer.ggml.model,
// whole-sequence decoding, token lookups, and the incremental detokenizer that never
// emits half a UTF-8 character.
#include "granule/tokenizer.h"

#include <algorithm>

#include "granule/error.h"
#include "text/tokenizer_bpe.h"
#include "text/tokenizer_gemma4.h"
#include "text/tokenizer_spm.h"
#include "text/tokenizer_utf8.h"
#include "text/tokenizer_vocab.h"

namespace granule {

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const ModelFile& file) {
  detail::Vocabulary vocab = detail::read_vocabulary(file);
  if (vocab.model == "gpt2") {
    // The pre-tokenizer is resolved first, so an unknown one fails before any work.
    const detail::PreTokenizerSpec spec = detail::pre_tokenizer_spec(vocab.pre);
    return std::make_unique<detail::ByteLevelBpeTokenizer>(std::move(vocab), spec);
  }
  if (vocab.model == "llama") {
    return std::make_unique<detail::SentencePieceTokenizer>(std::move(vocab));
  }
  if (vocab.model == "gemma4") {
    return std::make_unique<detail::Gemma4Tokenizer>(std::move(vocab));
  }
  throw UnsupportedError("unsupported tokenizer '" + vocab.model + "' in " +
                         file.path().filename().string() +
                         " (tokenizer.ggml.model); supported: gpt2 (byte-level BPE), "
                         "llama (SentencePiece BPE), gemma4 (SentencePiece-style BPE)");
}

std::string Tokenizer::decode(const std::vector<TokenId>& ids, bool render_special) const {
  std::string text;
  // SentencePiece put a space before the text; the first token after an optional leading
  // BOS gives it back. (llama.cpp keeps that space when the sequence starts with BOS; taking
  // it off makes decode(encode(s, add_bos)) == s either way.)
  bool strip_space = add_space_prefix_;
  for (size_t i = 0; i < ids.size(); ++i) {
    std::string piece = token_to_piece(ids[i], render_special);
    if (strip_space && !(i == 0 && bos_ && ids[i] == *bos_)) {
      if (!piece.empty() && piece.front() == ' ') piece.erase(0, 1);
      strip_space = false;
    }
    text += piece;
  }
  return text;
}

TokenAttr Tokenizer::token_attr(TokenId id) const {
  return static_cast<TokenAttr>(attrs_.at(static_cast<size_t>(id)));
}

std::optional<TokenId> Tokenizer::find_token(std::string_view text) const {
  const auto it = ids_by_text_.find(text);
  if (it == ids_by_text_.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::is_end_of_generation(TokenId id) const {
  return std::binary_search(eog_.begin(), eog_.end(), id);
}

std::string IncrementalDetokenizer::push(TokenId id) {
  std::string piece = tokenizer_.token_to_piece(id, render_special_);
  // The same first-token rule as Tokenizer::decode, so the pieces add up to decode().
  if (first_ && !(tokenizer_.bos() && id == *tokenizer_.bos())) {
    if (tokenizer_.adds_space_prefix() && !piece.empty() && piece.front() == ' ') {
      piece.erase(0, 1);
    }
    first_ = false;
  }
  pending_ += piece;

  // Emit every complete character; replace bytes that can never form one; keep a
  // character cut off at the end until the next token completes it.
  std::string ready;
  size_t pos = 0;
  while (pos < pending_.size()) {
    const utf8::Step step = utf8::scan(pending_, pos);
    if (step.kind == utf8::Scan::Truncated) break;
    if (step.kind == utf8::Scan::Complete) {
      ready.append(pending_, pos, step.length);
    } else {
      ready += utf8::kReplacementCharacter;
    }
    pos += step.length;
  }
  pending_.erase(0, pos);
  return ready;
}

std::string IncrementalDetokenizer::flush() {
  std::string rest;
  for (size_t pos = 0; pos < pending_.size();) {
    const utf8::Step step = utf8::scan(pending_, pos);
    if (step.kind == utf8::Scan::Complete) {
      rest.append(pending_, pos, step.length);
    } else {
      rest += utf8::kReplacementCharacter;
    }
    pos += step.length;
  }
  pending_.clear();
  return rest;
}

void IncrementalDetokenizer::reset() {
  pending_.clear();
  first_ = true;
}

}  // namespace granule
