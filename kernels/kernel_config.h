// KernelConfig: every tuning knob of the CUDA kernels and the weight layout they read, with
// its default. The CUDA backend fills one at start (the GRANULE_* environment overrides are
// parsed in engine/src/backends/kernel_config_env.cpp and listed in the README) and hands it to
// each launcher that has a choice to make. Plain C++ (also compiled as CUDA C++17), so host code
// and tests without a GPU share it.
#pragma once

namespace granule::kernels {

// Batch-1 shape of the GGUF-layout Q4_0/Q4_1 matvec kernel: GGUF blocks copied per step x
// rows per thread block. H200, 8B-shaped Q4_0, ms per decode step: 64x2 3.06, 64x4 3.26,
// 128x4 3.35, 64x8 4.41, 32x4 4.56 (kernels/PERF_NOTES.md).
enum class MatvecShape { k64x2, k64x4, k128x4, k64x8, k32x4 };

// Batch-1 shape of the split-layout Q4_0/Q4_1 matvec kernel: rows per warp x sub-blocks per
// lane per step. H200, 8B-shaped Q4_0, ms per decode step with one shape for all rows:
// 1x2 1.94, 2x4 2.00, 1x4 2.02, 1x8 2.35 (kernels/PERF_NOTES.md).
enum class SplitShape { k1x2, k1x4, k1x8, k2x4 };

struct KernelConfig {
  MatvecShape matvec_shape = MatvecShape::k64x2;
  // Rows of fewer than kLongRowSubBlocks 32-element sub-blocks, and the others (the down
  // projection's long rows).
  SplitShape split_shape = SplitShape::k1x2;
  SplitShape split_shape_long = SplitShape::k1x2;
  static constexpr int kLongRowSubBlocks = 256;
  // Programmatic dependent launch (launch_early, common.cuh): a kernel may start while the
  // one before it finishes. Needs compute capability 9.0; fit_to_device() turns it off below.
  bool early_launch = true;
  // Q4_0/Q4_1/Q8_0/Q6_K weights re-laid out at upload (split_layout.h) rather than kept in
  // GGUF blocks; the matvec kernels read whichever layout a matrix has.
  bool split_weights = true;
  // Int8 tensor-core products (matvec_mma.cu, compute capability 8.0+) for split-layout
  // Q4_0/Q4_1/Q8_0/Q6_K matrices once a run has mma_min_rows rows (up to 64; more take
  // dequantise + cuBLAS); fewer take the dp4a kernels. The device picks the kernel: the
  // warp-pipelined one where a block gets ~208 KB of shared memory (H100/H200), else the
  // block-staged one. The backend turns mma off on devices without it
  // (matvec_mma_fits_device()). H200, 8B Q4_0 decode t/s, warp-pipelined / block-staged /
  // dp4a: 8 rows 2,296 / 1,645 / 1,611; 32 rows 4,162 / 3,072 / 1,605; 64 rows 5,003 / 3,820 /
  // 1,592 (kernels/README.md).
  bool mma = true;
  // H200, 8B Q4_0: at 4 rows block-staged 892 t/s against dp4a 1,328; at 8, 1,684 against 1,611.
  int mma_min_rows = 8;
  // Runs of more than 64 rows (prefill) take the f16 tensor-core flash-attention kernel
  // (attention_prefill.cu, compute capability 8.0+) for runs of rows of one sequence; single
  // rows of other sequences in the same run keep the flash-decoding kernel (attention.cu).
  // The backend turns it off on devices without it.
  bool flash_prefill = true;
  // The GEMM path (runs of more than 64 rows) dequantises the next matrix
  // to f16 on a second stream, into a second scratch, while cuBLAS multiplies the current one
  // (engine/src/backends/cuda/cuda_model.cpp; same kernels, so the same numbers). The backend
  // keeps one scratch and one stream when the budget cannot hold the second without moving a
  // layer to streaming. H200, 8B Q4_0, pp512: the dequantisation is 5.7 of 20.9 ms serial.
  bool prefill_overlap = true;
  // Decode runs of at least this many rows (and at most 64) take the f16 tensor-core products
  // (matvec_f16mma.cu) where every matrix of the layer is split Q4_0/Q4_1: activations in f16,
  // weights dequantised to f16 in registers, no per-block epilogue. 0 off. The backend turns it
  // off on devices without f16 mma. H200, 8B Q4_0, decode ms per step int8 / f16: 16 rows
  // 3.83 / 3.95, 20 rows 6.86 / 5.28, 32 rows 6.88 / 5.31, 64 rows 10.51 / 8.83 (PERF_NOTES).
  // 17 is where they win (16 columns still fit the int8 kernels' 16-column tiles). The SwiGLU
  // gate+up product at 17-64 rows shares each stage's activations between 4 warps of rows
  // (32-row decode step 5.752 -> 5.459 ms). The CPU oracle rounds such runs as this path does
  // (cpu_backend.cpp).
  int f16_mma_min_rows = 17;
  // Decode attention (attention.cu) splits a sequence's length until its blocks fill the SMs
  // this many times over: more splits, shorter chains per block for short sequences, and a
  // merge pass per (row, KV head).
  int attention_blocks_per_sm = 3;
  // Warps per decode attention block: 4, 8, or 0 for 8 where the rows' (row, KV head) pairs
  // alone fill the SMs and 4 elsewhere. The warps take a split's tiles of tokens in turn.
  // H200, 8B Q4_0 at 160 tokens of context, ms per step 4 / auto: 1 row 1.854 / 1.842, 8 rows
  // 3.371 / 3.351, 32 rows 5.804 / 5.727; 32 chats 5,473 / 5,501 t/s (PERF_NOTES, session 6).
  int attention_warps = 0;
  // The tokens a split of one-row decode attention starts from (the kernel makes splits larger
  // only where the grid would outgrow attention_blocks_per_sm): past one split a row's KV heads
  // need the merge, a fence, a ticket and the last block's second pass. 64, 128, 256, 512 or
  // 1024; more rows keep 64.
  int one_row_split_tokens = 64;
  // What decode attention (attention.cu) does before its PDL wait, a bit mask: 1, blocks with no
  // tokens leave at once instead of waiting for the previous kernel (block 0 of the grid always
  // waits, so the grid still cannot complete before the kernel it follows); 2, each warp requests
  // its first tile's K and V for the tokens that earlier steps wrote (below length - rows: a row's
  // new tokens in this step are at most the launch's rows, all at the end of its length), so only q
  // and the newest tokens are read after the wait. The same output to the bit. H200, SmolLM2
  // shapes, batch 1, t/s: 3 alone 2,882-2,898 against 2,839-2,893 for 0 at depth 0, 2,382 against
  // 2,343 at depth 300 (session 12, wave31b); it is part of the three knobs that cross 3,000
  // together (split_rows).
  int attention_early = 3;
  // Where batch-1 kernels let the next kernel start (griddepcontrol.launch_dependents), which
  // lets it request its weights that much earlier; the next kernel's wait still waits for this
  // one to complete, and every block of this one still waits for the kernel before it, so the
  // order of the step is unchanged: 0 after their wait; 1 before it for the one-row split products
  // with int8 results (under the fusion the output, gate/up and down projections), so that the
  // gate/up product and the next layer's Q/K/V, whose kernels before them are short, start during
  // the long ones before those; 2 also every other one-row split product (Q/K/V, the head) and
  // decode attention. Measured slower, so 0: H200, SmolLM2 shapes, batch 1, t/s: alone 1:
  // 2,772-2,825, 2: 2,767-2,769 against 2,839-2,893 (wave31b); beside the other three, 1:
  // 2,987-3,006 and 2: 2,909-2,915 against 3,006-3,020 without it (session 12, wave33). The next
  // kernel's early weight loads compete with the running kernel's for the same HBM, which is the
  // bound of both.
  int early_trigger = 0;
  // Batch-1 split products whose input hands its RMSNorm's 1/rms over (decode_fusion): each
  // lane requests its share of the input's sums of squares with the activations and reduces
  // them once its dot products are done, instead of reducing them first (whose warp sum keeps
  // the activation loads behind it: two L2 round trips in a row after the wait, ptxas sm_90).
  // The same sums in the same order, so the same bits. H200, SmolLM2 shapes, batch 1: within
  // noise alone (2,883-2,889 t/s against 2,839-2,893, wave31b), part of the three that cross
  // 3,000 together (split_rows, session 12).
  bool late_norm = true;
  // Decode steps whose graph carries its own copies: the step's inputs from the pinned mirror
  // at the graph's start and the sampled tokens back at its end, instead of a copy queued
  // before the replay and another after it (two fewer operations the device waits for between
  // the host's calls). Greedy and sampled heads; the logits head downloads as before. H200,
  // SmolLM2 shapes, batch 1, t/s, same call: 3,002 / 3,062 with it against 3,006 / 3,020
  // without (the other defaults on), 2,811 / 2,850 against 2,807 / 2,812 (session 11's
  // defaults): no loss, up to +1.4 % (session 12, wave33).
  bool graph_io = true;
  // Batch-1 decode with every layer matrix split and read as int8 blocks: 1 hands each
  // RMSNorm's input over in the epilogue of the product before it (the output projection and
  // the down projection quantise y·w of their 32-row blocks and write Σ y²; the next product
  // applies the 1/rms), which drops the two norm kernels of a layer but the first one; 2 also
  // quantises the SwiGLU result in the gate/up epilogue where its 32-row blocks fit one wave
  // on the SMs (no quantisation kernel); 3 also does RoPE and the K/V write in the Q/K/V
  // product's epilogue for models with adjacent rotation pairs and no per-head Q/K norm (no
  // rope_kv kernel). 0 off. H200, ms per batch-1 step, 8B Q4_0 / SmolLM2 shapes: off 1.691 /
  // 0.483, 1: 1.629 / 0.468, 2: 1.630 / 0.449 (one call), 2 against 3 in another: 1.637-1.647
  // / 0.460 against 1.604-1.628 / 0.438-0.440 (PERF_NOTES, session 7). 4 also hands the
  // step's first norm over from the embedding gather and the output norm from the last down
  // projection, where the output head takes the split kernels: no norm kernel left in the step.
  int decode_fusion = 4;
  // Batch-1 split-layout products in warps that stay for the whole launch (matvec_split.cu,
  // split_rows_kernel): a grid of the blocks the SMs hold at once, warp w taking rows w,
  // w + warps, ... with the next row's first weights requested while it finishes the current
  // one, instead of a block per 4 rows. 1: plain products only (with the fusion: the 8B
  // model's gate/up, and the output head); those with int8 results or RoPE in the epilogue
  // keep their blocks. 2 also gives a product with int8 results whose 32-row blocks outnumber
  // the SMs (the 8B model's gate/up under decode_fusion 2+; Q4_0 and Q4_1) blocks of 8 such
  // warps that own one 32-row block each and quantise it (split_owned_kernel), so the SwiGLU
  // result needs no quantisation kernel at any size. Same sums to the bit. 0 off. H200, 8B
  // Q4_0, ms per batch-1 step, same calls: 1 against 0: 1.595 / 1.607 against 1.603 / 1.606
  // (SmolLM2 tg64 0.447-0.448 against 0.452-0.454); 2 against 1: 1.616 / 1.617 / 1.620
  // against 1.666 / 1.663 / 1.663, and 1.618 / 1.598 / 1.606 against 1.664 / 1.650 / 1.647
  // (PERF_NOTES, session 8). 3 also takes the plain products whose rows fit two 32-lane steps
  // (at most 2,048 wide: a SmolLM2-sized model's output head and last down projection) in
  // split_rows_short_kernel, whose warps keep 4 (one step) or 2 (two steps) rows' weights in
  // flight and read their activations once; the same sums to the bit. H200, SmolLM2 shapes, ms
  // per batch-1 step, 2 against 3: 0.365 / 0.364 against 0.356 / 0.359 (PERF_NOTES, session 10).
  // 4 also runs the Q4_0/Q4_1 one-row products of at most 32 sub-blocks (576 wide) at one
  // sub-block per lane and step: at two, the 32-warp SwiGLU kernel spills 48 bytes of payloads
  // it never loads. H200, SmolLM2 shapes, batch 1, t/s: 4 alone 2,841-2,898 against 2,839-2,893
  // (wave31b, within noise); 4 with late_norm and attention_early 3: 3,006 / 3,020 against
  // 2,807 / 2,812 for session 11's defaults in the same call (session 12, wave33); 8B Q4_0
  // unchanged (660.8-664.2 against 665.1-665.6 with the early trigger also on).
  int split_rows = 4;
};

}  // namespace granule::kernels
