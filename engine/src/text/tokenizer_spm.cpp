// SentencePiece BPE as llama.cpp runs it: characters as a linked list, every adjacent pair
// whose text is a token queued by that token's score, the best pair merged first (leftmost
// among equals) until no pair is a token; leftovers become byte tokens.
#include "text/tokenizer_spm.h"

#include <algorithm>
#include <queue>

#include "text/tokenizer_utf8.h"

namespace granule::detail {
namespace {

struct Symbol {
  uint32_t begin;   // byte offset in the normalized text
  uint32_t length;  // 0 once merged into its left neighbour
  int32_t prev;
  int32_t next;
};

struct Candidate {
  float score;
  int32_t left;
  int32_t right;
  uint32_t length;  // bytes of the merged text, to spot a pair that went stale
};

// Highest score first; among equal scores the leftmost pair.
struct LowerFirst {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(Vocabulary vocab)
    : VocabTokenizer(vocab, /*default_add_bos=*/true) {
  // Llama defaults when the file names none (llama.cpp's): <unk> 0, <s> 1, </s> 2.
  const auto in_range = [&](TokenId id) { return static_cast<size_t>(id) < tokens_.size(); };
  if (!vocab.bos && in_range(1)) bos_ = 1;
  if (!vocab.eos && in_range(2)) eos_ = 2;
  if (!vocab.unk && in_range(0)) unk_ = 0;
  if (!vocab.eos && eos_ && std::find(eog_.begin(), eog_.end(), *eos_) == eog_.end()) {
    eog_.insert(std::lower_bound(eog_.begin(), eog_.end(), *eos_), *eos_);
  }
  add_space_prefix_ = vocab.add_space_prefix.value_or(true);

  scores_ = std::move(vocab.scores);
  scores_.resize(tokens_.size(), 0.0f);
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (!has_attr(static_cast<TokenId>(i), TokenAttr::Byte)) continue;
    if (auto byte = byte_of_token(tokens_[i])) byte_tokens_[*byte] = static_cast<TokenId>(i);
  }
}

void SentencePieceTokenizer::encode_plain(std::string_view text, std::vector<TokenId>& out) const {
  std::string normalized;
  normalized.reserve(text.size() + text.size() / 2 + kSpaceMark.size());
  if (add_space_prefix_) normalized += kSpaceMark;
  for (char c : text) {
    if (c == ' ') {
      normalized += kSpaceMark;
    } else {
      normalized += c;
    }
  }
  const std::string_view view = normalized;

  std::vector<Symbol> symbols;
  symbols.reserve(view.size());
  for (size_t pos = 0; pos < view.size();) {
    const size_t length = utf8::char_length(view, pos);
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({static_cast<uint32_t>(pos), static_cast<uint32_t>(length), index - 1,
                       pos + length < view.size() ? index + 1 : -1});
    pos += length;
  }

  std::priority_queue<Candidate, std::vector<Candidate>, LowerFirst> queue;
  auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& a = symbols[static_cast<size_t>(left)];
    const Symbol& b = symbols[static_cast<size_t>(right)];
    const std::string_view merged = view.substr(a.begin, a.length + b.length);
    const auto id = matchable_token(merged);
    if (!id) return;
    queue.push(
        {scores_[static_cast<size_t>(*id)], left, right, static_cast<uint32_t>(merged.size())});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) consider(i - 1, i);

  while (!queue.empty()) {
    const Candidate candidate = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(candidate.left)];
    Symbol& right = symbols[static_cast<size_t>(candidate.right)];
    if (left.length == 0 || right.length == 0 || left.next != candidate.right ||
        left.length + right.length != candidate.length) {
      continue;  // a side has merged since this pair was queued
    }
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = candidate.left;
    consider(left.prev, candidate.left);
    consider(candidate.left, left.next);
  }

  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[static_cast<size_t>(i)].next) {
    const Symbol& symbol = symbols[static_cast<size_t>(i)];
    emit_piece(view.substr(symbol.begin, symbol.length), out);
  }
}

void SentencePieceTokenizer::emit_piece(std::string_view piece, std::vector<TokenId>& out) const {
  if (auto id = matchable_token(piece)) {
    out.push_back(*id);
    return;
  }
  // A character no token covers: its bytes as <0xXX> tokens (SentencePiece's byte
  // fallback); a vocabulary without byte tokens gets one unknown token instead.
  bool all_bytes = true;
  for (char c : piece) all_bytes = all_bytes && byte_tokens_[static_cast<uint8_t>(c)].has_value();
  if (all_bytes) {
    for (char c : piece) out.push_back(*byte_tokens_[static_cast<uint8_t>(c)]);
  } else if (unk_) {
    out.push_back(*unk_);
  }
}

std::string SentencePieceTokenizer::normal_piece(const std::string& text) const {
  return spaces_from_marks(text);
}

}  // namespace granule::detail
