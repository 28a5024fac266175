// What the Hub's views ask of the engine: whether it runs an architecture.
#pragma once
#include <string_view>

#include "granule/model_config.h"

namespace granule::hub {

inline bool architecture_supported(std::string_view architecture) {
  return ModelConfig::architecture_supported(architecture);
}

}  // namespace granule::hub
