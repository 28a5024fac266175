// TempModel: a synthetic GGUF written for one test and removed after it.
#include "support/temp_model.h"

#include <unistd.h>

#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "granule/quant.h"
#include "granule/testkit/gguf_writer.h"

namespace granule::test {

TempModel::TempModel(const SyntheticModelSpec& spec, std::string_view prefix) {
  path = std::filesystem::temp_directory_path() /
         (std::string(prefix) + "_" + std::to_string(::getpid()) + "_" +
          std::to_string(std::random_device{}()) + ".gguf");
  write_synthetic_model(spec, path);
}

TempModel::~TempModel() {
  std::error_code ignored;  // a destructor: a file already gone is fine
  std::filesystem::remove(path, ignored);
}

void write_f32_copy(const ModelFile& from, const std::filesystem::path& to) {
  GgufWriter w;
  for (const auto& [key, value] : from.metadata()) w.set(key, value);
  for (const TensorInfo& t : from.tensors()) {
    std::vector<float> values(static_cast<size_t>(t.elements()));
    dequantize_row(static_cast<TensorType>(t.ggml_type), t.data, values.data(), t.elements());
    w.add_tensor(t.name, t.dims, TensorType::F32, values);
  }
  w.write(to);
}

}  // namespace granule::test
