// libFuzzer target: tokenizer encode and decode over every pre-tokenizer family (see
// harnesses.h). The tokenizers are built once, from GRANULE_TESTDATA_DIR (the environment
// variable, else the folder this build was configured with).
#include <cstdlib>

#include "harnesses.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  granule::fuzz::quiet_logs();
  const char* dir = std::getenv("GRANULE_TESTDATA_DIR");
  granule::fuzz::init_tokenizers(dir != nullptr ? dir : GRANULE_TESTDATA_DIR);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  granule::fuzz::tokenize(data, size);
  return 0;
}
