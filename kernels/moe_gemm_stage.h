// How the tiled expert products (moe_gemm.cu) stage a chunk of a weight row (kSubs sub-blocks of 32
// from sub-block `first`; `subs` of them at a row's end) in shared memory: as a "mini row" of the
// chunk's sub-blocks in the type's own layout, so moe_mma::Frag<TYPE>::load(raw, mini_row, 0,
// subs, t) reads it as it reads the row in memory from `first`.
//   GGUF blocks: the chunk's blocks, copied in aligned 16-byte segments to a slot that keeps their
//     address modulo 16 (so Q6_K's 210-byte blocks have the alignment they have in memory);
//   split layout (per row the values of all sub-blocks, then their scales): the chunk's values
//     (16-byte aligned), then its scales.
// Plain C++ as well as CUDA, so a host test holds every type's staged chunk to the row.
#pragma once
#include <cstdint>

#include "granule/block_formats.h"
#include "moe_mma_frag.cuh"

#if defined(__CUDACC__)
#define GRANULE_STAGE_HD __host__ __device__ __forceinline__
#else
#define GRANULE_STAGE_HD inline
#endif

namespace granule::kernels {

// Whether the expert rows of a type are in the split layout rather than in GGUF's blocks: none in
// this tree. A layout that moves types there declares moe_unpack::split_rows(uint32_t), which then
// wins over this fallback (a non-template overload beats a template), and Staged copies those
// types' chunks as such.
namespace moe_unpack {
template <class Type>
constexpr bool split_rows(Type) {
  return false;
}
}  // namespace moe_unpack

namespace moe_gemm {

// Elements and bytes of a GGUF block of the types the tensor-core products read.
constexpr int block_elems_of(uint32_t type) {
  return type == 12 || type == 13 || type == 14 || type == 23 ? kQK_K : kQK;
}
constexpr int block_bytes_of(uint32_t type) {
  switch (type) {
    case 2:
      return sizeof(BlockQ4_0);
    case 3:
      return sizeof(BlockQ4_1);
    case 8:
      return sizeof(BlockQ8_0);
    case 12:
      return sizeof(BlockQ4_K);
    case 13:
      return sizeof(BlockQ5_K);
    case 14:
      return sizeof(BlockQ6_K);
    case 20:
      return sizeof(BlockIQ4_NL);
    case 23:
      return sizeof(BlockIQ4_XS);
    case 39:
      return sizeof(BlockMXFP4);
    default:
      return 0;
  }
}

// One copy of a stage: `bytes` (16, 8 or 4; 0: none) from src to the slot's byte `to`.
struct Copy {
  const uint8_t* src = nullptr;
  int to = 0, bytes = 0;
};

template <uint32_t TYPE>
struct Staged {
  using F = moe_mma::Frag<TYPE>;
  static constexpr int kSubs = F::kSubs;  // sub-blocks of 32 per chunk
  static constexpr bool kSplit = moe_unpack::split_rows(TYPE);
  static constexpr int kBlockSubs = block_elems_of(TYPE) / 32;  // sub-blocks per GGUF block
  static constexpr int kBlockBytes = block_bytes_of(TYPE);
  static constexpr int kValueBytes = TYPE == 8 ? 32 : 16;  // split: per sub-block (Q8_0: 32)
  static constexpr int kScaleBytes = TYPE == 39 ? 1 : 2;   // split: per sub-block (MXFP4: 1)
  static_assert(kBlockBytes > 0, "a type the tensor-core products read");
  static_assert(!kSplit || kSubs * kScaleBytes == 4 || kSubs * kScaleBytes == 8,
                "split rows: a chunk's scales in one 4- or 8-byte copy");
  // 16-byte segments of a slot; an odd number of them apart, so that the 8 rows a quad group
  // reads hit different banks.
  static constexpr int kSegments =
      kSplit ? kSubs * kValueBytes / 16 + 1 : (kSubs / kBlockSubs * kBlockBytes + 15 + 15) / 16;
  static constexpr int kSlotBytes = (kSegments | 1) * 16;

  // Byte offset in a row (GGUF blocks) of the chunk from sub-block `first`.
  GRANULE_STAGE_HD static int64_t at(int first) {
    return static_cast<int64_t>(first / kBlockSubs) * kBlockBytes;
  }
  // Segment `seg` (< kSegments) of the chunk from `first` of `row` (n_sub sub-blocks).
  GRANULE_STAGE_HD static Copy segment(const uint8_t* row, int first, int subs, int n_sub,
                                       int seg) {
    Copy c;
    if constexpr (kSplit) {
      if (seg < subs * kValueBytes / 16) {
        c.src = row + static_cast<int64_t>(kValueBytes) * first + seg * 16;
        c.to = seg * 16;
        c.bytes = 16;
      } else if (seg == kSegments - 1) {  // the scales, after the chunk's values
        c.src = row + static_cast<int64_t>(kValueBytes) * n_sub +
                static_cast<int64_t>(kScaleBytes) * first;
        c.to = subs * kValueBytes;
        c.bytes = kSubs * kScaleBytes;
      }
    } else {
      // The chunk's first byte moved by the segment's 16 bytes: its address modulo 16 is the
      // chunk's (delta), and rounded down it is the segment's source (unsigned arithmetic: a
      // signed 64-bit - delta cost the gate/up stage loop 27 instructions).
      const uintptr_t src = reinterpret_cast<uintptr_t>(row + seg * 16 + at(first));
      const int delta = static_cast<int>(src & 15);
      const int bytes = (subs + kBlockSubs - 1) / kBlockSubs * kBlockBytes;
      if (seg * 16 < delta + bytes) {
        c.src = reinterpret_cast<const uint8_t*>(src & ~static_cast<uintptr_t>(15));
        c.to = seg * 16;
        c.bytes = 16;
      }
    }
    return c;
  }
  // Where the chunk's mini row starts in its slot.
  GRANULE_STAGE_HD static int mini_row(const uint8_t* row, int first) {
    if constexpr (kSplit) return 0;
    return static_cast<int>(reinterpret_cast<uintptr_t>(row + at(first)) & 15);
  }
};

}  // namespace moe_gemm
}  // namespace granule::kernels

#undef GRANULE_STAGE_HD
