// granule-test-model PATH: writes the testkit's "tiny" synthetic model (2 layers, 64 wide,
// ChatML template, byte-level vocabulary) to PATH, so the granule-cli scripts have a real,
// loadable GGUF when the default model is absent. Exit 1 with one line on failure.
#include <cstdio>
#include <exception>

#include "granule/testkit/synthetic_model.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: granule-test-model PATH\n");
    return 1;
  }
  try {
    granule::write_synthetic_model(granule::SyntheticModelSpec::preset("tiny"), argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "granule-test-model: %s\n", e.what());
    return 1;
  }
  return 0;
}
