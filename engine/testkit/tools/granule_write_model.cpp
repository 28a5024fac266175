// granule-write-model PRESET[:TYPE] OUT.gguf [--router-skew S]: writes a synthetic model of a
// named shape (SyntheticModelSpec::preset: "gpt-oss-20b", "qwen3-30b-a3b", the tiny ones, ...),
// its dense matrices and embeddings in block type TYPE where one is given (the head in Q6_K
// where the width allows, as granule-bench --synthetic PRESET:TYPE writes it), with
// large tensors drawn from pools of valid encoded blocks (random_blocks), streamed to disk so
// a 13 GB file needs neither its size in memory nor per-value quantisation; then opens the
// result as the engine does to check it. --router-skew S > 0 makes expert popularity fall
// with rank (SyntheticModelSpec::router_skew); 0, the default, routes about uniformly.
#include <charconv>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>

#include "granule/gguf.h"
#include "granule/model_config.h"
#include "granule/tensor_type.h"
#include "granule/testkit/synthetic_model.h"

namespace {

int usage() {
  std::cerr << "usage: granule-write-model PRESET[:TYPE] OUT.gguf [--router-skew S]\npresets:";
  for (const std::string& name : granule::SyntheticModelSpec::preset_names())
    std::cerr << " " << name;
  std::cerr << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 5) return usage();
  float skew = 0.0f;
  if (argc == 5) {
    if (std::strcmp(argv[3], "--router-skew") != 0) return usage();
    const char* end = argv[4] + std::strlen(argv[4]);
    if (std::from_chars(argv[4], end, skew).ptr != end || !(skew >= 0.0f)) {
      std::cerr << "granule-write-model: --router-skew takes a number >= 0, not '" << argv[4]
                << "'\n";
      return 2;
    }
  }
  try {
    const std::string preset = argv[1];
    const size_t colon = preset.find(':');
    granule::SyntheticModelSpec spec = granule::SyntheticModelSpec::preset(preset.substr(0, colon));
    if (colon != std::string::npos) {
      const std::string type_name = preset.substr(colon + 1);
      std::optional<granule::TensorType> type;
      for (uint32_t id = 0; id < 64 && !type; ++id) {
        const auto info = granule::tensor_type_info(id);
        if (info && info->name == type_name) type = info->type;
      }
      if (!type) {
        std::cerr << "granule-write-model: unknown block type '" << type_name << "'\n";
        return 2;
      }
      spec.weight_type = *type;
      spec.embedding_type = *type;
      spec.output_type = spec.n_embd % 256 == 0 && *type != granule::TensorType::F16
                             ? granule::TensorType::Q6_K
                             : *type;
    }
    spec.random_blocks = true;
    spec.router_skew = skew;
    if (skew > 0.0f && spec.n_expert == 0) {
      std::cerr << "granule-write-model: --router-skew needs a mixture of experts; " << argv[1]
                << " has none\n";
      return 2;
    }
    const auto start = std::chrono::steady_clock::now();
    granule::write_synthetic_model(spec, argv[2]);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const auto bytes = std::filesystem::file_size(argv[2]);
    const auto written = granule::ModelFile::open(argv[2]);
    const granule::ModelConfig config = granule::ModelConfig::from_gguf(*written);
    const granule::WeightTable weights = granule::WeightTable::from_gguf(*written, config);
    std::cout << argv[2] << ": " << config.architecture << ", " << config.n_layer << " layers, "
              << config.moe.n_expert << " experts, " << bytes << " bytes in " << seconds << " s ("
              << static_cast<double>(bytes) / seconds / 1e9 << " GB/s)\n";
  } catch (const std::exception& e) {
    std::cerr << "granule-write-model: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
