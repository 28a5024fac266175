// rope_frequencies and the llama3 scaling divisor, in double (see rope.h).
#include "model/rope.h"

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

std::vector<double> rope_frequencies(int64_t head_dim, float theta, const RopeScaling& scaling,
                                     const float* freq_factors) {
  std::vector<double> freqs(static_cast<size_t>(head_dim / 2));
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    double f = std::pow(static_cast<double>(theta),
                        -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    if (freq_factors) {
      f /= freq_factors[i];
    } else if (scaling.type == "llama3") {
      f /= llama3_frequency_divisor(f, scaling);
    } else if (scaling.type == "linear") {
      f /= scaling.factor;
    }
    freqs[static_cast<size_t>(i)] = f;
  }
  return freqs;
}

}  // namespace granule
