// KernelConfig: the choices the CUDA kernels still have, each with its default: a GRANULE_*
// variable (parsed in engine/src/backends/kernel_config_env.cpp; kernels/README.md's table has
// each one's values and measured reason) or what the device can run (fit_to_device() and the
// backend's checks). Everything that was measured and lost is gone; what won is the code.
// Plain C++ (also compiled as CUDA C++17), so host code and tests without a GPU share it.
#pragma once

namespace granule::kernels {

struct KernelConfig {
  // Programmatic dependent launch (launch_early, common.cuh): a kernel may start while the
  // one before it finishes. Needs compute capability 9.0; fit_to_device() turns it off below.
  bool early_launch = true;
  // Q4_0/Q4_1/Q8_0/Q6_K weights re-laid out at upload (split_layout.h) rather than kept in
  // GGUF blocks; the matvec kernels read whichever layout a matrix has.
  bool split_weights = true;
  // Int8 tensor-core products (matvec_mma.cu, compute capability 8.0+) for split-layout
  // Q4_0/Q4_1/Q8_0 matrices once a run has mma_min_rows rows; fewer take the dp4a kernels.
  // Runs of more than 64 rows (prefill) take them only with mma_prefill, else dequantise +
  // cuBLAS. The backend turns mma off on devices without it (matvec_mma_fits_device()).
  // 0 off, 1 version 1 (block-wide shared-memory stages), 2 version 2 (warp-pipelined; a
  // device without its shared memory runs version 1). kernels/PERF_NOTES.md compares them.
  // H200, 8B Q4_0 decode t/s, v2 / v1 / dp4a: 8 rows 2,296 / 1,645 / 1,611; 32 rows 4,162 /
  // 3,072 / 1,605; 64 rows 5,003 / 3,820 / 1,592 (PERF_NOTES).
  int mma = 2;
  // Occupancy variant of version 2 for runs of 9-64 rows (matvec_mma.cu, Occupancy<>): 0 the
  // kernel as measured (26 KB ring per warp, 2 blocks of 4 warps or 1 of 8 per SM); 1 a ring
  // of up to 18.75 KB per warp, 3 blocks of 4 warps per SM (registers <= 168) or 12-warp
  // blocks where a launch has no more blocks than SMs (wo, down); 2 up to 14 KB per warp, 4
  // blocks of 4 warps (registers <= 128) or 16-warp blocks. 1 and 2 take 64 columns as two
  // 32-column tiles. For a sweep on the device (issue 15: 8 warps per SM are latency-bound).
  int mma_occupancy = 0;
  int mma_min_rows =
      8;  // H200, 8B Q4_0: at 4 rows mma v1 892 t/s vs dp4a 1,328; at 8, 1,684 vs 1,611
  bool mma_prefill = false;
  // Runs of more than 64 rows (prefill) take the f16 tensor-core flash-attention kernel
  // (attention_prefill.cu, compute capability 8.0+) for runs of rows of one sequence; single
  // rows of other sequences in the same run keep the flash-decoding kernel (attention.cu).
  // The backend turns it off on devices without it.
  bool flash_prefill = true;
  // Decode runs of at least this many rows (and at most 64) take the f16 tensor-core products
  // (matvec_f16mma.cu) where every matrix of the layer is split Q4_0/Q4_1: activations in f16,
  // weights dequantised to f16 in registers, no per-block epilogue. 0 off. The backend turns it
  // off on devices without f16 mma. H200, 8B Q4_0, decode ms per step int8 / f16: 16 rows
  // 3.83 / 3.95, 20 rows 6.86 / 5.28, 32 rows 6.88 / 5.31, 64 rows 10.51 / 8.83 (PERF_NOTES).
  // 17 is where they win (16 columns still fit the int8 kernels' 16-column tiles). The CPU
  // oracle rounds such runs as this path does (cpu_backend.cpp).
  int f16_mma_min_rows = 17;
  // The f16 products at 9-64 columns as 64-row tiles split over 2-4-block clusters (sm_90).
  // Measured slower on the H200 (8B Q4_0, 32 rows: 7.35 ms per step against 5.31): off.
  bool f16_mma_clusters = false;
  // The f16 products at 17-64 columns in the shared-activation shapes (matvec_f16mma.cu: a
  // block's warps split the rows and read one copy of each stage's activations), for the SwiGLU
  // gate+up product and for the plain ones (QKV, wo, down): 0 round 1's shapes, 1-9 the
  // shapes (MT, WR, WK; stages 4) (2, 4, 1), (4, 2, 1), (2, 2, 2), (4, 2, 2), (2, 4, 2),
  // (2, 2, 4), and (2, 2, 2) split over clusters of 4 blocks (7), with 3 stages (8), over 8
  // blocks with 3 stages (9). A shape the device cannot run (clusters below compute
  // capability 9.0) falls back to round 1's.
  // H200, 8B Q4_0, 32 columns, µs per launch (round 1 / the best shape): gate+up 57.9 / 49.6
  // (shape 5), QKV 20.1 / 19.3 (6), wo 12.5 / 18.6 (6), down 30.8 / 53.6 (6): the plain products
  // of 4096 rows have too few row blocks to share activations, so they keep round 1's shapes.
  // 32-row decode step at 160 tokens of context 5.752 -> 5.459 ms with gate+up in shape 5.
  int f16_mma_shared_gate_up = 5;
  int f16_mma_shared_plain = 0;
};

}  // namespace granule::kernels
