// A synthetic model written to a fresh file in the temporary folder for one test, removed
// when the test is done; a model's F32 copy.
#pragma once
#include <filesystem>
#include <string_view>

#include "granule/gguf.h"
#include "granule/testkit/synthetic_model.h"

namespace granule::test {

struct TempModel {
  std::filesystem::path path;
  // `prefix` names the file (with the process id and a random number, so parallel tests
  // never share one).
  TempModel(const SyntheticModelSpec& spec, std::string_view prefix);
  ~TempModel();
  TempModel(const TempModel&) = delete;
  TempModel& operator=(const TempModel&) = delete;
};

// Writes to `to` the F32 copy of `from`: every tensor decoded by dequantize_row, the metadata
// as it is.
void write_f32_copy(const ModelFile& from, const std::filesystem::path& to);

}  // namespace granule::test
