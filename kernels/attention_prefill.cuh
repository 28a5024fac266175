// Flash-attention prefill (FlashAttention-2 style, f16 tensor cores): a thread block takes a
// tile of up to 64 consecutive query rows of ONE sequence and one query head, walks that
// sequence's KV in tiles of 64 tokens staged in shared memory, and keeps an online softmax per
// row in f32. Each KV token is read once per (tile, head) instead of once per row, which is
// what the flash-decoding kernel (attention.cuh) does for prompt rows. Rows read tokens
// [0, length) of their slot (on a sliding layer only their window), with the same sinks, exactly
// as launch_attention's rows do, and write the same output.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "attention.cuh"

namespace granule::kernels {

// Query rows per tile: 4 warps x 16 rows (the M of mma.m16n8k16).
constexpr int kPrefillTileRows = 64;

// Rows [first_row, first_row + count) of one run; all of them share a slot.
struct PrefillTile {
  int32_t first_row = 0;
  int32_t count = 0;
};

// Plans a batch for launch_attention_prefill: runs of consecutive rows with the same slot
// and a length > 0 that are at least `min_run_rows` long are cut into tiles of at most
// kPrefillTileRows rows (a run of n rows into ceil(n / 64) tiles of nearly equal size).
// Every other row with a length > 0 (a decode row, a short run) is appended to `other_rows`
// for launch_attention. Rows of length 0 (padding) are in neither. Clears both outputs first.
void plan_prefill_tiles(const int32_t* slots, const int32_t* lengths, int rows, int min_run_rows,
                        std::vector<PrefillTile>& tiles, std::vector<int32_t>& other_rows);

// Attention for the rows of `tiles` (device array of n_tiles tiles, rows of one tile sharing
// args.slots[first_row]); rows outside every tile are neither read nor written, nor are rows
// of length 0. Reads q, out, rows, n_head, n_kv, head_dim, lengths, slots, slot_base,
// token_stride, layer, scale, sinks and window of `args` (not the split workspace). head_dim 64,
// 128 or 256; n_head / n_kv at most 8; q_stride a multiple of 4 and out_stride of 2 (vector
// accesses); args.out_q8 must be empty (no int8 copy of the output): cudaErrorInvalidValue
// otherwise. Q is rounded to f16 once (times scale), P to f16 before P·V; scores, softmax and the
// output accumulate in f32. Needs compute capability 8.0 (mma.sync m16n8k16 f16).
cudaError_t launch_attention_prefill(const AttentionArgs& args, const PrefillTile* tiles,
                                     int n_tiles, const KernelConfig& config, cudaStream_t stream);

// Whether the current device runs the kernel for this head size: code built for compute
// capability 8.0+ and its shared memory (attention_prefill_shared_bytes) within the device's
// per-block limit (H100/H200: all head sizes; A100 and sm_86/89: 64 and 128). Also makes the
// one-time shared-memory opt-in, so call it before any graph capture.
bool attention_prefill_fits_device(int head_dim);

// Dynamic shared memory one block takes for a head size (Q tile + two stages of K and V).
size_t attention_prefill_shared_bytes(int head_dim);

}  // namespace granule::kernels
