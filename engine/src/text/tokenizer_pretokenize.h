// The pre-tokenizer of byte-level BPE: the chain of PCRE2 regexes that tokenizer.ggml.pre
// names, splitting text into the words that BPE merges within.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace granule::detail {

// What a pre-tokenizer name stands for: its regexes, applied in order, and the flags
// llama.cpp sets with it.
struct PreTokenizerSpec {
  std::vector<std::string> regexes;
  bool ignore_merges = false;  // a word that is a whole token is taken as it is (Llama 3)
  bool add_bos = false;        // default of tokenizer.ggml.add_bos_token for this family
};

// The spec for tokenizer.ggml.pre; an empty name gives llama.cpp's "default" set (with a
// warning, as llama.cpp does). Throws UnsupportedError naming an unknown pre-tokenizer.
PreTokenizerSpec pre_tokenizer_spec(std::string_view pre_name);

class PreTokenizer {
 public:
  // Compiles every regex (UTF-8 and Unicode-property mode, JIT when available).
  explicit PreTokenizer(const PreTokenizerSpec& spec);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Splits text into words, views into `text` that cover it in order. Each regex splits
  // every word the previous one left: its matches become words, and so does the text
  // between matches (Hugging Face's "Isolated" split). Thread-safe.
  std::vector<std::string_view> split(std::string_view text) const;

 private:
  class CompiledRegex;
  std::vector<std::unique_ptr<CompiledRegex>> chain_;
};

}  // namespace granule::detail
