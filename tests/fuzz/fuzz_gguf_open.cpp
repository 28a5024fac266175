// libFuzzer target: a GGUF file from bytes (see harnesses.h).
#include "harnesses.h"

GRANULE_FUZZ_TARGET(granule::fuzz::open_gguf)
