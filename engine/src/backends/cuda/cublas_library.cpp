// dlopen of libcublas.so.13 and the typed entry points Cublas calls.
#include "backends/cuda/cublas_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include "granule/error.h"
#include "granule/log.h"

namespace granule::cuda {

class CublasLibrary {
 public:
  using CreateFn = cublasStatus_t (*)(cublasHandle_t*);
  using DestroyFn = cublasStatus_t (*)(cublasHandle_t);
  using SetStreamFn = cublasStatus_t (*)(cublasHandle_t, cudaStream_t);
  using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                      int, int, const void*, const void*, cudaDataType, int,
                                      const void*, cudaDataType, int, const void*, void*,
                                      cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);

  CreateFn create = nullptr;
  DestroyFn destroy = nullptr;
  SetStreamFn set_stream = nullptr;
  GemmExFn gemm_ex = nullptr;
  std::string path;

  static const CublasLibrary& get() {
    static std::once_flag once;
    static CublasLibrary* lib = nullptr;
    static std::string error;
    std::call_once(once, [] {
      try {
        lib = new CublasLibrary();  // lives for the process: the library stays loaded
      } catch (const Error& e) {
        error = e.what();
      }
    });
    if (!lib) throw DeviceError(error);
    return *lib;
  }

 private:
  CublasLibrary() {
    std::vector<std::string> candidates = {"libcublas.so.13"};
    if (const char* home = std::getenv("CUDA_HOME"))
      candidates.push_back(std::string(home) + "/lib64/libcublas.so.13");
    candidates.push_back("/usr/local/cuda/lib64/libcublas.so.13");
    for (const std::string& c : candidates) {
      handle_ = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle_) {
        path = c;
        break;
      }
    }
    if (!handle_)
      throw DeviceError(
          "cannot load cuBLAS (libcublas.so.13): install the CUDA 13 runtime libraries");
    create = symbol<CreateFn>("cublasCreate_v2");
    destroy = symbol<DestroyFn>("cublasDestroy_v2");
    set_stream = symbol<SetStreamFn>("cublasSetStream_v2");
    gemm_ex = symbol<GemmExFn>("cublasGemmEx");
  }

  template <typename F>
  F symbol(const char* name) {
    void* p = dlsym(handle_, name);
    if (!p) throw DeviceError(std::string("cuBLAS at ") + path + " has no " + name);
    return reinterpret_cast<F>(p);
  }

  void* handle_ = nullptr;
};

namespace {

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw DeviceError(std::string("cuBLAS error in ") + what + ": status " +
                      std::to_string(static_cast<int>(status)));
}

}  // namespace

Cublas::Cublas(cudaStream_t stream) : lib_(CublasLibrary::get()) {
  check_cublas(lib_.create(&handle_), "cublasCreate");
  check_cublas(lib_.set_stream(handle_, stream), "cublasSetStream");
}

Cublas::~Cublas() {
  if (handle_) {
    const cublasStatus_t status = lib_.destroy(handle_);
    if (status != CUBLAS_STATUS_SUCCESS)
      logger("engine.cuda")
          ->warn("cublasDestroy failed during teardown: status {}", static_cast<int>(status));
  }
}

void Cublas::gemm_f16_f32(cublasOperation_t op_a, cublasOperation_t op_b, int m, int n, int k,
                          float alpha, const void* a, int lda, const void* b, int ldb, float beta,
                          float* c, int ldc) {
  check_cublas(
      lib_.gemm_ex(handle_, op_a, op_b, m, n, k, &alpha, a, CUDA_R_16F, lda, b, CUDA_R_16F, ldb,
                   &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx");
}

std::string Cublas::library_path() { return CublasLibrary::get().path; }

}  // namespace granule::cuda
