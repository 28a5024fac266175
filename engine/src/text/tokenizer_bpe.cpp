// Byte-level BPE: GPT-2's byte-to-character map, merge ranks as a hash of symbol-id pairs,
// and the merge loop over a linked list of symbols with a priority queue, O(n log n) per
// word however long the word is.
#include "text/tokenizer_bpe.h"

#include <queue>

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

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

// Buffers reused across the words of one encode call.
struct ByteLevelBpeTokenizer::Scratch {
  struct Symbol {
    int32_t id;    // symbol id; -1 once merged into its left neighbour
    int32_t prev;  // index of the previous live symbol, -1 at the start
    int32_t next;  // index of the next live symbol, -1 at the end
  };
  // A pair that may merge. Stale when either side has changed since it was queued.
  struct Candidate {
    int32_t rank;
    int32_t left;
    int32_t right;
    int32_t left_id;
    int32_t right_id;
    int32_t result;
  };
  // Lowest rank first; among equal ranks the leftmost pair, as GPT-2 and Hugging Face do.
  struct LaterFirst {
    bool operator()(const Candidate& a, const Candidate& b) const {
      return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    }
  };
  std::vector<Symbol> symbols;
  std::priority_queue<Candidate, std::vector<Candidate>, LaterFirst> queue;
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
  std::unordered_map<std::string, int32_t> extras;
  for (int byte = 0; byte < 256; ++byte) {
    const auto id = lookup(byte_chars_[static_cast<size_t>(byte)]);
    byte_symbols_[static_cast<size_t>(byte)] = id ? *id : -1;
  }
  merges_.reserve(vocab.merges.size());
  for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
    const std::string& merge = vocab.merges[rank];
    // Split at the first space after the first character: a part may not hold a space
    // (byte-level text has none), but llama.cpp searches from 1 all the same.
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos) continue;
    const std::string left = merge.substr(0, space);
    const std::string right = merge.substr(space + 1);
    const int32_t left_id = intern(left, extras);
    const int32_t right_id = intern(right, extras);
    const int32_t result = intern(left + right, extras);
    // The first rule for a pair wins, like llama.cpp's emplace.
    merges_.emplace(pair_key(left_id, right_id), MergeRule{static_cast<int32_t>(rank), result});
  }
  // A byte whose stand-in is no token may still be a merge part.
  for (int byte = 0; byte < 256; ++byte) {
    auto& symbol = byte_symbols_[static_cast<size_t>(byte)];
    if (symbol < 0) {
      const auto it = extras.find(byte_chars_[static_cast<size_t>(byte)]);
      if (it != extras.end()) symbol = it->second;
    }
  }
}

int32_t ByteLevelBpeTokenizer::intern(const std::string& text,
                                      std::unordered_map<std::string, int32_t>& extras) {
  if (auto id = lookup(text)) return *id;
  const auto [it, inserted] =
      extras.emplace(text, static_cast<int32_t>(tokens_.size() + extra_symbols_.size()));
  if (inserted) extra_symbols_.push_back(text);
  return it->second;
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

  auto& symbols = scratch.symbols;
  symbols.clear();
  const auto n = static_cast<int32_t>(word.size());
  for (int32_t i = 0; i < n; ++i) {
    symbols.push_back({byte_symbols_[static_cast<uint8_t>(word[static_cast<size_t>(i)])], i - 1,
                       i + 1 < n ? i + 1 : -1});
  }

  auto& queue = scratch.queue;
  auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const int32_t left_id = symbols[static_cast<size_t>(left)].id;
    const int32_t right_id = symbols[static_cast<size_t>(right)].id;
    if (left_id < 0 || right_id < 0) return;
    const auto it = merges_.find(pair_key(left_id, right_id));
    if (it == merges_.end()) return;
    queue.push({it->second.rank, left, right, left_id, right_id, it->second.result});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i, i + 1);

  while (!queue.empty()) {
    const Scratch::Candidate candidate = queue.top();
    queue.pop();
    auto& left = symbols[static_cast<size_t>(candidate.left)];
    auto& right = symbols[static_cast<size_t>(candidate.right)];
    if (left.id != candidate.left_id || right.id != candidate.right_id ||
        left.next != candidate.right) {
      continue;  // one side has merged since this pair was queued
    }
    left.id = candidate.result;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = candidate.left;
    right.id = -1;
    right.next = right.prev = -1;
    consider(left.prev, candidate.left);
    consider(candidate.left, left.next);
  }

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
  const std::string& text = extra_symbols_[static_cast<size_t>(symbol) - tokens_.size()];
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
