// Staging of streamed experts (moe_stage.cuh): the plan (which chosen experts are not resident,
// which of them the host computes, and the staged ones' slots) and the host -> VRAM copy, in one
// launch or in two.
#include "common.cuh"
#include "host_channel_post.cuh"
#include "moe.cuh"
#include "moe_stage.cuh"

namespace granule::kernels {
namespace {

constexpr int kStageThreads = 512;
constexpr int kStageWarps = kStageThreads / kWarpSize;
// 16-byte loads each thread has in flight: with two blocks of 512 threads per SM, ~8 MB over the
// grid of an H100, far above PCIe's bandwidth-delay product (~100 KB), so that the link, not the
// loads' latency, sets the rate.
constexpr int kInFlight = 4;
constexpr int kBlocksPerSm = 2;

__device__ __forceinline__ int4 load_streaming(const int4* p) {
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// A block-wide count of `flag`: before = set flags of lower thread indices, total = all set.
// Every thread of the block calls it (two barriers).
__device__ __forceinline__ void block_count(bool flag, int* warp_count, int& before, int& total) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const unsigned ballot = __ballot_sync(0xffffffffu, flag);
  if (lane == 0) warp_count[warp] = __popc(ballot);
  __syncthreads();
  before = __popc(ballot & ((1u << lane) - 1u));
  total = 0;
  for (int w = 0; w < kStageWarps; ++w) {
    if (w < warp) before += warp_count[w];
    total += warp_count[w];
  }
  __syncthreads();  // warp_count is rewritten by the next call
}

constexpr int kNoSlot = -1, kHostSlot = -2;

// The plan, worked out by every block that calls it (into its shared memory): slot_of[e] the
// staging slot of expert e (kNoSlot: none, kHostSlot: the host's), expert_at[slot] its expert;
// returns the experts staged (at most capacity).
__device__ __forceinline__ int stage_plan(const int32_t* __restrict__ ids, int pairs, int n_expert,
                                          const MoeStage& s, int* slot_of, int* expert_at,
                                          int* warp_count) {
  // The ids come from the router's top-k, the table from the host's last write_tables (before
  // the step); the step table was last read by the previous layer's products.
  for (int e = threadIdx.x; e < n_expert; e += kStageThreads) slot_of[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += kStageThreads) {
    const int e = ids[p];
    if (e >= 0 && e < n_expert) atomicAdd(&slot_of[e], 1);  // pairs per expert first
  }
  __syncthreads();
  // In expert order: the host's candidates ranked, then the staged experts' slots.
  int staged = 0, candidates = 0;
  for (int e0 = 0; e0 < n_expert; e0 += kStageThreads) {
    const int e = e0 + static_cast<int>(threadIdx.x);
    const int chosen = e < n_expert ? slot_of[e] : 0;
    bool miss = false;
    if (chosen > 0) {
      const auto* gate = static_cast<const uint8_t*>(s.table[e]);
      miss = gate >= s.host_begin && gate < s.host_end;
    }
    const bool candidate = miss && s.host_share > 0 && chosen <= s.host_max_pairs;
    int before = 0, round = 0;
    block_count(candidate, warp_count, before, round);
    const int r = candidates + before;
    const bool host = candidate && (r + 1) * s.host_share / 256 > r * s.host_share / 256;
    candidates += round;
    block_count(miss && !host, warp_count, before, round);
    before += staged;
    const int slot = host ? kHostSlot : miss && before < s.capacity ? before : kNoSlot;
    if (e < n_expert) slot_of[e] = slot;
    if (slot >= 0) expert_at[slot] = e;
    staged += round;
  }
  __syncthreads();
  return min(staged, s.capacity);
}

// What the plan writes, by one block: the step table, the host's mask and the device's weights
// (host_share > 0), and the copied-bytes counter.
__device__ __forceinline__ void stage_outputs(const int32_t* __restrict__ ids, int pairs,
                                              int n_expert, const MoeStage& s, const int* slot_of,
                                              int n) {
  for (int i = threadIdx.x; i < 3 * n_expert; i += kStageThreads) {
    const int m = i / n_expert, e = i % n_expert;
    const int slot = slot_of[e];
    // (selects, not offsets[m]: indexing the parameter would copy it to the stack)
    const uint64_t offset = m == 0 ? s.offsets[0] : m == 1 ? s.offsets[1] : s.offsets[2];
    s.step[i] = slot >= 0 ? static_cast<const void*>(
                                s.staging + static_cast<uint64_t>(slot) * s.slot_bytes + offset)
                : slot == kHostSlot ? static_cast<const void*>(s.zero + offset)
                                    : s.table[i];
  }
  if (s.host_share > 0) {
    // The host's inputs, written over PCIe into mapped host memory (posted writes, fenced before
    // the request that tells the host's server to read them).
    for (int e = threadIdx.x; e < n_expert; e += kStageThreads)
      s.host_mask[e] = slot_of[e] == kHostSlot;
    for (int p = threadIdx.x; p < pairs; p += kStageThreads) {
      const int e = ids[p];
      const float w = s.weights[p];
      s.gpu_weights[p] = e >= 0 && e < n_expert && slot_of[e] == kHostSlot ? 0.0f : w;
      s.host_ids[p] = e;
      s.host_weights[p] = w;
    }
    const auto* x4 = reinterpret_cast<const float4*>(s.x);
    auto* host_x4 = reinterpret_cast<float4*>(s.host_x);
    for (int i = threadIdx.x; i < s.x_floats / 4; i += kStageThreads) host_x4[i] = x4[i];
    __threadfence_system();
    if (s.host_words.request) {
      bool mine = false;
      for (int e = threadIdx.x; e < n_expert; e += kStageThreads) mine |= slot_of[e] == kHostSlot;
      const bool any = __syncthreads_or(mine);
      if (threadIdx.x == 0) {
        if (any)
          host_channel_post(s.host_words, static_cast<unsigned int>(s.host_layer),
                            static_cast<unsigned int>(s.host_rows));
        else
          host_channel_skip(s.host_words);
      }
    }
  }
  if (threadIdx.x == 0 && s.copied && n > 0)
    atomicAdd(s.copied, static_cast<unsigned long long>(n) * s.expert_bytes);
}

// The copy: the n staged experts' 16-byte chunks as one range, consecutive threads on
// consecutive chunks of one expert (whole PCIe read requests), kInFlight loads per thread
// before their stores, over the whole grid.
__device__ __forceinline__ void stage_copy(const MoeStage& s, int n, const int* expert_at) {
  const auto chunks = static_cast<uint32_t>(s.copy_bytes / 16);
  const uint32_t total = static_cast<uint32_t>(n) * chunks;  // < 2^31 (launch_moe_stage)
  const uint32_t stride = gridDim.x * kStageThreads;
  for (uint32_t c0 = blockIdx.x * kStageThreads + threadIdx.x; c0 < total;
       c0 += stride * kInFlight) {
    int4 v[kInFlight];
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      const uint32_t c = c0 + j * stride;
      if (c < total) {
        const uint32_t slot = c / chunks, at = c - slot * chunks;
        const auto* from = static_cast<const int4*>(s.table[expert_at[slot]]);
        v[j] = load_streaming(from + at);
      }
    }
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      const uint32_t c = c0 + j * stride;
      if (c < total) {
        const uint32_t slot = c / chunks, at = c - slot * chunks;
        reinterpret_cast<int4*>(s.staging + slot * s.slot_bytes)[at] = v[j];
      }
    }
  }
}

