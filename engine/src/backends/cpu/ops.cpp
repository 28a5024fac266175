// The CPU reference operators (see ops.h): f32 math in a fixed order, threads over rows.
#include "backends/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "backends/cpu/row_kernels.h"
#include "backends/cpu/thread_pool.h"
#include "granule/quant.h"

namespace granule::cpu {

float dot_f32(const float* a, const float* b, int64_t n) { return dot_f32_fast(a, b, n); }

void rms_norm(const float* x, const float* weight, float* out, int64_t n, float eps) {
  const float mean_square = dot_f32(x, x, n) / static_cast<float>(n);
  const float scale = 1.0f / std::sqrt(mean_square + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

void rope_angles(int64_t position, const double* frequencies, int64_t half, float magnitude,
                 float* cosines, float* sines) {
  for (int64_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(position) * frequencies[i];
    cosines[i] = static_cast<float>(std::cos(angle)) * magnitude;
    sines[i] = static_cast<float>(std::sin(angle)) * magnitude;
  }
}

void rope_rotate(float* x, int64_t n_heads, int64_t head_dim, const float* cosines,
                 const float* sines, RopeOrdering ordering) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const int64_t a = ordering == RopeOrdering::Normal ? 2 * i : i;
      const int64_t b = ordering == RopeOrdering::Normal ? 2 * i + 1 : i + half;
      const float x0 = v[a];
      const float x1 = v[b];
      v[a] = x0 * cosines[i] - x1 * sines[i];
      v[b] = x0 * sines[i] + x1 * cosines[i];
    }
  }
}

void rope(float* x, int64_t n_heads, int64_t head_dim, int64_t position, const double* frequencies,
          RopeOrdering ordering, float magnitude) {
  // One position for every head: the angles are computed once. Small fixed buffer: head_dim
  // of the llama family is at most 256 (a wider one takes the heap).
  constexpr int64_t kMaxHalf = 512;
  const int64_t half = head_dim / 2;
  float fixed[2 * kMaxHalf];
  std::vector<float> wide;
  float* angles = fixed;
  if (half > kMaxHalf) {
    wide.resize(static_cast<size_t>(2 * half));
    angles = wide.data();
  }
  rope_angles(position, frequencies, half, magnitude, angles, angles + half);
  rope_rotate(x, n_heads, head_dim, angles, angles + half, ordering);
}

void matmul_rows(TensorType type, const void* w, int64_t row_begin, int64_t row_end, int64_t n_rows,
                 int64_t n_cols, const float* x, int64_t n_tokens, float* y, bool f16_weights) {
  const size_t stride = row_bytes(type, n_cols);
  const auto* base = static_cast<const uint8_t*>(w);
  // Each thread keeps one decode buffer for its life: no allocation per token.
  thread_local std::vector<float> decoded;
  if ((type != TensorType::F32 || f16_weights) && decoded.size() < static_cast<size_t>(n_cols)) {
    decoded.resize(static_cast<size_t>(n_cols));
  }
  // Tokens go in tiles small enough to stay in L2 across the rows; a row is decoded once
  // per tile. Every output is the same dot whatever the tiling.
  constexpr int64_t kTokenTile = 64;
  for (int64_t tile = 0; tile < n_tokens; tile += kTokenTile) {
    const int64_t tile_end = std::min(n_tokens, tile + kTokenTile);
    for (int64_t r = row_begin; r < row_end; ++r) {
      const uint8_t* row = base + static_cast<size_t>(r) * stride;
      // One token (a decode step): decode and dot in one pass where a fused kernel exists.
      if (n_tokens == 1 && !f16_weights && dot_row_fused(type, row, x, n_cols, &y[r])) continue;
      const float* values = reinterpret_cast<const float*>(row);
      if (type != TensorType::F32 || f16_weights) {
        decode_row(type, row, decoded.data(), n_cols);
        if (f16_weights) round_through_f16(decoded.data(), n_cols);
        values = decoded.data();
      }
      for (int64_t t = tile; t < tile_end; ++t) {
        y[t * n_rows + r] = dot_f32(values, x + t * n_cols, n_cols);
      }
    }
  }
}

void matmul(TensorType type, const void* w, int64_t n_rows, int64_t n_cols, const float* x,
            int64_t n_tokens, float* y, ThreadPool* pool, bool f16_weights) {
  auto rows = [&](int64_t begin, int64_t end, int32_t) {
    matmul_rows(type, w, begin, end, n_rows, n_cols, x, n_tokens, y, f16_weights);
  };
  if (pool) {
    pool->parallel_for(n_rows, rows);
  } else {
    rows(0, n_rows, 0);
  }
}

