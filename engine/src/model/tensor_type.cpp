// Block geometry of the supported GGUF tensor types.
#include "granule/tensor_type.h"

#include <array>
#include <string>

#include "granule/error.h"

namespace granule {
namespace {
constexpr std::array<TensorTypeInfo, 9> kTypes = {{
    {TensorType::F32, "F32", 1, 4},
    {TensorType::F16, "F16", 1, 2},
    {TensorType::Q4_0, "Q4_0", 32, 18},
    {TensorType::Q4_1, "Q4_1", 32, 20},
    {TensorType::Q8_0, "Q8_0", 32, 34},
    {TensorType::Q4_K, "Q4_K", 256, 144},
    {TensorType::Q5_K, "Q5_K", 256, 176},
    {TensorType::Q6_K, "Q6_K", 256, 210},
    {TensorType::BF16, "BF16", 1, 2},
}};

// Names of GGML ids the engine does not run, so errors can still name them.
constexpr std::array<std::string_view, 42> kGgmlNames = {
    "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
    "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M",
    "BF16", "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8",
    "IQ4_NL_8_8", "MXFP4", "type 40", "type 41"};
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