// Plan and copy in one launch: every block works out the plan, block 0 writes the outputs.
__global__ void __launch_bounds__(kStageThreads)
    moe_stage_kernel(const int32_t* __restrict__ ids, int pairs, int n_expert, MoeStage s) {
  __shared__ int slot_of[kMoeMaxExperts];
  __shared__ int expert_at[kMoeMaxExperts];
  __shared__ int warp_count[kStageWarps];
  wait_for_previous_kernel();
  const int n = stage_plan(ids, pairs, n_expert, s, slot_of, expert_at, warp_count);
  if (blockIdx.x == 0) stage_outputs(ids, pairs, n_expert, s, slot_of, n);
  stage_copy(s, n, expert_at);
}

// The plan alone (one block), its staged experts left in s.plan for moe_stage_copy_kernel.
__global__ void __launch_bounds__(kStageThreads)
    moe_stage_plan_kernel(const int32_t* __restrict__ ids, int pairs, int n_expert, MoeStage s) {
  __shared__ int slot_of[kMoeMaxExperts];
  __shared__ int expert_at[kMoeMaxExperts];
  __shared__ int warp_count[kStageWarps];
  wait_for_previous_kernel();
  const int n = stage_plan(ids, pairs, n_expert, s, slot_of, expert_at, warp_count);
  stage_outputs(ids, pairs, n_expert, s, slot_of, n);
  for (int i = threadIdx.x; i < n; i += kStageThreads) s.plan[1 + i] = expert_at[i];
  if (threadIdx.x == 0) s.plan[0] = n;
}

