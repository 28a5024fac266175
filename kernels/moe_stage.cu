// Staging of streamed experts (moe_stage.cuh): the plan (which chosen experts are not resident,
// and their staging slots) and the host -> VRAM copy in one launch.
#include "common.cuh"
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

__global__ void __launch_bounds__(kStageThreads)
    moe_stage_kernel(const int32_t* __restrict__ ids, int pairs, int n_expert, MoeStage s) {
  // [e]: whether a pair chose e, then its staging slot (-1: none); [slot]: its expert.
  __shared__ int slot_of[kMoeMaxExperts];
  __shared__ int expert_at[kMoeMaxExperts];
  __shared__ int warp_count[kStageWarps];
  // The ids come from the router's top-k, the table from the host's last write_tables (before
  // the step); the step table was last read by the previous layer's products.
  wait_for_previous_kernel();
  for (int e = threadIdx.x; e < n_expert; e += kStageThreads) slot_of[e] = 0;
  __syncthreads();
  for (int p = threadIdx.x; p < pairs; p += kStageThreads) {
    const int e = ids[p];
    if (e >= 0 && e < n_expert) slot_of[e] = 1;
  }
  __syncthreads();
  // Slots in expert order: a block-wide count of the chosen, non-resident experts before each.
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  int staged = 0;
  for (int e0 = 0; e0 < n_expert; e0 += kStageThreads) {
    const int e = e0 + static_cast<int>(threadIdx.x);
    bool miss = false;
    if (e < n_expert && slot_of[e]) {
      const auto* gate = static_cast<const uint8_t*>(s.table[e]);
      miss = gate >= s.host_begin && gate < s.host_end;
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, miss);
    if (lane == 0) warp_count[warp] = __popc(ballot);
    __syncthreads();
    int before = staged, round = 0;
    for (int w = 0; w < kStageWarps; ++w) {
      if (w < warp) before += warp_count[w];
      round += warp_count[w];
    }
    before += __popc(ballot & ((1u << lane) - 1u));
    const int slot = miss && before < s.capacity ? before : -1;
    if (e < n_expert) slot_of[e] = slot;
    if (slot >= 0) expert_at[slot] = e;
    staged += round;
    __syncthreads();  // warp_count is rewritten by the next round
  }
  const int n = min(staged, s.capacity);
  if (blockIdx.x == 0) {
    for (int i = threadIdx.x; i < 3 * n_expert; i += kStageThreads) {
      const int m = i / n_expert, e = i % n_expert;
      const int slot = slot_of[e];
      // (selects, not offsets[m]: indexing the parameter would copy it to the stack)
      const uint64_t offset = m == 0 ? s.offsets[0] : m == 1 ? s.offsets[1] : s.offsets[2];
      s.step[i] = slot >= 0 ? static_cast<const void*>(
                                  s.staging + static_cast<uint64_t>(slot) * s.slot_bytes + offset)
                            : s.table[i];
    }
    if (threadIdx.x == 0 && s.copied && n > 0)
      atomicAdd(s.copied, static_cast<unsigned long long>(n) * s.expert_bytes);
  }
  // The copy: the staged experts' 16-byte chunks as one range, consecutive threads on
  // consecutive chunks of one expert (whole PCIe read requests), kInFlight loads per thread
  // before their stores.
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

}  // namespace

cudaError_t launch_moe_stage(const int32_t* ids, int pairs, int n_expert, const MoeStage& stage,
                             const KernelConfig& config, cudaStream_t stream) {
  if (pairs < 0 || n_expert <= 0 || n_expert > kMoeMaxExperts || !ids || !stage.table ||
      !stage.step || !stage.staging || stage.capacity < 0 || stage.capacity > kMoeMaxExperts ||
      stage.copy_bytes % 16 != 0 || stage.copy_bytes > stage.slot_bytes ||
      stage.slot_bytes % 16 != 0 || stage.offsets[0] != 0 ||
      stage.copy_bytes / 16 * static_cast<uint64_t>(stage.capacity) >= (uint64_t{1} << 31))
    return cudaErrorInvalidValue;
  return launch_status(launch_early(moe_stage_kernel, dim3(multiprocessors() * kBlocksPerSm),
                                    dim3(kStageThreads), config, stream, ids, pairs, n_expert,
                                    stage));
}

}  // namespace granule::kernels
