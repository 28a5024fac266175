// The tensor-core product family's shared pieces (matvec_mma.cu: int8 mma.sync over Q4_0/Q4_1/
// Q8_0/Q6_K; matvec_f16mma.cu: f16 mma.sync over Q4_0/Q4_1 dequantised in registers): the mma
// wrappers, the Q4 fragment builders, the cp.async stage ring every kernel of the family runs,
// the fixed-order reduction of the warps' partial sums, the epilogue, and the host side (the
// shared-memory attribute asked once per kernel, the launch with programmatic dependent launch).
//
// Every kernel of the family works the same way: a block owns some weight rows (16-row m-tiles)
// and 8 * NT batch columns (n-tiles of 8); its warps split the rows and/or the 32-element
// sub-blocks; stages of kKs sub-blocks move through a ring of S shared-memory slots filled by
// cp.async (weights first: they do not depend on the previous kernel), so the bytes in flight
// cost no registers; the partial sums of warps that split the sub-blocks meet at the end in
// shared memory, added in a fixed order (the same bits on every launch). The mma fragments:
// lane (g, t) = (lane / 4, lane % 4) holds rows g and g + 8 of an m-tile and columns 2t, 2t + 1
// of an n-tile (c[0], c[1]: row g; c[2], c[3]: row g + 8).
#pragma once
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "async_copy.cuh"
#include "matvec.cuh"
#include "quant_blocks.cuh"

namespace granule::kernels::mma {

constexpr int kMaxBlockShared = 227 * 1024;  // opt-in shared memory per block, H100/H200
constexpr int kSmShared = 228 * 1024;        // shared memory per SM, H100/H200
constexpr int kBlockReserve = 1024;           // shared memory the driver keeps per block

// A launch's tasks, passed by value (kernel parameter space).
struct Tasks {
  MatvecTask t[kMaxMatvecTasks];
};

// ---------------------------------------------------------------------------------------------
// mma.sync wrappers (sm_80+; the launchers refuse older devices).

// c = a (16x32 int8, row-major fragment) x b (32x8 int8, column-major fragment) + init (as
// int32 bits in every element: 0, or a magic number that makes c the bits of an f32).
__device__ __forceinline__ void mma_s8(int (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1, uint32_t init) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%10, %10, %10, %10};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(init));
#else
  __trap();
#endif
}

// The same for k = 16 (16x16 x 16x8).
__device__ __forceinline__ void mma_s8_k16(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t b,
                                           uint32_t init) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
      "{%7, %7, %7, %7};\n"
      : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
      : "r"(a0), "r"(a1), "r"(b), "r"(init));
#else
  __trap();
#endif
}

// c += a (16x16 f16, row-major fragment) x b (16x8 f16, column-major fragment), f32.
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}

// ---------------------------------------------------------------------------------------------
// Fragments from Q4 weights. Word t (bytes 4t..4t + 3) of a Q4 sub-block row holds elements
// 4t.. in its low nibbles and 16 + 4t.. in its high ones: lo from row g, hi from row g + 8.

// int8 A fragment (unsigned nibbles, 0..15): a0/a1 = elements 4t.. of rows g, g + 8; a2/a3 =
// elements 16 + 4t.. of the same rows (the int8 mma's k order: bytes 4t.. and 16 + 4t..).
__device__ __forceinline__ void q4_int8_fragment(uint32_t (&a)[4], uint32_t lo, uint32_t hi) {
  a[0] = lo & 0x0F0F0F0Fu;
  a[1] = hi & 0x0F0F0F0Fu;
  a[2] = (lo >> 4) & 0x0F0F0F0Fu;
  a[3] = (hi >> 4) & 0x0F0F0F0Fu;
}

__device__ __forceinline__ __half2 as_half2(uint32_t bits) {
  __half2 h;
  static_assert(sizeof(h) == sizeof(bits));
  memcpy(&h, &bits, sizeof(h));
  return h;
}
__device__ __forceinline__ uint32_t as_bits(__half2 h) {
  uint32_t bits;
  memcpy(&bits, &h, sizeof(bits));
  return bits;
}

// One-instruction bit operations ptxas does not form from the C++ (inline PTX):
// (a & MASK) | b as one lop3 with b in a register (written as C++, each of the masks and the
// f16 1024 is an immediate and ptxas makes two LOP3s of it: four instructions a word more).
template <uint32_t MASK>
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "n"(MASK), "r"(b));
  return r;
}
// prmt.b32 as the hardware has it (__byte_perm clears the selector's bits 3 first, one more
// instruction where they are known to be clear or are wanted: the sign mode).
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
  return r;
}

