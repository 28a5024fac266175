// rope_frequencies, the llama3 scaling divisor and YaRN's ramp and magnitude (see rope.h).
#include "model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace granule {

double llama3_frequency_divisor(double frequency, const RopeScaling& s) {
  const double wavelength = 2.0 * std::numbers::pi / frequency;
  const double low_freq_wavelength = static_cast<double>(s.original_context) / s.low_freq_factor;
  const double high_freq_wavelength = static_cast<double>(s.original_context) / s.high_freq_factor;
  if (wavelength < high_freq_wavelength) return 1.0;
  if (wavelength > low_freq_wavelength) return s.factor;
  const double smooth = (static_cast<double>(s.original_context) / wavelength - s.low_freq_factor) /
                        (s.high_freq_factor - s.low_freq_factor);
  return 1.0 / ((1.0 - smooth) / s.factor + smooth);
}

YarnCorrection yarn_correction(int64_t head_dim, float theta, const RopeScaling& s) {
  const auto n_dims = static_cast<float>(head_dim);
  const auto n_ctx_orig = static_cast<float>(s.original_context);
  auto corr_dim = [&](float rotations) {
    return n_dims * std::log(n_ctx_orig / (rotations * 2.0f * std::numbers::pi_v<float>)) /
           (2.0f * std::log(theta));
  };
  YarnCorrection r;
  r.low = std::max(0.0f, std::floor(corr_dim(s.yarn_beta_fast)));
  r.high = std::min(n_dims - 1.0f, std::ceil(corr_dim(s.yarn_beta_slow)));
  return r;
}

double yarn_ramp(const YarnCorrection& range, int64_t pair) {
  const double y = (static_cast<double>(pair) - range.low) /
                   std::max(0.001, static_cast<double>(range.high) - range.low);
  return 1.0 - std::min(1.0, std::max(0.0, y));
}

float rope_magnitude(const RopeScaling& s) {
  if (s.type != "yarn") return 1.0f;
  const float temperature = s.factor > 1.0f ? 1.0f + 0.1f * std::log(s.factor) : 1.0f;
  return temperature * s.attn_factor;
}

std::vector<double> rope_frequencies(int64_t head_dim, float theta, const RopeScaling& scaling,
                                     const float* freq_factors) {
  std::vector<double> freqs(static_cast<size_t>(head_dim / 2));
  const YarnCorrection yarn =
      scaling.type == "yarn" ? yarn_correction(head_dim, theta, scaling) : YarnCorrection{};
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    double f = std::pow(static_cast<double>(theta),
                        -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    if (freq_factors) {
      f /= freq_factors[i];
    } else if (scaling.type == "llama3") {
      f /= llama3_frequency_divisor(f, scaling);
    } else if (scaling.type == "linear") {
      f /= scaling.factor;
    } else if (scaling.type == "yarn") {
      const double ramp = yarn_ramp(yarn, i);
      f *= (1.0 - ramp) / scaling.factor + ramp;
    }
    freqs[static_cast<size_t>(i)] = f;
  }
  return freqs;
}

}  // namespace granule
