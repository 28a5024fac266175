// first_layers_model: a GGUF model cut to its first layers, tensors and metadata copied as
// they are in the source file.
#include "granule/testkit/first_layers.h"

#include <charconv>
#include <string>
#include <vector>

#include "granule/error.h"

namespace granule {

int64_t tensor_layer(std::string_view tensor_name) {
  constexpr std::string_view kPrefix = "blk.";
  if (!tensor_name.starts_with(kPrefix)) return -1;
  const std::string_view rest = tensor_name.substr(kPrefix.size());
  int64_t layer = -1;
  const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), layer);
  if (error != std::errc() || end == rest.data() || end == rest.data() + rest.size() || *end != '.')
    return -1;
  return layer;
}

GgufWriter first_layers_model(const ModelFile& source, int64_t layers) {
  const std::optional<std::string> architecture = source.get_string("general.architecture");
  if (!architecture) throw UsageError(source.path().string() + ": no general.architecture");
  const std::string block_count_key = *architecture + ".block_count";
  const std::optional<int64_t> block_count = source.get_int(block_count_key);
  if (!block_count) throw UsageError(source.path().string() + ": no " + block_count_key);
  if (layers < 1 || layers > *block_count)
    throw UsageError("cannot keep " + std::to_string(layers) + " layers of " +
                     source.path().string() + ": it has " + std::to_string(*block_count));

  GgufWriter out(source.version(), source.alignment());
  for (const auto& [key, value] : source.metadata()) out.set(key, value);
  // The key's own type (UINT32 in llama.cpp's files), with the new count.
  GgufValue count = *source.find(block_count_key);
  count.u64 = static_cast<uint64_t>(layers);
  count.i64 = layers;
  out.set(block_count_key, count);
  const std::string name = source.get_string("general.name").value_or(architecture.value());
  out.set("general.name", GgufValue::string(name + " (first " + std::to_string(layers) + " of " +
                                            std::to_string(*block_count) + " layers)"));
  for (const TensorInfo& t : source.tensors()) {
    if (tensor_layer(t.name) >= layers) continue;
    out.add_raw_tensor(t.name, t.dims, t.ggml_type,
                       std::vector<uint8_t>(t.data, t.data + t.size_bytes));
  }
  return out;
}

void write_first_layers(const ModelFile& source, int64_t layers,
                        const std::filesystem::path& path) {
  first_layers_model(source, layers).write(path);
}

}  // namespace granule
