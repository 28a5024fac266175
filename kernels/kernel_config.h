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
  // Decode runs of at least this many rows (and at most 64) take the f16 tensor-core products
  // (matvec_f16mma.cu) where every matrix of the layer is split Q4_0/Q4_1: activations in f16,
  // weights dequantised to f16 in registers, no per-block epilogue. 0 off. The backend turns it
  // off on devices without f16 mma. H200, 8B Q4_0, decode ms per step int8 / f16: 16 rows
  // 3.83 / 3.95, 20 rows 6.86 / 5.28, 32 rows 6.88 / 5.31, 64 rows 10.51 / 8.83.
  // 17 is where they win (16 columns still fit the int8 kernels' 16-column tiles). The SwiGLU
  // gate+up product at 17-64 rows shares each stage's activations between 4 warps of rows
  // (32-row decode step 5.752 -> 5.459 ms). The CPU oracle rounds such runs as this path does
  // (cpu_backend.cpp).
  int f16_mma_min_rows = 17;
};

}  // namespace granule::kernels
