// BpeMerges: the merge rules read once, and the merge loop both BPE tokenizers run per piece.
#include "text/tokenizer_merges.h"

namespace granule::detail {

BpeMerges::BpeMerges(const std::vector<std::string>& merges, size_t vocab_size,
                     const std::function<std::optional<TokenId>(std::string_view)>& lookup)
    : vocab_size_(vocab_size) {
  auto intern = [&](const std::string& text) {
    if (auto id = lookup(text)) return *id;
    const auto [it, inserted] =
        extra_ids_.emplace(text, static_cast<int32_t>(vocab_size_ + extra_symbols_.size()));
    if (inserted) extra_symbols_.push_back(text);
    return it->second;
  };
  rules_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string& merge = merges[rank];
    // Split at the first space after the first byte: a part may not hold a space (byte-level
    // text has none), but llama.cpp searches from 1 all the same.
    const size_t space = merge.find(' ', 1);
    if (space == std::string::npos) continue;
    const std::string left = merge.substr(0, space);
    const std::string right = merge.substr(space + 1);
    const int32_t left_id = intern(left);
    const int32_t right_id = intern(right);
    const int32_t result = intern(left + right);
    rules_.emplace(pair_key(left_id, right_id), Rule{static_cast<int32_t>(rank), result});
  }
}

int32_t BpeMerges::extra_id(std::string_view text) const {
  const auto it = extra_ids_.find(std::string(text));
  return it == extra_ids_.end() ? -1 : it->second;
}

void BpeMerges::merge(Scratch& scratch) const {
  auto& symbols = scratch.symbols;
  auto& queue = scratch.queue;
  auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const int32_t left_id = symbols[static_cast<size_t>(left)].id;
    const int32_t right_id = symbols[static_cast<size_t>(right)].id;
    if (left_id < 0 || right_id < 0) return;
    const auto it = rules_.find(pair_key(left_id, right_id));
    if (it == rules_.end()) return;
    queue.push({it->second.rank, left, right, left_id, right_id, it->second.result});
  };
  const auto n = static_cast<int32_t>(symbols.size());
  for (int32_t i = 0; i + 1 < n; ++i) consider(i, i + 1);

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(c.left)];
    Symbol& right = symbols[static_cast<size_t>(c.right)];
    if (left.length == 0 || right.length == 0 || left.id != c.left_id || right.id != c.right_id ||
        left.next != c.right) {
      continue;  // one side has merged since this pair was queued
    }
    left.id = c.result;
    left.length += right.length;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = c.left;
    right.id = -1;
    right.length = 0;
    right.next = right.prev = -1;
    consider(left.prev, c.left);
    consider(c.left, left.next);
  }
}

}  // namespace granule::detail
