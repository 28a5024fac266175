// The tensor element / block types a GGUF file can hold, with GGML's numeric ids, and
// their block geometry. Dequantisation lives in quant.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace granule {

enum class TensorType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  IQ4_NL = 20,
  IQ4_XS = 23,
  BF16 = 30,
  MXFP4 = 39,
};

struct TensorTypeInfo {
  TensorType type;
  std::string_view name;  // "Q4_1"
  uint32_t block_elems;   // elements per block (1 for F32/F16/BF16, 32, or 256)
  uint32_t block_bytes;   // bytes per block
};

// Info for a supported type, or nullopt for an id the engine does not support
// (the GGUF reader still accepts such files; the model loader rejects them by name).
std::optional<TensorTypeInfo> tensor_type_info(uint32_t ggml_type_id);
const TensorTypeInfo& tensor_type_info(TensorType type);
// "Q4_1", or "type 7" for an unknown id.
std::string tensor_type_name(uint32_t ggml_type_id);
// Bytes of a row of n elements (n must be a multiple of block_elems).
size_t row_bytes(TensorType type, int64_t n);

}  // namespace granule
