// granule-bench's model resolution: a GGUF path as given, or a synthetic preset written to
// the temp folder once (under a .partial name first, so an interrupted write is not reused).
#include "bench_model.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>

#include "granule/error.h"
#include "granule/tensor_type.h"
#include "granule/testkit/synthetic_model.h"

namespace granule {

std::filesystem::path synthetic_bench_model(const std::string& spec_text) {
  const auto colon = spec_text.find(':');
  SyntheticModelSpec spec = SyntheticModelSpec::preset(spec_text.substr(0, colon));
  if (colon != std::string::npos) {
    const std::string type_name = spec_text.substr(colon + 1);
    std::optional<TensorType> type;
    for (uint32_t id = 0; id < 64 && !type; ++id) {
      const auto info = tensor_type_info(id);
      if (info && info->name == type_name) type = info->type;
    }
    if (!type)
      throw UsageError("unknown block type '" + type_name + "' in --synthetic " + spec_text);
    spec.weight_type = *type;
    spec.embedding_type = *type;
    spec.output_type =
        spec.n_embd % 256 == 0 && *type != TensorType::F16 ? TensorType::Q6_K : *type;
  }
  std::string file_name = "granule-bench-" + spec_text + ".gguf";
  std::replace(file_name.begin(), file_name.end(), ':', '-');
  const auto path = std::filesystem::temp_directory_path() / file_name;
  if (!std::filesystem::exists(path)) {
    const auto start = std::chrono::steady_clock::now();
    std::fprintf(stderr, "writing synthetic model %s to %s ...\n", spec_text.c_str(), path.c_str());
    write_synthetic_model(spec, path.string() + ".partial");
    std::filesystem::rename(path.string() + ".partial", path);
    std::fprintf(stderr, "  done in %.1f s\n",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return path;
}

std::filesystem::path bench_model_path(const std::string& model_path,
                                       const std::string& synthetic) {
  if (model_path.empty() == synthetic.empty()) {
    throw UsageError("give one of --model (a GGUF file) or --synthetic (PRESET[:TYPE])");
  }
  return synthetic.empty() ? std::filesystem::path(model_path) : synthetic_bench_model(synthetic);
}

}  // namespace granule
