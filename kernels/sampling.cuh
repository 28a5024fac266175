// Token selection on the device, so only token ids cross to the host: penalties over each
// row's recent tokens, then greedy (argmax, lowest id on ties) or top-k (at most 256
// candidates; top_k = 0 also keeps the 256 most likely), temperature, top-p, min-p and a
// seeded draw; and the token masks of structured output, applied before either. Every per-step
// input lives in device buffers, or in pinned memory copied or read inside the graph (graph
// capturable).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernel_config.h"

namespace granule::kernels {

constexpr int kMaxSamplingCandidates = 256;

struct DeviceSamplingParams {
  float temperature = 0.0f;  // <= 0: greedy
  int32_t top_k = 0;         // 0 = the 256 most likely
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;  // llama.cpp: logit / p when positive, * p when negative
  float frequency_penalty = 0.0f;   // minus count * f
  float presence_penalty = 0.0f;    // minus p once present
  int32_t penalty_last_n = 64;
  uint64_t seed = 0;
  uint64_t step = 0;  // the draw is a function of (seed, step)
};

struct SamplingArgs {
  float* logits = nullptr;
  int64_t logits_stride = 0;  // [rows][n_vocab]; penalties edit in place
  int rows = 0, n_vocab = 0;
  const DeviceSamplingParams* params = nullptr;  // [rows]
  const int32_t* history = nullptr;
  int history_stride = 0;                   // [rows][stride], oldest first
  const int32_t* history_length = nullptr;  // [rows]
  int32_t* tokens = nullptr;                // [rows] out
};

// The uniform draw in [0, 1) the sampler uses for (seed, step); the host tests use it too.
__host__ __device__ inline float sampling_uniform(uint64_t seed, uint64_t step) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (step + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

cudaError_t launch_sampling(const SamplingArgs& args, cudaStream_t stream);

// Scratch of the greedy fast path: `rows` of each, zero before the first launch; every
// launch leaves them zero again.
struct ArgmaxWorkspace {
  unsigned long long* best = nullptr;
  int* counters = nullptr;
};

// Argmax of each row (lowest id on ties), no penalties: the greedy fast path. The row is
// split over many blocks; the last block of a row to finish writes its token.
cudaError_t launch_argmax(const float* logits, int64_t logits_stride, int rows, int n_vocab,
                          int32_t* tokens, ArgmaxWorkspace workspace, const KernelConfig& config,
                          cudaStream_t stream);

// Token masks (structured output): per row a bitmask of n_vocab bits in 32-bit words (bit set:
// allowed), which the host fills in pinned memory while the device runs the step's forward pass.
// `ready` and `wanted` are epochs in mapped pinned memory: the host writes `wanted` before the
// launch and `ready` = `wanted` once every row of the step is written. A mask row is
// `row_bytes` apart from the next (a multiple of 16): a 16-byte header whose first word is 1
// where the row is masked, then the row's words.
struct TokenMaskArgs {
  const uint32_t* ready = nullptr;  // mapped host memory (device pointers to it)
  const uint32_t* wanted = nullptr;
  uint32_t* timed_out = nullptr;       // set to 1 when the wait gave up
  const uint8_t* host_rows = nullptr;  // the host's rows (a host pointer to pinned memory)
  int host_row_count = 0;
  uint32_t* published = nullptr;   // device memory: 1 when the wait saw the masks, else 0
  uint8_t* device_rows = nullptr;  // device memory: device_row_count rows, copied per launch
  int device_row_count = 0;
  int64_t row_bytes = 0;
};

constexpr int64_t kTokenMaskRowHeaderBytes = 16;

// How long the device waits for the host's masks before drawing without them (a host that
// never publishes is a bug; the engine's check of each drawn token then refuses it).
constexpr uint64_t kTokenMaskWaitNs = 5'000'000'000ull;

// Waits until the host published the step's masks (or kTokenMaskWaitNs passed), copies host
// mask rows [first_mask_row, first_mask_row + rows) to the device rows by DMA (once the wait
// saw the epoch, so the copy reads what the host wrote before it), then sets every logit a
// masked row does not allow to -inf: logit row r (of `rows`, `logits_stride` apart) takes mask
// row first_mask_row + r. Graph capturable. rows <= device_row_count.
cudaError_t launch_token_mask(float* logits, int64_t logits_stride, int rows, int n_vocab,
                              int first_mask_row, const TokenMaskArgs& mask, cudaStream_t stream);

}  // namespace granule::kernels