__global__ void __launch_bounds__(kStageThreads) moe_stage_copy_kernel(MoeStage s) {
  __shared__ int expert_at[kMoeMaxExperts];
  wait_for_previous_kernel();
  const int n = s.plan[0];
  for (int i = threadIdx.x; i < n; i += kStageThreads) expert_at[i] = s.plan[1 + i];
  __syncthreads();
  stage_copy(s, n, expert_at);
}

// The copy's arguments (and the plan's, with valid()).
bool valid_copy(const MoeStage& stage) {
  return stage.table && stage.step && stage.staging && stage.capacity >= 0 &&
         stage.capacity <= kMoeMaxExperts && stage.copy_bytes % 16 == 0 &&
         stage.copy_bytes <= stage.slot_bytes && stage.slot_bytes % 16 == 0 &&
         stage.offsets[0] == 0 &&
         stage.copy_bytes / 16 * static_cast<uint64_t>(stage.capacity) < (uint64_t{1} << 31) &&
         stage.host_share >= 0 && stage.host_share <= 256;
}

bool valid(int pairs, int n_expert, const int32_t* ids, const MoeStage& stage) {
  return valid_copy(stage) && pairs >= 0 && n_expert > 0 && n_expert <= kMoeMaxExperts && ids &&
         (stage.host_share == 0 ||
          (stage.host_max_pairs >= 1 && stage.zero && stage.weights && stage.gpu_weights &&
           stage.host_mask && stage.host_ids && stage.host_weights && stage.x_floats >= 0 &&
           stage.x_floats % 4 == 0 && (stage.x_floats == 0 || (stage.x && stage.host_x))));
}

}  // namespace

cudaError_t launch_moe_stage(const int32_t* ids, int pairs, int n_expert, const MoeStage& stage,
                             const KernelConfig& config, cudaStream_t stream) {
  if (!valid(pairs, n_expert, ids, stage)) return cudaErrorInvalidValue;
  return launch_status(launch_early(moe_stage_kernel, dim3(multiprocessors() * kBlocksPerSm),
                                    dim3(kStageThreads), config, stream, ids, pairs, n_expert,
                                    stage));
}

cudaError_t launch_moe_stage_plan(const int32_t* ids, int pairs, int n_expert,
                                  const MoeStage& stage, const KernelConfig& config,
                                  cudaStream_t stream) {
  if (!valid(pairs, n_expert, ids, stage) || !stage.plan) return cudaErrorInvalidValue;
  return launch_status(launch_early(moe_stage_plan_kernel, dim3(1), dim3(kStageThreads), config,
                                    stream, ids, pairs, n_expert, stage));
}

cudaError_t launch_moe_stage_copy(const MoeStage& stage, const KernelConfig& config,
                                  cudaStream_t stream) {
  if (!valid_copy(stage) || !stage.plan) return cudaErrorInvalidValue;
  return launch_status(launch_early(moe_stage_copy_kernel, dim3(multiprocessors() * kBlocksPerSm),
                                    dim3(kStageThreads), config, stream, stage));
}

}  // namespace granule::kernels
