// Byte-level BPE (GPT-2 style, tokenizer.ggml.model = "gpt2"): the pre-tokenizer splits
// text into words, each word's bytes become GPT-2's printable stand-in characters, and the
// ranked merges of tokenizer.ggml.merges join them into tokens.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "text/tokenizer_merges.h"
#include "text/tokenizer_pretokenize.h"
#include "text/tokenizer_vocab.h"

namespace granule::detail {

class ByteLevelBpeTokenizer final : public VocabTokenizer {
 public:
  // Throws UnsupportedError for an unknown tokenizer.ggml.pre, FormatError without merges.
  ByteLevelBpeTokenizer(Vocabulary vocab, const PreTokenizerSpec& pre_tokenizer);

 protected:
  void encode_plain(std::string_view text, std::vector<TokenId>& out) const override;
  std::string normal_piece(const std::string& text) const override;

 private:
  struct Scratch;

  void encode_word(std::string_view word, Scratch& scratch, std::vector<TokenId>& out) const;
  void emit_symbol(int32_t symbol, std::vector<TokenId>& out) const;

  PreTokenizer pre_tokenizer_;
  bool ignore_merges_ = false;
  std::array<std::string, 256> byte_chars_;           // byte -> its stand-in (UTF-8)
  std::unordered_map<uint32_t, uint8_t> char_bytes_;  // stand-in code point -> byte
  std::array<int32_t, 256> byte_symbols_{};           // byte -> symbol id, -1 if none
  BpeMerges merges_;
};

}  // namespace granule::detail
