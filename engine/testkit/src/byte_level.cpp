// GPT-2's byte-to-symbol table, written out from its definition.
#include "granule/testkit/byte_level.h"

namespace granule {

std::string gpt2_byte_symbol(int byte) {
  const auto printable = [](int b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  int code_point = byte;
  if (!printable(byte)) {
    code_point = 256;
    for (int b = 0; b < byte; ++b) code_point += printable(b) ? 0 : 1;
  }
  std::string out;
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
  return out;
}

}  // namespace granule
