// What the tensor-core product tests share (matvec_mma_kernel_test.cpp,
// matvec_f16mma_kernel_test.cpp): a random quantised matrix in GGUF blocks and in the split
// layout the kernels read, an output with a poisoned guard column past the batch, the task of
// one matrix, and the parametrised shapes.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_support.h"
#include "granule/quant.h"
#include "granule/tensor_type.h"
#include "granule/testkit/quantize.h"
#include "matvec.cuh"
#include "model/weight_split.h"

namespace granule::mma_test {

constexpr uint32_t kPoisonBits = 0xFFFFFFFFu;

// A random matrix in GGUF blocks and in the split layout the kernels read (with 16 bytes of
// slack after it, as the model keeps after every tensor).
struct Matrix {
  TensorType type;
  int64_t rows = 0, cols = 0;
  int64_t gguf_row_bytes = 0, split_row_bytes = 0;
  std::vector<uint8_t> gguf;
  gpu_test::DeviceArray<uint8_t> device;

  Matrix(TensorType t, int64_t n_rows, int64_t n_cols, std::vector<uint8_t> gguf_bytes)
      : type(t),
        rows(n_rows),
        cols(n_cols),
        gguf_row_bytes(static_cast<int64_t>(row_bytes(t, n_cols))),
        split_row_bytes(split_row_stride(static_cast<uint32_t>(t), n_cols)),
        gguf(std::move(gguf_bytes)),
        device(split_of(t, n_rows, n_cols, gguf)) {}

  static std::vector<uint8_t> split_of(TensorType t, int64_t n_rows, int64_t n_cols,
                                       const std::vector<uint8_t>& gguf_bytes) {
    const int64_t stride = split_row_stride(static_cast<uint32_t>(t), n_cols);
    std::vector<uint8_t> split(static_cast<size_t>(n_rows * stride) + 16, 0xEE);
    split_rows(static_cast<uint32_t>(t), gguf_bytes.data(), n_rows, n_cols, split.data());
    return split;
  }
};

// Normal weights (sd 0.5) quantised to `type`; every 7th row (from 3) has a zero sub-block
// (d = 0); with `tiny`, every 11th row (from 5) has a sub-block of weights 1e-4 as large (f16
// subnormal products).
inline Matrix make_matrix(TensorType type, int64_t rows, int64_t cols, uint32_t seed,
                          bool tiny = false) {
  std::mt19937 rng(seed);
  const int64_t gguf_row_bytes = static_cast<int64_t>(row_bytes(type, cols));
  std::vector<uint8_t> gguf(static_cast<size_t>(rows * gguf_row_bytes));
  std::normal_distribution<float> dist(0.0f, 0.5f);
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = dist(rng);
    if (r % 7 == 3)  // a zero sub-block: d = 0
      std::fill_n(row.begin() + (r / 7 % (cols / 32)) * 32, 32, 0.0f);
    if (tiny && r % 11 == 5)
      for (int i = 0; i < 32; ++i)
        row[static_cast<size_t>((r / 11 % (cols / 32)) * 32 + i)] *= 1e-4f;
    quantize_row(type, row.data(), gguf.data() + r * gguf_row_bytes, cols);
  }
  return Matrix(type, rows, cols, std::move(gguf));
}

// y for `batch` columns with one extra poisoned column after them, which no kernel may write.
struct Output {
  gpu_test::DeviceArray<float> y;
  int64_t rows;
  Output(int64_t n_rows, int batch) : y(static_cast<size_t>((batch + 1) * n_rows)), rows(n_rows) {
    y.poison();
  }
};

// The elements of the guard column (column `batch`) that are no longer the poison.
inline int written_past(const std::vector<float>& y, int64_t rows, int batch) {
  int written = 0;
  for (int64_t r = 0; r < rows; ++r) {
    uint32_t bits;
    std::memcpy(&bits, &y[static_cast<size_t>(batch * rows + r)], sizeof(bits));
    written += bits != kPoisonBits;
  }
  return written;
}

inline kernels::MatvecTask task_for(const Matrix& m, float* y) {
  kernels::MatvecTask t;
  t.weight = m.device.get();
  t.row_bytes = m.split_row_bytes;
  t.split_layout = true;
  t.n_out = static_cast<int>(m.rows);
  t.y = y;
  t.y_stride = m.rows;
  return t;
}

struct Shape {
  TensorType type;
  int64_t rows, cols;
};

inline std::string shape_name(const ::testing::TestParamInfo<Shape>& info) {
  const Shape& s = info.param;
  return std::string(tensor_type_info(s.type).name) + "_" + std::to_string(s.rows) + "x" +
         std::to_string(s.cols);
}

}  // namespace granule::mma_test
