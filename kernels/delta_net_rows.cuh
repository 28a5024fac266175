// Device helpers the Gated DeltaNet kernels share (delta_net.cu, delta_net_chunked.cu): the exact
// gate functions, the runs of a step's rows (a run is one sequence's consecutive positions), and
// the chunked form's plan carved from DeltaNetArgs::chunk_scratch.
#pragma once
#include "delta_net.cuh"

namespace granule::kernels::delta_net_rows {

__device__ __forceinline__ float sigmoid_exact(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_exact(float x) { return x / (1.0f + expf(-x)); }
// ggml_softplus: x above 20 as is, else log(1 + e^x).
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); }

__host__ __device__ inline int channels_of(const DeltaNetArgs& a) {
  return (2 * a.n_k_heads + a.n_v_heads) * a.state_size;
}

// Whether row r begins its run (the first row of a sequence in the step).
__device__ __forceinline__ bool run_starts(const DeltaNetArgs& a, int r) {
  const int slot = a.slots[r];
  return slot >= 0 &&
         !(r > 0 && a.slots[r - 1] == slot && a.positions[r - 1] == a.positions[r] - 1);
}

__device__ __forceinline__ int run_length(const DeltaNetArgs& a, int r) {
  const int slot = a.slots[r], p = a.positions[r];
  int n = 1;
  while (r + n < a.rows && a.slots[r + n] == slot && a.positions[r + n] == p + n) ++n;
  return n;
}

// Whether this step plans chunked runs: the scratch is given and a run can be long enough.
__host__ __device__ inline bool chunk_planned(const DeltaNetArgs& a) {
  return a.chunk_scratch != nullptr && a.chunk_w != nullptr && a.rows >= kDeltaNetChunkedMinRows;
}

// The chunked form's scratch (delta_net_chunk_scratch_floats(rows, n_v_heads) floats): per row
// and value head the chunk's P row (kDeltaNetChunkTokens floats) and the cumulative log decay,
// then the plan's integers. Every chunked run has at least kDeltaNetChunkTokens rows, so there
// are at most rows / 64 of them and at most twice as many chunks.
struct ChunkPlan {
  float* p = nullptr;          // [rows][n_v_heads][64]: P[t][s] of the row's chunk, s <= t
  float* gamma = nullptr;      // [rows][n_v_heads]: the log decay summed from the chunk's start
  int* counts = nullptr;       // [0]: chunked runs, [1]: chunks
  int* row_run_len = nullptr;  // [rows]: at each run's first row, its length (every run)
  int* run_first = nullptr;    // [rows]: the first row of the row's run
  int* run_row = nullptr;      // [max_runs]: a chunked run's first row
  int* run_len = nullptr;      // [max_runs]
  int* chunk_row = nullptr;    // [max_chunks]: a chunk's first row
  int* chunk_len = nullptr;    // [max_chunks]: 1 to 64 rows
};

__host__ __device__ inline int max_chunked_runs(int rows) { return rows / kDeltaNetChunkTokens; }
__host__ __device__ inline int max_chunks(int rows) { return 2 * max_chunked_runs(rows); }

__host__ __device__ inline ChunkPlan chunk_plan_of(const DeltaNetArgs& a) {
  ChunkPlan p;
  const int64_t rows = a.rows;
  float* f = a.chunk_scratch;
  p.p = f;
  f += rows * a.n_v_heads * kDeltaNetChunkTokens;
  p.gamma = f;
  f += rows * a.n_v_heads;
  int* i = reinterpret_cast<int*>(f);
  p.counts = i;
  i += 16;
  p.row_run_len = i;
  i += rows;
  p.run_first = i;
  i += rows;
  p.run_row = i;
  i += max_chunked_runs(a.rows);
  p.run_len = i;
  i += max_chunked_runs(a.rows);
  p.chunk_row = i;
  i += max_chunks(a.rows);
  p.chunk_len = i;
  return p;
}

}  // namespace granule::kernels::delta_net_rows

namespace granule::kernels {
// delta_net_chunked.cu: the plan, then the chunked rule over the planned runs (the recurrent
// rule kernel skips them). Only when chunk_planned(args). Launched early (launch_early): each
// kernel waits for the one before it first thing (it reads nothing before that).
cudaError_t launch_delta_net_chunked(const DeltaNetArgs& args, const KernelConfig& config,
                                     cudaStream_t stream);
}  // namespace granule::kernels
