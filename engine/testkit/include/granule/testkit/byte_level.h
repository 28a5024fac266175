// GPT-2's byte-level symbols, which the synthetic vocabulary and the tokenizer tests build
// their byte tokens from.
#pragma once
#include <string>

namespace granule {

// The one-character UTF-8 symbol GPT-2's byte-level BPE writes for `byte` (0..255): printable
// Latin-1 bytes stand for themselves, the others get U+0100, U+0101, ... in byte order.
std::string gpt2_byte_symbol(int byte);

}  // namespace granule