void attention_head(const float* q, const float* k, const float* v, int64_t token_stride,
                    int64_t length, int64_t head_dim, float* scores, float* out, const float* sink,
                    float scale, bool approximate_exp) {
  if (approximate_exp &&
      attention_head_avx2(q, k, v, token_stride, length, head_dim, scores, out, sink, scale))
    return;
  if (scale <= 0.0f) scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  float max_score = sink ? *sink : -INFINITY;
  for (int64_t t = 0; t < length; ++t) {
    scores[t] = dot_f32(q, k + t * token_stride, head_dim) * scale;
    if (scores[t] > max_score) max_score = scores[t];
  }
  float sum = sink ? std::exp(*sink - max_score) : 0.0f;
  if (approximate_exp) {
    sum += exp_shifted_sum(scores, length, max_score);
  } else {
    for (int64_t t = 0; t < length; ++t) {
      scores[t] = std::exp(scores[t] - max_score);
      sum += scores[t];
    }
  }
  const float inv_sum = 1.0f / sum;
  for (int64_t d = 0; d < head_dim; ++d) out[d] = 0.0f;
  for (int64_t t = 0; t < length; ++t) {
    const float p = scores[t] * inv_sum;
    add_scaled(out, v + t * token_stride, p, head_dim);
  }
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void swiglu_clamped(const float* gate, const float* up, float* out, int64_t n, float alpha,
                    float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit);
    const float u = std::clamp(up[i], -limit, limit);
    out[i] = g / (1.0f + std::exp(alpha * -g)) * (u + 1.0f);
  }
}

void top_k(const float* values, int64_t n, int64_t k, int32_t* indices) {
  // k is small (at most a few dozen): a selection pass per slot, each taking the first
  // (lowest-index) maximum among those not taken yet.
  thread_local std::vector<uint8_t> taken;
  taken.assign(static_cast<size_t>(n), 0);
  for (int64_t slot = 0; slot < k; ++slot) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; ++i) {
      if (taken[static_cast<size_t>(i)]) continue;
      if (best < 0 || values[i] > values[best] ||
          (std::isnan(values[best]) && !std::isnan(values[i])))
        best = i;
    }
    taken[static_cast<size_t>(best)] = 1;
    indices[slot] = static_cast<int32_t>(best);
  }
}

void softmax(float* x, int64_t n) {
  float max_value = -INFINITY;
  for (int64_t i = 0; i < n; ++i) max_value = std::max(max_value, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max_value);
    sum += static_cast<double>(x[i]);
  }
  const auto inverse = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inverse;
}

void embedding_row(TensorType type, const void* table, int64_t n_embd, int64_t token, float* out) {
  const auto* row =
      static_cast<const uint8_t*>(table) + static_cast<size_t>(token) * row_bytes(type, n_embd);
  dequantize_row(type, row, out, n_embd);
}

void add_in_place(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

float round_to_f16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t magnitude = bits & 0x7fffffffu;
  uint16_t h;
  if (magnitude >= 0x7f800000u) {  // infinity, NaN (kept quiet)
    h = static_cast<uint16_t>(sign | 0x7c00u | (magnitude > 0x7f800000u ? 0x200u : 0u));
  } else if (magnitude >= 0x477ff000u) {  // 65520 and above round past 65504: infinity
    h = static_cast<uint16_t>(sign | 0x7c00u);
  } else if (magnitude < 0x38800000u) {  // below 2^-14: a multiple of 2^-24 (exact scaling)
    float a;
    std::memcpy(&a, &magnitude, sizeof a);
    h = static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 16777216.0f)));
  } else {  // normal: 23 mantissa bits to 10, ties to even; a carry moves into the exponent
    const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
    h = static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
  }
  return fp16_to_f32(h);
}

void round_through_f16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_to_f16(x[i]);
}

void round_through_q8(float* x, int64_t n, Q8Rounding rounding) {
  constexpr int64_t kBlock = 32;
  for (int64_t b = 0; b + kBlock <= n; b += kBlock) {
    float* v = x + b;
    float amax = 0.0f;
    for (int64_t i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(v[i]));
    const float d = amax / 127.0f;
    const float inverse = amax == 0.0f ? 0.0f : 1.0f / d;
    for (int64_t i = 0; i < kBlock; ++i) {
      float q = 0.0f;
      if (amax != 0.0f)  // nearbyint: the default mode rounds to nearest, ties to even
        q = std::nearbyint(rounding == Q8Rounding::Divide ? v[i] / d : v[i] * inverse);
      v[i] = q * d;
    }
  }
}

}  // namespace granule::cpu
