// Block geometry of the supported GGUF tensor types.
#include "granule/tensor_type.h"

#include <array>
#include <string>

#include "granule/block_formats.h"
#include "granule/error.h"

namespace granule {
namespace {
// Sizes from the block structs (granule/block_formats.h), which assert ggml's.
constexpr std::array<TensorTypeInfo, 16> kTypes = {{
    {TensorType::F32, "F32", 1, 4},
    {TensorType::F16, "F16", 1, 2},
    {TensorType::Q4_0, "Q4_0", kQK, sizeof(BlockQ4_0)},
    {TensorType::Q4_1, "Q4_1", kQK, sizeof(BlockQ4_1)},
    {TensorType::Q5_0, "Q5_0", kQK, sizeof(BlockQ5_0)},
    {TensorType::Q5_1, "Q5_1", kQK, sizeof(BlockQ5_1)},
    {TensorType::Q8_0, "Q8_0", kQK, sizeof(BlockQ8_0)},
    {TensorType::Q2_K, "Q2_K", kQK_K, sizeof(BlockQ2_K)},
    {TensorType::Q3_K, "Q3_K", kQK_K, sizeof(BlockQ3_K)},
    {TensorType::Q4_K, "Q4_K", kQK_K, sizeof(BlockQ4_K)},
    {TensorType::Q5_K, "Q5_K", kQK_K, sizeof(BlockQ5_K)},
    {TensorType::Q6_K, "Q6_K", kQK_K, sizeof(BlockQ6_K)},
    {TensorType::IQ4_NL, "IQ4_NL", kQK, sizeof(BlockIQ4_NL)},
    {TensorType::IQ4_XS, "IQ4_XS", kQK_K, sizeof(BlockIQ4_XS)},
    {TensorType::BF16, "BF16", 1, 2},
    {TensorType::MXFP4, "MXFP4", kQK, sizeof(BlockMXFP4)},
}};

// Names of GGML ids the engine does not run, so errors can still name them.
constexpr std::array<std::string_view, 42> kGgmlNames = {
    "F32",   "F16",        "Q4_0",       "Q4_1",       "Q4_2",     "Q4_3",     "Q5_0",
    "Q5_1",  "Q8_0",       "Q8_1",       "Q2_K",       "Q3_K",     "Q4_K",     "Q5_K",
    "Q6_K",  "Q8_K",       "IQ2_XXS",    "IQ2_XS",     "IQ3_XXS",  "IQ1_S",    "IQ4_NL",
    "IQ3_S", "IQ2_S",      "IQ4_XS",     "I8",         "I16",      "I32",      "I64",
    "F64",   "IQ1_M",      "BF16",       "Q4_0_4_4",   "Q4_0_4_8", "Q4_0_8_8", "TQ1_0",
    "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4",    "type 40",  "type 41"};
}  // namespace

std::optional<TensorTypeInfo> tensor_type_info(uint32_t ggml_type_id) {
  for (const auto& t : kTypes)
    if (static_cast<uint32_t>(t.type) == ggml_type_id) return t;
  return std::nullopt;
}

const TensorTypeInfo& tensor_type_info(TensorType type) {
  for (const auto& t : kTypes)
    if (t.type == type) return t;
  throw UnsupportedError("unsupported tensor type " + std::to_string(static_cast<uint32_t>(type)));
}

std::string tensor_type_name(uint32_t ggml_type_id) {
  if (ggml_type_id < kGgmlNames.size() && !kGgmlNames[ggml_type_id].starts_with("type"))
    return std::string(kGgmlNames[ggml_type_id]);
  return "type " + std::to_string(ggml_type_id);
}

size_t row_bytes(TensorType type, int64_t n) {
  const auto& info = tensor_type_info(type);
  if (n % info.block_elems != 0)
    throw UsageError("row of " + std::to_string(n) + " elements is not a multiple of the " +
                     std::string(info.name) + " block size " + std::to_string(info.block_elems));
  return static_cast<size_t>(n / info.block_elems) * info.block_bytes;
}

}  // namespace granule