// f16x2 constants as bits (a conversion at run time would be an instruction each).
constexpr uint32_t kHalf2_1024 = 0x64006400u, kHalf2_1032 = 0x64086408u;
constexpr uint32_t kHalf2_Sixteenth = 0x2C002C00u;  // 1/16
constexpr uint32_t kHalf2_Minus64 = 0xD400D400u, kHalf2_Minus72 = 0xD480D480u;

// The four f16 pairs of one word, biased so the integer is exact: o[0] = (1024 + q(e),
// 1024 + q(e+1)), o[1] = the same for e+2, e+3; o[2] = (1024 + 16 q(e+16), 1024 + 16 q(e+17)),
// o[3] for e+18, e+19. (0x6400 is f16 1024, whose ulp is 1: OR-ing a value below 1024 into the
// mantissa adds it.) LOW_MASK keeps the values' bits in the low nibbles (Q2_K's 2-bit values:
// 0x00030003), LOW_MASK << 4 in the high ones. With `base` for the f16 1024s: base[i] = 1024 |
// other bits of pair i (Q5_K's fifth bits).
template <uint32_t LOW_MASK = 0x000F000Fu>
__device__ __forceinline__ void unpack_nibbles(uint32_t w, uint32_t (&o)[4],
                                               const uint32_t (&base)[4]) {
  const uint32_t p = __byte_perm(w, 0, 0x3120);  // bytes b0 b2 b1 b3
  const uint32_t s = p >> 8;                     // bytes b2 b1 b3 0
  o[0] = and_or<LOW_MASK>(p, base[0]);
  o[1] = and_or<LOW_MASK>(s, base[1]);
  o[2] = and_or<(LOW_MASK << 4)>(p, base[2]);
  o[3] = and_or<(LOW_MASK << 4)>(s, base[3]);
}
template <uint32_t LOW_MASK = 0x000F000Fu>
__device__ __forceinline__ void unpack_nibbles(uint32_t w, uint32_t (&o)[4]) {
  const uint32_t base[4] = {kHalf2_1024, kHalf2_1024, kHalf2_1024, kHalf2_1024};
  unpack_nibbles<LOW_MASK>(w, o, base);
}

// unpack_nibbles' pairs as f16((q - c) d), each rounded once: BIAS = f16x2(1024 + c) and
// HIGH_BIAS = f16x2(-64 - c), so (1024 + q) - BIAS and (1024 + 16 q) / 16 + HIGH_BIAS are q - c,
// exact. dlo scales the low pairs (k-step 0), dhi the high ones (k-step 1).
template <uint32_t BIAS, uint32_t HIGH_BIAS>
__device__ __forceinline__ void offset_f16_pairs(const uint32_t (&o)[4], __half2 dlo, __half2 dhi,
                                                 uint32_t (&lo)[2], uint32_t (&hi)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const __half2 ql = __hsub2_rn(as_half2(o[i]), as_half2(BIAS));
    const __half2 qh = __hfma2(as_half2(o[2 + i]), as_half2(kHalf2_Sixteenth), as_half2(HIGH_BIAS));
    lo[i] = as_bits(__hmul2_rn(ql, dlo));
    hi[i] = as_bits(__hmul2_rn(qh, dhi));
  }
}
// unpack_nibbles' pairs as f16(q d + m), q exact, then one rounding (fused): (dlo, mlo) for the
// low pairs, (dhi, mhi) for the high ones.
__device__ __forceinline__ void min_f16_pairs(const uint32_t (&o)[4], __half2 dlo, __half2 mlo,
                                              __half2 dhi, __half2 mhi, uint32_t (&lo)[2],
                                              uint32_t (&hi)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const __half2 ql = __hsub2_rn(as_half2(o[i]), as_half2(kHalf2_1024));
    const __half2 qh =
        __hfma2(as_half2(o[2 + i]), as_half2(kHalf2_Sixteenth), as_half2(kHalf2_Minus64));
    lo[i] = as_bits(__hfma2(ql, dlo, mlo));
    hi[i] = as_bits(__hfma2(qh, dhi, mhi));
  }
}

// One word of weights dequantised to f16 pairs: lo[0..1] the low-nibble pairs (k-step 0),
// hi[0..1] the high-nibble pairs (k-step 1), each rounded to f16 once: Q4_0 f16((q - 8) d),
// Q4_1 f16(q d + m). d = (d, d); m = (m, m) (Q4_1).
template <uint32_t TYPE>
__device__ __forceinline__ void q4_f16_pairs(uint32_t w, __half2 d, __half2 m, uint32_t (&lo)[2],
                                             uint32_t (&hi)[2]) {
  uint32_t o[4];
  unpack_nibbles(w, o);
  if constexpr (TYPE == kQ4_0)
    offset_f16_pairs<kHalf2_1032, kHalf2_Minus72>(o, d, d, lo, hi);  // q - 8
  else
    min_f16_pairs(o, d, m, d, m, lo, hi);
}

