// Tokenizers built from GGUF metadata: byte-level BPE (GPT-2 style, pre-tokenizer regex
// chosen by tokenizer.ggml.pre, through PCRE2) and SentencePiece-style BPE
// (tokenizer.ggml.model = llama). Plus an incremental detokenizer.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "granule/gguf.h"

namespace granule {

using TokenId = int32_t;

enum class TokenAttr : int32_t {   // tokenizer.ggml.token_type values
  Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6,
};

class Tokenizer {
 public:
  // Throws UnsupportedError for an unknown tokenizer model or pre-tokenizer,
  // FormatError for missing or inconsistent vocabulary arrays.
  static std::unique_ptr<Tokenizer> from_gguf(const ModelFile& file);
  virtual ~Tokenizer() = default;

  // Encodes text. add_bos: prepend BOS (when the vocab has one). parse_special: treat the
  // text of control tokens ("<|im_start|>") as those tokens; user-defined tokens are
  // matched either way (llama.cpp and Hugging Face do the same). Thread-safe.
  virtual std::vector<TokenId> encode(std::string_view text, bool add_bos,
                                      bool parse_special) const = 0;
  // The raw bytes a token stands for ("▁" turned into a space, <0xXX> into its byte);
  // control tokens give "" unless render_special. Throws UsageError for an unknown id.
  virtual std::string token_to_piece(TokenId id, bool render_special = false) const = 0;
  // Decodes a whole sequence (first-token space prefix handled for SentencePiece).
  std::string decode(const std::vector<TokenId>& ids, bool render_special = false) const;

  size_t vocab_size() const { return tokens_.size(); }
  const std::string& token_text(TokenId id) const { return tokens_.at(static_cast<size_t>(id)); }
  TokenAttr token_attr(TokenId id) const;
  std::optional<TokenId> find_token(std::string_view text) const;
  std::string model_name() const { return model_; }   // "gpt2" or "llama"
  std::string pre_name() const { return pre_; }       // "smollm", "llama-bpe", ...

  std::optional<TokenId> bos() const { return bos_; }
  std::optional<TokenId> eos() const { return eos_; }
  std::optional<TokenId> eot() const { return eot_; }
  std::optional<TokenId> eom() const { return eom_; }
  std::optional<TokenId> unknown() const { return unk_; }
  std::optional<TokenId> padding() const { return pad_; }
  bool add_bos_by_default() const { return add_bos_; }
  bool add_eos_by_default() const { return add_eos_; }
  // SentencePiece: encode() puts a space before the text (and after each special token);
  // decode() takes it off the first token again.
  bool adds_space_prefix() const { return add_space_prefix_; }
  // End-of-generation: EOS, EOT and other end tokens (<|im_end|>, <|eot_id|>, <end_of_turn>).
  bool is_end_of_generation(TokenId id) const;
  const std::vector<TokenId>& end_of_generation_tokens() const { return eog_; }

 protected:
  // Hashes std::string and std::string_view alike, so lookups need no temporary string.
  struct TextHash {
    using is_transparent = void;
    size_t operator()(std::string_view text) const noexcept {
      return std::hash<std::string_view>{}(text);
    }
  };

  std::string model_;
  std::string pre_;
  std::vector<std::string> tokens_;
  std::vector<int32_t> attrs_;
  std::unordered_map<std::string, TokenId, TextHash, std::equal_to<>> ids_by_text_;
  std::optional<TokenId> bos_, eos_, eot_, eom_, unk_, pad_;
  bool add_bos_ = false;
  bool add_eos_ = false;
  bool add_space_prefix_ = false;
  std::vector<TokenId> eog_;
};

// Turns a stream of token ids into UTF-8 text, holding back bytes until a character is
// complete, so it never emits half a UTF-8 sequence.
class IncrementalDetokenizer {
 public:
  // render_special: control tokens show as their text (as in token_to_piece).
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool render_special = false)
      : tokenizer_(tokenizer), render_special_(render_special) {}
  std::string push(TokenId id);   // complete characters now available (maybe "")
  std::string flush();            // whatever is held back (invalid bytes become U+FFFD)
  void reset();

 private:
  const Tokenizer& tokenizer_;
  std::string pending_;
  bool first_ = true;
  bool render_special_ = false;
};

}  // namespace granule
