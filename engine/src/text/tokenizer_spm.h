// SentencePiece-style BPE (tokenizer.ggml.model = "llama"): spaces become "▁", a space is
// put before the text, adjacent pieces merge by the highest token score, and characters no
// token covers fall back to <0xXX> byte tokens.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "text/tokenizer_vocab.h"

namespace granule::detail {

class SentencePieceTokenizer final : public VocabTokenizer {
 public:
  explicit SentencePieceTokenizer(Vocabulary vocab);


 protected:
  void encode_plain(std::string_view text, std::vector<TokenId>& out) const override;
  std::string normal_piece(const std::string& text) const override;

 private:
  // Whether text may turn into this token: normal and user-defined pieces only, so that
  // typed text never becomes a control token such as "<s>" (SentencePiece keeps control
  // pieces out of its matcher).
  bool matchable(TokenId id) const {
    return has_attr(id, TokenAttr::Normal) || has_attr(id, TokenAttr::UserDefined);
  }
  std::optional<TokenId> matchable_token(std::string_view text) const {
    auto id = lookup(text);
    if (id && !matchable(*id)) id.reset();
    return id;
  }
  void emit_piece(std::string_view piece, std::vector<TokenId>& out) const;

  std::vector<float> scores_;
  std::array<std::optional<TokenId>, 256> byte_tokens_;
};

}  // namespace granule::detail
