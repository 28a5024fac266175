// Rotary position embedding frequencies, the llama family's rule with its scalings: shared
// math that the CPU and CUDA backends (and the synthetic models' rope_freqs) use alike.
#pragma once
#include <cstdint>
#include <vector>

#include "granule/model_config.h"

namespace granule {

// The per-pair rotation frequencies θ_i = theta^(-2i/head_dim) for i < head_dim/2, adjusted
// for scaling: "linear" divides by factor; "llama3" (or freq_factors from rope_freqs.weight,
// when not null, head_dim/2 values) divides each θ_i by its factor.
// Kept in double so that angles at long positions match a float64 reference.
std::vector<double> rope_frequencies(int64_t head_dim, float theta, const RopeScaling& scaling,
                                     const float* freq_factors);
// The llama3 divisor for one frequency (1 for high frequencies, factor for low ones, smooth
// in between), as Meta's reference computes it.
double llama3_frequency_divisor(double frequency, const RopeScaling& scaling);

}  // namespace granule