// ---------------------------------------------------------------------------------------------
// The block's weight rows and the stage ring.

// Row r of a block's weight rows (ROWS output rows per matrix; MATRICES 2 for SwiGLU: gate rows
// first, then up): rows past the matrix's end repeat its last row; they are read, never written.
template <int ROWS, int MATRICES>
__device__ __forceinline__ const uint8_t* weight_row(const MatvecTask& task, int row0, int r) {
  const int row = min(row0 + r % ROWS, task.n_out - 1);
  const void* matrix = MATRICES == 2 && r >= ROWS ? task.weight_up : task.weight;
  return static_cast<const uint8_t*>(matrix) + static_cast<int64_t>(row) * task.row_bytes;
}

// The ring's prologue: the weights of stages 0..S-2 (they do not depend on the previous
// kernel), then the wait for it, then those stages' activations, one commit group per stage.
template <int S, class LoadWeights, class LoadActivations>
__device__ __forceinline__ void start_ring(int stages, LoadWeights&& load_weights,
                                           LoadActivations&& load_activations) {
#pragma unroll
  for (int s = 0; s < S - 1; ++s)
    if (s < stages) load_weights(s);
  wait_for_previous_kernel();  // the activations (and y) belong to earlier kernels
  allow_next_kernel();
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < stages) load_activations(s);
    commit_copies();
  }
}

// Step s of the ring: waits for stage s (this thread's copies, then `barrier` for the threads
// that share the stage, which also frees stage s - 1's slot) and refills that slot with stage
// s + S - 1. Stage s is then ready to read.
template <int S, class Barrier, class LoadWeights, class LoadActivations>
__device__ __forceinline__ void advance_ring(int s, int stages, Barrier&& barrier,
                                             LoadWeights&& load_weights,
                                             LoadActivations&& load_activations) {
  wait_copies<S - 2>();
  barrier();
  if (s + S - 1 < stages) {
    load_weights(s + S - 1);
    load_activations(s + S - 1);
  }
  commit_copies();
}

template <int A, int B>
__device__ __forceinline__ void zero(float (&acc)[A][B][4]) {
#pragma unroll
  for (int a = 0; a < A; ++a)
#pragma unroll
    for (int b = 0; b < B; ++b)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[a][b][i] = 0.0f;
}

// ---------------------------------------------------------------------------------------------
// The partial sums of N warps (or groups of warps) that split the sub-blocks of the same rows:
// index j > 0 stores its sums at accumulator slot(j) of the (reused) ring, index 0 adds them in
// order 1..N-1 (deterministic). Every thread of the block calls it; true for index 0, which
// then holds the total. Accumulator i of lane l lives at [(slot + i) * 32 + l].
template <int N, bool UNROLL = false, int A, int B, class Slot>
__device__ __forceinline__ bool gather_sums(float (&acc)[A][B][4], uint8_t* shared, int index,
                                            Slot slot, int lane) {
  wait_copies<0>();
  __syncthreads();  // every warp is done with the stages; their memory is reused
  float* partial = reinterpret_cast<float*>(shared);
  auto at = [&](int j, int a, int b, int i) { return (slot(j) + (a * B + b) * 4 + i) * 32 + lane; };
  if (index > 0) {
#pragma unroll
    for (int a = 0; a < A; ++a)
#pragma unroll
      for (int b = 0; b < B; ++b)
#pragma unroll
        for (int i = 0; i < 4; ++i) partial[at(index, a, b, i)] = acc[a][b][i];
  }
  __syncthreads();
  if (index > 0) return false;
  auto add = [&](int j) {
#pragma unroll
    for (int a = 0; a < A; ++a)
#pragma unroll
      for (int b = 0; b < B; ++b)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[a][b][i] += partial[at(j, a, b, i)];
  };
  if constexpr (UNROLL) {
#pragma unroll
    for (int j = 1; j < N; ++j) add(j);
  } else {
    for (int j = 1; j < N; ++j) add(j);
  }
  return true;
}

