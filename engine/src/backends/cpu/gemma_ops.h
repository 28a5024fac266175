// Gemma's CPU operators beside ops.h: GeGLU with gelu's tanh approximation as ggml's CPU
// computes it, and the final logit soft-cap.
#pragma once
#include <cstdint>

namespace granule::cpu {

// gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as ggml's CPU takes it
// (GGML_GELU_FP16, ggml-cpu/vec.h): x rounded to f16 indexes a table of f16-rounded gelu
// values; x <= -10 gives 0 and x >= 10 gives x.
float gelu_tanh_ggml(float x);

// out[i] = gelu_tanh_ggml(gate[i]) * up[i] (llama.cpp's geglu_split). out may alias gate.
void geglu(const float* gate, const float* up, float* out, int64_t n);

// x = cap * tanh(x / cap) over n values, in ggml's order: scale by 1/cap, tanh, scale by cap.
void soft_cap(float* x, int64_t n, float cap);

}  // namespace granule::cpu
