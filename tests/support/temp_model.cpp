// TempModel: a synthetic GGUF written for one test and removed after it.
#include "support/temp_model.h"

#include <unistd.h>

#include <random>
#include <string>
#include <system_error>

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

}  // namespace granule::test
