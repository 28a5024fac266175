// Gemma 4's SentencePiece-style BPE: "▁" for spaces, newline runs apart, merges by rank over
// the run's UTF-8 characters (a priority queue over a linked list of symbols), byte fallback.
#include "text/tokenizer_gemma4.h"

#include <algorithm>
#include <queue>

#include "granule/error.h"

namespace granule::detail {
namespace {

constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // "▁", U+2581

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

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
  struct Symbol {
    int32_t id;      // symbol id, -1 for text that is no symbol; stays for a merged-away one
    uint32_t begin;  // the symbol's bytes in the run
    uint32_t length;
    int32_t prev, next;  // live neighbours, -1 at the ends
  };
  struct Candidate {
    int32_t rank, left, right, left_id, right_id, result;
  };
  // Lowest rank first; among equal ranks the leftmost pair (llama.cpp's llm_bigram_bpe order).
  struct LaterFirst {
    bool operator()(const Candidate& a, const Candidate& b) const {
      return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    }
  };
  std::vector<Symbol> symbols;
  std::priority_queue<Candidate, std::vector<Candidate>, LaterFirst> queue;
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
  merges_.reserve(vocab.merges.size());
  for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
    const std::string& merge = vocab.merges[rank];
    // Split at the first space after the first byte, as llama.cpp does.
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos) continue;
    const std::string left = merge.substr(0, space);
    const std::string right = merge.substr(space + 1);
    const int32_t left_id = intern(left);
    const int32_t right_id = intern(right);
    const int32_t result = intern(left + right);
    // The first rule for a pair wins, like llama.cpp's emplace.
    merges_.emplace(pair_key(left_id, right_id), MergeRule{static_cast<int32_t>(rank), result});
  }
}

int32_t Gemma4Tokenizer::intern(const std::string& text) {
  if (auto id = lookup(text)) return *id;
  const auto [it, inserted] =
      extra_ids_.emplace(text, static_cast<int32_t>(tokens_.size() + extra_symbols_.size()));
  if (inserted) extra_symbols_.push_back(text);
  return it->second;
}

int32_t Gemma4Tokenizer::symbol_of(std::string_view text) const {
  if (auto id = lookup(text)) return *id;
  const auto it = extra_ids_.find(std::string(text));
  return it == extra_ids_.end() ? -1 : it->second;
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
  auto& symbols = scratch.symbols;
  symbols.clear();
  for (size_t pos = 0; pos < run.size();) {
    const size_t length = char_length(run, pos);
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({symbol_of(run.substr(pos, length)), static_cast<uint32_t>(pos),
                       static_cast<uint32_t>(length), index - 1, -1});
    if (index > 0) symbols[static_cast<size_t>(index - 1)].next = index;
    pos += length;
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
  const auto n = static_cast<int32_t>(symbols.size());
  for (int32_t i = 0; i + 1 < n; ++i) consider(i, i + 1);

  while (!queue.empty()) {
    const Scratch::Candidate c = queue.top();
    queue.pop();
    auto& left = symbols[static_cast<size_t>(c.left)];
    auto& right = symbols[static_cast<size_t>(c.right)];
    if (left.length == 0 || right.length == 0 || left.id != c.left_id || right.id != c.right_id ||
        left.next != c.right) {
      continue;  // one side has merged since this pair was queued
    }
    left.id = c.result;
    left.length += right.length;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = c.left;
    right.length = 0;
    right.id = -1;
    consider(left.prev, c.left);
    consider(c.left, left.next);
  }

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
  std::string piece;
  piece.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    if (std::string_view(text).substr(pos).starts_with(kSpaceMark)) {
      piece += ' ';
      pos += kSpaceMark.size();
    } else {
      piece += text[pos++];
    }
  }
  return piece;
}

}  // namespace granule::detail
