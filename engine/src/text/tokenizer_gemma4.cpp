// Gemma 4's SentencePiece-style BPE: "▁" for spaces, newline runs apart, merges by rank over
// the run's UTF-8 characters (tokenizer_merges.h), byte fallback.
#include "text/tokenizer_gemma4.h"

#include <algorithm>

#include "granule/error.h"

namespace granule::detail {
namespace {

// llama.cpp's unicode_len_utf8: the length a lead byte announces (1 for a stray continuation
// byte), cut at the end of the text.
size_t char_length(std::string_view text, size_t pos) {
  const auto lead = static_cast<uint8_t>(text[pos]);
  size_t length = 1;
  if ((lead & 0xE0) == 0xC0) {
    length = 2;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4;
  }
  return std::min(length, text.size() - pos);
}

// llama.cpp turns add_bos on for this tokenizer whatever the file says.
Vocabulary& with_bos(Vocabulary& vocab) {
  vocab.add_bos = true;
  if (vocab.pre.empty()) vocab.pre = "gemma4";  // the name llama.cpp gives it
  return vocab;
}

}  // namespace

struct Gemma4Tokenizer::Scratch {
  BpeMerges::Scratch merge;
  std::string escaped;
};

Gemma4Tokenizer::Gemma4Tokenizer(Vocabulary vocab) : VocabTokenizer(with_bos(vocab), true) {
  if (vocab.merges.empty()) {
    throw FormatError(
        vocab.file_name +
        ": tokenizer.ggml.merges is missing or empty (the gemma4 tokenizer needs it)");
  }
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int byte = 0; byte < 256; ++byte) {
    const std::string text = {'<', '0', 'x', kHex[byte >> 4], kHex[byte & 15], '>'};
    const auto id = lookup(text);
    byte_tokens_[static_cast<size_t>(byte)] = id ? *id : -1;
  }
  merges_ = BpeMerges(vocab.merges, tokens_.size(),
                      [this](std::string_view text) { return lookup(text); });
}

int32_t Gemma4Tokenizer::symbol_of(std::string_view text) const {
  if (auto id = lookup(text)) return *id;
  return merges_.extra_id(text);
}

void Gemma4Tokenizer::encode_plain(std::string_view text, std::vector<TokenId>& out) const {
  Scratch scratch;
  std::string& escaped = scratch.escaped;
  escaped.reserve(text.size() + text.size() / 2);
  for (char c : text) {
    if (c == ' ')
      escaped += kSpaceMark;
    else
      escaped += c;
  }
  // Runs of newlines and runs of anything else ("[^\n]+|[\n]+").
  for (size_t pos = 0; pos < escaped.size();) {
    const bool newlines = escaped[pos] == '\n';
    size_t end = pos;
    while (end < escaped.size() && (escaped[end] == '\n') == newlines) ++end;
    encode_run(std::string_view(escaped).substr(pos, end - pos), scratch, out);
    pos = end;
  }
}

void Gemma4Tokenizer::encode_run(std::string_view run, Scratch& scratch,
                                 std::vector<TokenId>& out) const {
  // A run of newlines that is a token is that token whatever the merges say (llama.cpp's
  // Gemma 4 fix; the merges never join newlines).
  if (run.front() == '\n') {
    if (auto id = lookup(run)) {
      out.push_back(*id);
      return;
    }
  }
  auto& symbols = scratch.merge.symbols;
  symbols.clear();
  for (size_t pos = 0; pos < run.size();) {
    const size_t length = char_length(run, pos);
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({symbol_of(run.substr(pos, length)), static_cast<uint32_t>(pos),
                       static_cast<uint32_t>(length), index - 1, -1});
    if (index > 0) symbols[static_cast<size_t>(index - 1)].next = index;
    pos += length;
  }

  merges_.merge(scratch.merge);
  const auto n = static_cast<int32_t>(symbols.size());
  for (int32_t i = 0; i >= 0 && i < n; i = symbols[static_cast<size_t>(i)].next) {
    const auto& s = symbols[static_cast<size_t>(i)];
    emit(s.id, run.substr(s.begin, s.length), out);
  }
}

void Gemma4Tokenizer::emit(int32_t symbol, std::string_view text, std::vector<TokenId>& out) const {
  if (symbol >= 0 && static_cast<size_t>(symbol) < tokens_.size()) {
    out.push_back(symbol);
    return;
  }
  for (char c : text) {
    const int32_t id = byte_tokens_[static_cast<uint8_t>(c)];
    if (id >= 0) out.push_back(id);
  }
}

std::string Gemma4Tokenizer::normal_piece(const std::string& text) const {
  return spaces_from_marks(text);
}

}  // namespace granule::detail
