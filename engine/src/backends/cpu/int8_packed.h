// A weight matrix in the CPU fast path's own layout (the int8 matmul of int8_matmul.h),
// repacked once at load into groups of 8 rows whose blocks are interleaved 4 bytes per row, so
// one 32-byte register holds 4 values of each of the 8 rows and one broadcast activation load
// serves all 8 (one row per 32-bit lane: the lanes are the rows' sums, so no horizontal sums
// and one scale per 8 rows). Every type int8_matmul_supports: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backends/cpu/int8_matmul.h"
#include "granule/tensor_type.h"

namespace granule::cpu {

class Int8Weights {
 public:
  static constexpr int64_t kGroupRows = 8;

  // Whether the fast path runs a matrix of `type` with rows of n_cols (int8_matmul_supports).
  static bool supports(TensorType type, int64_t n_cols);
  // Whether `type` has the 8-row layout (every type supports() accepts on this CPU).
  static bool packs(TensorType type);

  // Repacks the rows × n_cols matrix at w: the file's bytes (Q4_K/Q5_K 3 %, Q3_K 3.6 %, IQ4_XS
  // 1.5 % more: their scales unpacked), zeros for the last group's missing rows. Only where
  // supports(type, n_cols).
  Int8Weights(TensorType type, const void* w, int64_t rows, int64_t n_cols);

  // y[t * y_stride + r] = row r · x_t for rows [row_begin, row_end) and tokens [0, n_tokens)
  // (row r of the rows × n_cols matrix, x_t the n_cols / 32 blocks at xq + t * n_cols / 32).
  // Each output is the same sum in the same order whatever the row
  // range and token count: a batch gives each sequence what it gets alone.
  void matmul_rows(int64_t row_begin, int64_t row_end, const ActivationBlock* xq, int64_t n_tokens,
                   float* y, int64_t y_stride) const;

  // Whether the products run on VNNI on this CPU (AVX512-VNNI with 256-bit vectors, else
  // AVX-VNNI, its VEX form): the Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4, Q4_K, Q5_K,
  // IQ4_XS and Q6_K tiles' integer sums in one instruction a chunk. Q2_K and Q3_K (their i16
  // sums are scaled per 16 values in the madd) and CPUs without it take the AVX2 sums. Same bits
  // either way.
  static bool has_vnni();
  // Tests only: run the products' sums in this form (false where the CPU lacks it, and nothing
  // changes), then use_best_dot() to return to the form the CPU's best.
  enum class DotForm { Avx2, Avx512Vnni, AvxVnni };
  static bool use_dot_for_testing(DotForm form);
  static void use_best_dot();

  TensorType type() const { return type_; }
  int64_t rows() const { return rows_; }
  size_t packed_bytes() const { return packed_.size(); }

 private:
  TensorType type_;
  int64_t rows_ = 0, cols_ = 0;
  std::vector<uint8_t> packed_;
};

}  // namespace granule::cpu
