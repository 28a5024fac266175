// Rotary position embedding frequencies, the llama family's rule with its scalings: shared
// math that the CPU and CUDA backends (and the synthetic models' rope_freqs) use alike.
#pragma once
#include <cstdint>
#include <vector>

#include "granule/model_config.h"

namespace granule {

// The per-pair rotation frequencies θ_i = theta^(-2i/head_dim) for i < head_dim/2, adjusted
// for scaling: "linear" divides by factor; "llama3" (or freq_factors from rope_freqs.weight,
// when not null, head_dim/2 values) divides each θ_i by its factor; "yarn" blends θ_i / factor
// and θ_i by yarn_ramp() (ggml's rope_yarn with ext_factor 1).
// Kept in double so that angles at long positions match a float64 reference.
std::vector<double> rope_frequencies(int64_t head_dim, float theta, const RopeScaling& scaling,
                                     const float* freq_factors);
// The llama3 divisor for one frequency (1 for high frequencies, factor for low ones, smooth
// in between), as Meta's reference computes it.
double llama3_frequency_divisor(double frequency, const RopeScaling& scaling);

// YaRN's correction range [low, high] in rotation pairs (ggml_rope_yarn_corr_dims, computed in
// float as ggml does, since its floor/ceil decide whole pairs): pairs below `low` keep their
// frequency, pairs above `high` are interpolated by 1/factor, a linear ramp in between.
struct YarnCorrection {
  float low = 0.0f, high = 0.0f;
};
YarnCorrection yarn_correction(int64_t head_dim, float theta, const RopeScaling& scaling);
// The weight of the unscaled frequency for pair i: 1 below low, 0 above high.
double yarn_ramp(const YarnCorrection& range, int64_t pair);

// The factor both cos and sin of the rotation carry (so Q·K scales by its square): YaRN's
// attention temperature 1 + 0.1 ln(factor) (for factor > 1) times rope.scaling.attn_factor;
// 1 for every other scaling. llama.cpp: llama-context.cpp's yarn_attn_factor times ggml's
// rope_yarn mscale, whose 1 / (1 + 0.1 ln factor) and (1 + 0.1 ln factor) cancel.
float rope_magnitude(const RopeScaling& scaling);

}  // namespace granule
