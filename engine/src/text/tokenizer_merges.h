// BPE by merge rank, as both BPE tokenizers run it (byte-level, tokenizer_bpe.h, and Gemma 4's,
// tokenizer_gemma4.h): tokenizer.ggml.merges as rules over symbol ids, and the merge loop over
// one piece's symbols, a priority queue over a linked list: O(n log n) however long the piece.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "granule/tokenizer.h"

namespace granule::detail {

class BpeMerges {
 public:
  struct Symbol {
    int32_t id;              // symbol id; -1 for text that is no symbol, or once merged away
    uint32_t begin, length;  // its bytes in the piece; length 0 once merged away
    int32_t prev, next;      // live neighbours, -1 at the ends
  };
  // A pair that may merge; stale when either side has changed since it was queued.
  struct Candidate {
    int32_t rank, left, right, left_id, right_id, result;
  };
  // Lowest rank first; among equal ranks the leftmost pair, as GPT-2, Hugging Face and
  // llama.cpp's llm_bigram_bpe order them.
  struct LaterFirst {
    bool operator()(const Candidate& a, const Candidate& b) const {
      return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    }
  };
  // Buffers reused across the pieces of one encode call.
  struct Scratch {
    std::vector<Symbol> symbols;
    std::priority_queue<Candidate, std::vector<Candidate>, LaterFirst> queue;
  };

  BpeMerges() = default;
  // The rules of `merges` ("left right", by rank) over a vocabulary of `vocab_size` tokens
  // whose ids `lookup` finds: each part and result is a symbol, its token id, or for text that
  // is no token an id from vocab_size on. The first rule for a pair wins, as llama.cpp's
  // emplace; a merge without a space after its first character is skipped.
  BpeMerges(const std::vector<std::string>& merges, size_t vocab_size,
            const std::function<std::optional<TokenId>(std::string_view)>& lookup);

  // The id of text that is no token but a merge part or result; -1 for any other text.
  int32_t extra_id(std::string_view text) const;
  // The text of an extra symbol (an id from vocab_size on).
  const std::string& extra_text(int32_t symbol) const {
    return extra_symbols_[static_cast<size_t>(symbol) - vocab_size_];
  }

  // Merges scratch.symbols (a piece's, in order, linked from index 0) by rank until no
  // neighbouring pair has a rule; the live symbols stay linked from index 0.
  void merge(Scratch& scratch) const;

 private:
  struct Rule {
    int32_t rank;
    int32_t result;  // symbol id of the merged pair
  };
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  size_t vocab_size_ = 0;
  std::unordered_map<uint64_t, Rule> rules_;  // (left << 32 | right) -> rule
  std::unordered_map<std::string, int32_t> extra_ids_;
  std::vector<std::string> extra_symbols_;  // text of ids >= vocab_size_
};

}  // namespace granule::detail
