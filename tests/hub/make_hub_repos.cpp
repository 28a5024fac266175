// granule-make-hub-repos ROOT: the fake hub's repositories (tests/hub/fake_hub.py serves
// ROOT/ORG/NAME/), made with the project's GGUF writer:
//   granule-test/Llama-3-8B-Shaped-GGUF  Llama 3 8B's shapes in Q2_K .. Q8_0 with the block
//                                        mixes llama-quantize writes; real headers, zero data
//                                        (sparse files: only the headers take disk space)
//   granule-test/Tiny-Chat-GGUF          small loadable models (Q8_0, F32) to download and chat
//   granule-test/Gated-Tiny-GGUF         the same behind a token ("hf_granule_test")
//   other-org/Phi-Shaped-GGUF            an architecture Granule does not run
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "granule/testkit/synthetic_model.h"

namespace fs = std::filesystem;
using granule::SyntheticModelSpec;
using granule::TensorType;

namespace {

void repo_json(const fs::path& dir, const std::string& json) {
  fs::create_directories(dir);
  std::ofstream(dir / ".repo.json") << json;
}

struct Quant {
  const char* label;
  TensorType weights;    // most layer matrices
  TensorType sensitive;  // attn_v and ffn_down, as the _M mixes keep them
  TensorType output;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: granule-make-hub-repos ROOT\n");
    return 2;
  }
  try {
    const fs::path root = argv[1];
    const fs::path big = root / "granule-test" / "Llama-3-8B-Shaped-GGUF";
    repo_json(
        big,
        R"({"downloads": 52000, "likes": 310, "lastModified": "2026-10-02T08:00:00.000Z", "architecture": "llama", "parameters": 8030261248, "context_length": 131072})");
    const Quant quants[] = {
        {"Q2_K", TensorType::Q2_K, TensorType::Q3_K, TensorType::Q6_K},
        {"Q3_K_M", TensorType::Q3_K, TensorType::Q4_K, TensorType::Q6_K},
        {"Q4_K_M", TensorType::Q4_K, TensorType::Q6_K, TensorType::Q6_K},
        {"Q5_K_M", TensorType::Q5_K, TensorType::Q6_K, TensorType::Q6_K},
        {"Q6_K", TensorType::Q6_K, TensorType::Q6_K, TensorType::Q6_K},
        {"Q8_0", TensorType::Q8_0, TensorType::Q8_0, TensorType::Q8_0},
    };
    for (const Quant& q : quants) {
      SyntheticModelSpec spec = SyntheticModelSpec::preset("llama3-8b");
      spec.name = "Llama 3 8B Shaped";
      spec.zero_data = true;
      spec.context_length = 131072;
      spec.weight_type = q.weights;
      spec.embedding_type = q.weights;
      spec.output_type = q.output;
      spec.tensor_types = {{"attn_v.weight", q.sensitive}, {"ffn_down.weight", q.sensitive}};
      granule::write_synthetic_model(spec,
                                     big / (std::string("Llama-3-8B-Shaped-") + q.label + ".gguf"));
    }
    std::ofstream(big / "README.md")
        << "# Llama 3 8B shaped\nHeaders of an 8B model, zero weights.\n";

    const fs::path tiny = root / "granule-test" / "Tiny-Chat-GGUF";
    repo_json(
        tiny,
        R"({"downloads": 1200, "likes": 4, "lastModified": "2026-11-30T12:00:00.000Z", "architecture": "llama"})");
    for (TensorType t : {TensorType::Q8_0, TensorType::F32}) {
      SyntheticModelSpec spec = with_types(SyntheticModelSpec::preset("small-256"), t, t, t);
      spec.name = "Tiny Chat";
      const std::string label = t == TensorType::Q8_0 ? "Q8_0" : "F32";
      granule::write_synthetic_model(spec, tiny / ("Tiny-Chat-" + label + ".gguf"));
    }
    std::ofstream(tiny / "README.md") << "# Tiny chat\n";

    const fs::path gated = root / "granule-test" / "Gated-Tiny-GGUF";
    repo_json(
        gated,
        R"({"downloads": 800, "likes": 2, "lastModified": "2026-09-01T00:00:00.000Z", "architecture": "llama", "gated": "manual", "token": "hf_granule_test"})");
    granule::write_synthetic_model(SyntheticModelSpec::preset("tiny"),
                                   gated / "Gated-Tiny-Q8_0.gguf");

    const fs::path phi = root / "other-org" / "Phi-Shaped-GGUF";
    repo_json(
        phi,
        R"({"downloads": 9000, "likes": 50, "lastModified": "2026-12-01T00:00:00.000Z", "architecture": "phi3"})");
    SyntheticModelSpec p = SyntheticModelSpec::preset("tiny");
    p.architecture = "phi3";
    granule::write_synthetic_model(p, phi / "Phi-Shaped-Q8_0.gguf");
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "granule-make-hub-repos: %s\n", e.what());
    return 1;
  }
}
