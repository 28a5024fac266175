// granule-first-layers SOURCE.gguf LAYERS OUT.gguf: writes SOURCE's first LAYERS layers with
// its embeddings, head and tokenizer (granule/testkit/first_layers.h), then opens the result
// as the engine does to check it. `setup.sh realweights` runs it on the default model.
#include <charconv>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <string>

#include "granule/gguf.h"
#include "granule/model_config.h"
#include "granule/testkit/first_layers.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: granule-first-layers SOURCE.gguf LAYERS OUT.gguf\n";
    return 2;
  }
  int64_t layers = 0;
  const char* end = argv[2] + std::strlen(argv[2]);
  if (std::from_chars(argv[2], end, layers).ptr != end || layers < 1) {
    std::cerr << "granule-first-layers: LAYERS must be a positive number, not '" << argv[2]
              << "'\n";
    return 2;
  }
  try {
    const auto source = granule::ModelFile::open(argv[1]);
    granule::write_first_layers(*source, layers, argv[3]);
    const auto written = granule::ModelFile::open(argv[3]);
    const granule::ModelConfig config = granule::ModelConfig::from_gguf(*written);
    std::cout << argv[3] << ": " << config.n_layer << " layers, " << config.n_vocab << " tokens, "
              << std::filesystem::file_size(argv[3]) << " bytes\n";
  } catch (const std::exception& e) {
    std::cerr << "granule-first-layers: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
