// Gemma's CPU operators (see gemma_ops.h).
#include "backends/cpu/gemma_ops.h"

#include <cmath>

#include "backends/cpu/ops.h"

namespace granule::cpu {

float gelu_tanh_ggml(float x) {
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  constexpr float kCoefA = 0.044715f;
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  const float h = round_to_f16(x);
  return round_to_f16(0.5f * h * (1.0f + std::tanh(kSqrt2OverPi * h * (1.0f + kCoefA * h * h))));
}

void geglu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    // ggml: x >= 10 gives x * up without the table.
    out[i] = (g >= 10.0f ? g : gelu_tanh_ggml(g)) * up[i];
  }
}

void soft_cap(float* x, int64_t n, float cap) {
  const float inverse = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) x[i] = std::tanh(x[i] * inverse) * cap;
}

}  // namespace granule::cpu
