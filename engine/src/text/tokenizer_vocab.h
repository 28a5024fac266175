// The vocabulary both tokenizer kinds share: reading tokenizer.ggml.* from a GGUF, the
// special-token ids and end-of-generation set, and the encode skeleton that cuts text at
// special tokens before the model-specific BPE sees it.
#pragma once
#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "granule/gguf.h"
#include "granule/tokenizer.h"

namespace granule::detail {

// tokenizer.ggml.* as the file has it (absent keys stay empty / nullopt).
struct Vocabulary {
  std::string file_name;            // for error messages
  std::string model;                // tokenizer.ggml.model
  std::string pre;                  // tokenizer.ggml.pre
  std::string general_name;         // general.name (some whitespace rules key on it)
  std::vector<std::string> tokens;  // tokenizer.ggml.tokens
  std::vector<float> scores;        // tokenizer.ggml.scores, empty when absent
  std::vector<int32_t> types;       // tokenizer.ggml.token_type, all Normal when absent
  std::vector<std::string> merges;  // tokenizer.ggml.merges ("left right")
  std::optional<TokenId> bos, eos, eot, eom, unk, pad;
  std::optional<bool> add_bos, add_eos, add_space_prefix;
};

// SentencePiece's mark for a space, "▁" (U+2581), as SentencePiece and Gemma 4's vocabularies
// spell spaces.
constexpr std::string_view kSpaceMark = "\xE2\x96\x81";

// `text` with every kSpaceMark turned back into a space.
std::string spaces_from_marks(const std::string& text);

// Reads and checks the vocabulary. Throws FormatError for a missing or malformed token
// list, or score / type arrays shorter than it. Out-of-range special ids are dropped with a
// warning (as llama.cpp does).
Vocabulary read_vocabulary(const ModelFile& file);

// Base of both tokenizers: owns the token table, finds special tokens in text, and hands
// the plain text between them to the subclass's BPE.
class VocabTokenizer : public Tokenizer {
 public:
  std::vector<TokenId> encode(std::string_view text, bool add_bos, bool parse_special) const final;
  // Special, byte and unused tokens render the same way in both models; normal tokens go
  // through the model's normal_piece.
  std::string token_to_piece(TokenId id, bool render_special) const final;

 protected:
  // Takes the vocabulary's tokens, types and ids. default_add_bos applies when the file
  // has no tokenizer.ggml.add_bos_token.
  VocabTokenizer(Vocabulary& vocab, bool default_add_bos);

  // Encodes text that holds no special token. Every such stretch starts the input or
  // follows a special token (SentencePiece puts its space prefix before each).
  virtual void encode_plain(std::string_view text, std::vector<TokenId>& out) const = 0;
  // The bytes a normal token's text stands for (the model's own spelling undone).
  virtual std::string normal_piece(const std::string& text) const = 0;

  bool has_attr(TokenId id, TokenAttr attr) const {
    return attrs_[static_cast<size_t>(id)] == static_cast<int32_t>(attr);
  }
  std::optional<TokenId> lookup(std::string_view text) const {
    const auto it = ids_by_text_.find(text);
    if (it == ids_by_text_.end()) return std::nullopt;
    return it->second;
  }
  // Throws UsageError for an id outside the vocabulary.
  void check_id(TokenId id) const;
  // The byte a byte token such as "<0x0A>" stands for.
  static std::optional<uint8_t> byte_of_token(std::string_view text);

 private:
  void find_end_of_generation_tokens();
  // The special token that starts at text[pos], longest first; only user-defined tokens
  // unless parse_special.
  std::optional<TokenId> special_at(std::string_view text, size_t pos, bool parse_special) const;

  // Which special tokens take the whitespace around them (see set_strip_flags).
  void set_strip_flags(const Vocabulary& vocab);

  // Control, user-defined and unknown tokens by their first byte, longest text first.
  std::array<std::vector<TokenId>, 256> specials_by_first_byte_;
  // Per token: kStripLeft / kStripRight (Hugging Face's added-token lstrip / rstrip).
  static constexpr uint8_t kStripLeft = 1, kStripRight = 2;
  std::vector<uint8_t> strip_;
};

}  // namespace granule::detail
