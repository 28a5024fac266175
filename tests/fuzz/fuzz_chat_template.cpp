// libFuzzer target: chat-template detection and rendering for every family (see harnesses.h).
#include "harnesses.h"

GRANULE_FUZZ_TARGET(granule::fuzz::render_chat)
