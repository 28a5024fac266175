// granule-test-model PATH [TEMPLATE_FILE]: writes the testkit's "tiny" synthetic model (2
// layers, 64 wide, ChatML template, byte-level vocabulary) to PATH, so the granule-cli scripts
// have a real, loadable GGUF when the default model is absent; TEMPLATE_FILE's text replaces
// the chat template. Exit 1 with one line on failure.
#include <cstdio>
#include <exception>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "granule/testkit/synthetic_model.h"

int main(int argc, char** argv) {
  // An option where PATH belongs (--help, -h) is not a file name to write.
  if ((argc != 2 && argc != 3) || argv[1][0] == '-') {
    std::fprintf(stderr, "usage: granule-test-model PATH [TEMPLATE_FILE]\n");
    return argc == 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") ? 0 : 1;
  }
  try {
    granule::SyntheticModelSpec spec = granule::SyntheticModelSpec::preset("tiny");
    if (argc == 3) {
      std::ifstream in(argv[2], std::ios::binary);
      if (!in) throw std::runtime_error(std::string("cannot read ") + argv[2]);
      std::ostringstream text;
      text << in.rdbuf();
      spec.chat_template = text.str();
    }
    granule::write_synthetic_model(spec, argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "granule-test-model: %s\n", e.what());
    return 1;
  }
  return 0;
}
