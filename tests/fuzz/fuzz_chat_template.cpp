// libFuzzer target: chat-template detection and rendering for every family (see harnesses.h).
#include "harnesses.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  granule::fuzz::quiet_logs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  granule::fuzz::render_chat(data, size);
  return 0;
}
