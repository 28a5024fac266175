// Byte-level BPE: GPT-2's byte-to-character map, then each word's bytes merged by rank
// (tokenizer_merges.h).
#include "text/tokenizer_bpe.h"

#include "granule/error.h"
#include "granule/log.h"
#include "text/tokenizer_utf8.h"

namespace granule::detail {
namespace {

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68
// bytes get the code points 256, 257, ... in byte order, so every byte is a visible char.
bool stands_for_itself(int byte) {
  return (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
         (byte >= 0xAE && byte <= 0xFF);
}

}  // namespace

// Buffers reused across the words of one encode call.
struct ByteLevelBpeTokenizer::Scratch {
  BpeMerges::Scratch merge;
  std::string mapped;  // a word's stand-in characters (only for ignore_merges)
};

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer(Vocabulary vocab, const PreTokenizerSpec& spec)
    : VocabTokenizer(vocab, spec.add_bos),
      pre_tokenizer_(spec),
      ignore_merges_(spec.ignore_merges) {
  int next_extra = 256;
  for (int byte = 0; byte < 256; ++byte) {
    const uint32_t code_point =
        stands_for_itself(byte) ? static_cast<uint32_t>(byte) : static_cast<uint32_t>(next_extra++);
    utf8::append_codepoint(byte_chars_[static_cast<size_t>(byte)], code_point);
    char_bytes_[code_point] = static_cast<uint8_t>(byte);
  }

  if (vocab.merges.empty()) {
    throw FormatError(vocab.file_name +
                      ": tokenizer.ggml.merges is missing or empty (byte-level BPE needs it)");
  }
  merges_ = BpeMerges(vocab.merges, tokens_.size(),
                      [this](std::string_view text) { return lookup(text); });
  // A byte whose stand-in is no token may still be a merge part.
  for (int byte = 0; byte < 256; ++byte) {
    const std::string& text = byte_chars_[static_cast<size_t>(byte)];
    const auto id = lookup(text);
    byte_symbols_[static_cast<size_t>(byte)] = id ? *id : merges_.extra_id(text);
  }
}

void ByteLevelBpeTokenizer::encode_plain(std::string_view text, std::vector<TokenId>& out) const {
  Scratch scratch;
  for (std::string_view word : pre_tokenizer_.split(text)) encode_word(word, scratch, out);
}

void ByteLevelBpeTokenizer::encode_word(std::string_view word, Scratch& scratch,
                                        std::vector<TokenId>& out) const {
  if (ignore_merges_) {
    // Llama 3 style: a word that is a whole token is that token, whatever the merges say.
    scratch.mapped.clear();
    for (char c : word) scratch.mapped += byte_chars_[static_cast<uint8_t>(c)];
    if (auto id = lookup(scratch.mapped)) {
      out.push_back(*id);
      return;
    }
  }

  auto& symbols = scratch.merge.symbols;
  symbols.clear();
  const auto n = static_cast<int32_t>(word.size());
  for (int32_t i = 0; i < n; ++i) {
    symbols.push_back({byte_symbols_[static_cast<uint8_t>(word[static_cast<size_t>(i)])],
                       static_cast<uint32_t>(i), 1, i - 1, i + 1 < n ? i + 1 : -1});
  }
  merges_.merge(scratch.merge);
  for (int32_t i = 0; i >= 0 && i < n; i = symbols[static_cast<size_t>(i)].next) {
    emit_symbol(symbols[static_cast<size_t>(i)].id, out);
  }
}

void ByteLevelBpeTokenizer::emit_symbol(int32_t symbol, std::vector<TokenId>& out) const {
  if (symbol >= 0 && static_cast<size_t>(symbol) < tokens_.size()) {
    out.push_back(symbol);
    return;
  }
  // A byte or merge result that is no token (a vocabulary missing pieces): emit what its
  // characters are as tokens, else the unknown token, else nothing — as llama.cpp drops it.
  if (symbol < 0) {
    if (unk_) out.push_back(*unk_);
    return;
  }
  const std::string& text = merges_.extra_text(symbol);
  for (size_t pos = 0; pos < text.size();) {
    const size_t length = utf8::char_length(text, pos);
    if (auto id = lookup(std::string_view(text).substr(pos, length))) {
      out.push_back(*id);
    } else if (unk_) {
      out.push_back(*unk_);
    }
    pos += length;
  }
}

std::string ByteLevelBpeTokenizer::normal_piece(const std::string& text) const {
  // Each stand-in character back to its byte. A character outside the map (a token the
  // converter wrote as plain text) is kept as it is.
  std::string piece;
  piece.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const utf8::Step step = utf8::scan(text, pos);
    const size_t length = step.kind == utf8::Scan::Complete ? step.length : 1;
    const auto it = step.kind == utf8::Scan::Complete
                        ? char_bytes_.find(utf8::decode_codepoint(text, pos, length))
                        : char_bytes_.end();
    if (it != char_bytes_.end()) {
      piece += static_cast<char>(it->second);
    } else {
      piece.append(text, pos, length);
    }
    pos += length;
  }
  return piece;
}

}  // namespace granule::detail
