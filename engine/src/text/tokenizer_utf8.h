// UTF-8 scanning shared by the tokenizers and the incremental detokenizer: how long the
// character at a position is, whether it is complete, and where an invalid run ends.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace granule::utf8 {

enum class Scan { Complete, Truncated, Invalid };

// What lies at text[pos]: a Complete character of `length` bytes; the first `length` bytes
// of a character cut off by the end of text (Truncated: more bytes may complete it); or an
// Invalid run of `length` >= 1 bytes (the maximal subpart of an ill-formed sequence, so
// one U+FFFD replaces it, as the Unicode standard recommends).
struct Step {
  Scan kind;
  size_t length;
};

inline Step scan(std::string_view text, size_t pos) {
  const auto lead = static_cast<uint8_t>(text[pos]);
  if (lead < 0x80) return {Scan::Complete, 1};
  size_t need = 0;           // continuation bytes after the lead
  uint8_t second_lo = 0x80;  // allowed range of the first continuation byte: excludes
  uint8_t second_hi = 0xBF;  // overlong forms, surrogates and code points past U+10FFFF
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 2;
    if (lead == 0xE0) second_lo = 0xA0;
    if (lead == 0xED) second_hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 3;
    if (lead == 0xF0) second_lo = 0x90;
    if (lead == 0xF4) second_hi = 0x8F;
  } else {
    return {Scan::Invalid, 1};
  }
  for (size_t k = 1; k <= need; ++k) {
    if (pos + k >= text.size()) return {Scan::Truncated, k};
    const auto byte = static_cast<uint8_t>(text[pos + k]);
    const uint8_t lo = k == 1 ? second_lo : 0x80;
    const uint8_t hi = k == 1 ? second_hi : 0xBF;
    if (byte < lo || byte > hi) return {Scan::Invalid, k};
  }
  return {Scan::Complete, need + 1};
}

// Length of the character starting at text[pos] as its lead byte announces it, clipped to
// the text; 1 for a byte that cannot start a character. (How llama.cpp and SentencePiece
// step through text: they do not validate the continuation bytes.)
inline size_t char_length(std::string_view text, size_t pos) {
  const auto lead = static_cast<uint8_t>(text[pos]);
  size_t length = 1;
  if (lead >= 0xF0) {
    length = 4;
  } else if (lead >= 0xE0) {
    length = 3;
  } else if (lead >= 0xC0) {
    length = 2;
  }
  return length < text.size() - pos ? length : text.size() - pos;
}

inline void append_codepoint(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Decodes a complete, valid character of `length` bytes at text[pos].
inline uint32_t decode_codepoint(std::string_view text, size_t pos, size_t length) {
  const auto byte = [&](size_t k) {
    return static_cast<uint32_t>(static_cast<uint8_t>(text[pos + k]));
  };
  switch (length) {
    case 1:
      return byte(0);
    case 2:
      return ((byte(0) & 0x1F) << 6) | (byte(1) & 0x3F);
    case 3:
      return ((byte(0) & 0x0F) << 12) | ((byte(1) & 0x3F) << 6) | (byte(2) & 0x3F);
    default:
      return ((byte(0) & 0x07) << 18) | ((byte(1) & 0x3F) << 12) | ((byte(2) & 0x3F) << 6) |
             (byte(3) & 0x3F);
  }
}

inline constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace granule::utf8
