// GGUF wire-format facts shared by the reader (gguf.cpp) and the testkit's writer
// (engine/testkit/src/gguf_writer.cpp): magic, alignment key, dimension limit, block
// geometry, value types.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "granule/gguf.h"

namespace granule::gguf_format {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
constexpr std::string_view kAlignmentKey = "general.alignment";
constexpr uint32_t kMaxDims = 4;

// Block geometry of every ggml type that can appear in a file, including those the
// engine cannot run: a file holding them still opens, and the model loader names the
// type it rejects. Ids missing here (removed, or runtime-only like Q8_1) are format
// errors. Sizes as ggml-common.h defines the blocks (and gguf-py's GGML_QUANT_SIZES).
struct BlockGeometry {
  uint32_t id;
  uint32_t block_elems;
  uint32_t block_bytes;
};
inline constexpr BlockGeometry kGgmlGeometry[] = {
    {0, 1, 4},       // F32
    {1, 1, 2},       // F16
    {2, 32, 18},     // Q4_0
    {3, 32, 20},     // Q4_1
    {6, 32, 22},     // Q5_0
    {7, 32, 24},     // Q5_1
    {8, 32, 34},     // Q8_0
    {10, 256, 84},   // Q2_K
    {11, 256, 110},  // Q3_K
    {12, 256, 144},  // Q4_K
    {13, 256, 176},  // Q5_K
    {14, 256, 210},  // Q6_K
    {15, 256, 292},  // Q8_K
    {16, 256, 66},   // IQ2_XXS
    {17, 256, 74},   // IQ2_XS
    {18, 256, 98},   // IQ3_XXS
    {19, 256, 50},   // IQ1_S
    {20, 32, 18},    // IQ4_NL
    {21, 256, 110},  // IQ3_S
    {22, 256, 82},   // IQ2_S
    {23, 256, 136},  // IQ4_XS
    {24, 1, 1},      // I8
    {25, 1, 2},      // I16
    {26, 1, 4},      // I32
    {27, 1, 8},      // I64
    {28, 1, 8},      // F64
    {29, 256, 56},   // IQ1_M
    {30, 1, 2},      // BF16
    {34, 256, 54},   // TQ1_0
    {35, 256, 66},   // TQ2_0
    {39, 32, 17},    // MXFP4
};

inline const BlockGeometry* block_geometry(uint32_t id) {
  for (const auto& g : kGgmlGeometry)
    if (g.id == id) return &g;
  return nullptr;
}

inline bool is_valid_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::FLOAT64); }

inline bool is_unsigned(GgufType t) {
  return t == GgufType::UINT8 || t == GgufType::UINT16 || t == GgufType::UINT32 ||
         t == GgufType::UINT64;
}
inline bool is_signed(GgufType t) {
  return t == GgufType::INT8 || t == GgufType::INT16 || t == GgufType::INT32 ||
         t == GgufType::INT64;
}
inline bool is_integer(GgufType t) { return is_unsigned(t) || is_signed(t); }
inline bool is_float(GgufType t) { return t == GgufType::FLOAT32 || t == GgufType::FLOAT64; }

inline std::string type_label(GgufType t) {
  return is_valid_type(static_cast<uint32_t>(t)) ? std::string(gguf_type_name(t))
                                                 : "type " + std::to_string(static_cast<uint32_t>(t));
}

}  // namespace granule::gguf_format
