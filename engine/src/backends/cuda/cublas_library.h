// cuBLAS loaded at run time with dlopen (the toolkit has no static cuBLAS, and the app must
// start on machines without CUDA libraries): the handful of entry points prefill's GEMMs
// use, behind an RAII handle bound to one stream.
#pragma once
#include <cublas_api.h>
#include <cuda_runtime.h>

#include <string>

namespace granule::cuda {

class CublasLibrary;

class Cublas {
 public:
  // Loads libcublas.so.13 (once per process) and creates a handle on `stream`.
  // Throws DeviceError naming the library when it cannot be loaded.
  explicit Cublas(cudaStream_t stream);
  ~Cublas();
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;

  // C (m × n, column-major, f32, ldc) = alpha · op(A) · op(B) + beta · C with f16 A and B,
  // accumulated in f32 (cublasGemmEx).
  void gemm_f16_f32(cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k,
                    float alpha, const void* a, int lda, const void* b, int ldb, float beta,
                    float* c, int ldc);

  // Where the library came from (for the log).
  static std::string library_path();

 private:
  const CublasLibrary& lib_;
  cublasHandle_t handle_ = nullptr;
};

}  // namespace granule::cuda
