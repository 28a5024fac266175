// Gemma 4's tokenizer (tokenizer.ggml.model = "gemma4"): SentencePiece-style BPE on raw UTF-8.
// Spaces become "▁", the text splits only into runs of newlines and runs of everything else,
// each run's characters merge by the ranks of tokenizer.ggml.merges, and a piece that is no
// token falls back to its bytes' <0xXX> tokens. As llama.cpp's llm_tokenizer_bpe takes it
// with pre-tokenizer "gemma4" (src/llama-vocab.cpp).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "text/tokenizer_merges.h"
#include "text/tokenizer_vocab.h"

namespace granule::detail {

class Gemma4Tokenizer final : public VocabTokenizer {
 public:
  // Throws FormatError without merges. BOS is always added by default (llama.cpp overrides a
  // file's add_bos_token = false for this tokenizer).
  explicit Gemma4Tokenizer(Vocabulary vocab);

 protected:
  void encode_plain(std::string_view text, std::vector<TokenId>& out) const override;
  std::string normal_piece(const std::string& text) const override;

 private:
  struct Scratch;

  void encode_run(std::string_view run, Scratch& scratch, std::vector<TokenId>& out) const;
  // Symbol id of a text: its token id, or an id past the vocabulary for text that is no
  // token but a merge part or result; -1 for any other text.
  int32_t symbol_of(std::string_view text) const;
  // A finished piece: its token, else its bytes' <0xXX> tokens (a missing one is dropped).
  void emit(int32_t symbol, std::string_view text, std::vector<TokenId>& out) const;

  BpeMerges merges_;
  std::array<int32_t, 256> byte_tokens_{};  // byte -> its <0xXX> token, -1 if none
};

}  // namespace granule::detail