// The epilogue: m-tiles 0..TILES-1 of acc (rows row0 + 16 m .., columns first_column + 8 nt ..)
// to y, y += with task.accumulate; SwiGLU takes silu(gate) * up from m-tiles m and TILES + m.
// F16_OUT: to task.y_f16 (rounded to nearest) where it is set (never with accumulate).
template <int TILES, bool GATE_UP, bool F16_OUT, int A, int NT>
__device__ __forceinline__ void store_tile(const float (&acc)[A][NT][4], const MatvecTask& task,
                                           int row0, int first_column, int batch, int lane) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int m = 0; m < TILES; ++m)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = row0 + m * 16 + g + (i / 2) * 8;
        const int column = first_column + nt * 8 + 2 * t + (i & 1);
        if (row >= task.n_out || column >= batch) continue;
        float v = acc[m][nt][i];
        if constexpr (GATE_UP) v = silu(v) * acc[A - TILES + m][nt][i];
        if constexpr (F16_OUT) {
          const int64_t at = static_cast<int64_t>(column) * task.y_stride + row;
          if (task.y_f16 != nullptr) {
            task.y_f16[at] = __float2half_rn(v);  // never with accumulate (refused)
          } else {
            float* y = task.y + at;
            *y = task.accumulate ? *y + v : v;
          }
        } else {
          float* y = task.y + static_cast<int64_t>(column) * task.y_stride + row;
          *y = task.accumulate ? *y + v : v;
        }
      }
}

// ---------------------------------------------------------------------------------------------
// Host side.

// Lets KERNEL use BYTES of dynamic shared memory (beyond 48 KB needs asking), once per process:
// the launchers' *_fits_device() make the first call, before any stream capture. (One device:
// the attribute is not re-applied on a second one.)
template <auto KERNEL, int BYTES>
cudaError_t allow_shared_bytes() {
  static const cudaError_t status =
      cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, BYTES);
  return status;
}

// KERNEL<<<grid, block, BYTES, stream>>>(tasks, in) after allow_shared_bytes, with
// programmatic dependent launch as config.early_launch says (launch_early_shared).
template <auto KERNEL, int BYTES, class Input>
cudaError_t launch(dim3 grid, dim3 block, const Tasks& tasks, const Input& in,
                   const KernelConfig& config, cudaStream_t stream) {
  const cudaError_t attribute = allow_shared_bytes<KERNEL, BYTES>();
  if (attribute != cudaSuccess) return attribute;
  return launch_early_shared(KERNEL, grid, block, BYTES, config, stream, tasks, in);
}

// The first of `statuses` that is not cudaSuccess (each was evaluated), else cudaSuccess.
inline cudaError_t first_error(std::initializer_list<cudaError_t> statuses) {
  for (const cudaError_t status : statuses)
    if (status != cudaSuccess) return status;
  return cudaSuccess;
}

// Blocks with work of a launch with `rows` output rows per block and `column_tiles` tiles.
inline int64_t working_blocks(const Tasks& tasks, int n_tasks, int rows, int column_tiles) {
  int64_t blocks = 0;
  for (int i = 0; i < n_tasks; ++i) blocks += ceil_div(tasks.t[i].n_out, rows);
  return blocks * column_tiles;
}

// Whether the code the current device would run for KERNEL has mma.sync: its compute
// capability and this build's architectures both count (a build for sm_75 only has none).
// Leaves no error behind.
template <class Kernel>
bool has_mma(Kernel kernel) {
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attributes.binaryVersion >= 80 && attributes.ptxVersion >= 80;
}

// launch_status(f(std::integral_constant<uint32_t, TYPE>{})) for the TYPE of TYPES that `type`
// is; cudaErrorInvalidValue for any other type.
template <uint32_t... TYPES, class F>
cudaError_t for_type(uint32_t type, F&& f) {
  cudaError_t status = cudaErrorInvalidValue;
  (void)((type == TYPES &&
          (status = launch_status(f(std::integral_constant<uint32_t, TYPES>{})), true)) ||
         ...);
  return status;
}

// Packs the tasks of a launch after the launcher's own checks (`valid` for each task, all
// SwiGLU or none): false when one fails. max_rows: the most rows of a task.
template <class Valid>
bool pack_tasks(const MatvecTask* tasks, int n_tasks, Valid&& valid, Tasks& packed, int& max_rows) {
  if (n_tasks < 1 || n_tasks > kMaxMatvecTasks) return false;
  const bool gate_up = tasks[0].weight_up != nullptr;
  max_rows = 0;
  for (int i = 0; i < n_tasks; ++i) {
    const MatvecTask& t = tasks[i];
    if (!valid(t) || (t.weight_up != nullptr) != gate_up || t.row_bytes % 16 != 0 ||
        reinterpret_cast<uintptr_t>(t.weight) % 16 != 0 ||
        reinterpret_cast<uintptr_t>(t.weight_up) % 16 != 0)
      return false;
    packed.t[i] = t;
    max_rows = t.n_out > max_rows ? t.n_out : max_rows;
  }
  return true;
}

}  // namespace granule::kernels::mma
