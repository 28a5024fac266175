// Helpers for the GPU tests: skip without a GPU, the kernel configuration, device arrays with
// an RAII owner, poisoned outputs (NaN bytes, so an element a kernel forgot to write fails
// every comparison), seeded random inputs, the top-two margin of a logit row, a suite over the
// synthetic model at the default model's shapes, and the per-test watchdog (gpu_watchdog.h).
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backends/kernel_config_env.h"
#include "common.cuh"
#include "gpu_watchdog.h"
#include "granule/testkit/synthetic_model.h"

namespace granule::gpu_test {

inline bool gpu_present(std::string* why) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    *why = std::string("no usable CUDA driver or GPU: ") + cudaGetErrorString(status);
    return false;
  }
  if (count == 0) {
    *why = "no CUDA GPU present";
    return false;
  }
  return true;
}

#define GRANULE_REQUIRE_GPU()                                  \
  do {                                                         \
    std::string granule_gpu_why;                               \
    if (!::granule::gpu_test::gpu_present(&granule_gpu_why))   \
      GTEST_SKIP() << "GPU test skipped: " << granule_gpu_why; \
  } while (0)

// The kernel configuration the CUDA backend would run with here: the defaults with the
// GRANULE_* environment overrides (so a knob set in front of run_on_h200.sh reaches the kernel
// tests), fitted to the device.
inline kernels::KernelConfig kernel_config() {
  kernels::KernelConfig config = kernel_config_from_environment();
  const cudaError_t status = kernels::fit_to_device(config);
  if (status != cudaSuccess) ADD_FAILURE() << "fit_to_device: " << cudaGetErrorString(status);
  return config;
}

#define CUDA_OK(expr) \
  ASSERT_EQ((expr), cudaSuccess) << #expr << ": " << cudaGetErrorString(cudaGetLastError())

// A device array owning its memory; copies to and from host vectors.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) : n_(n) {
    if (n && cudaMalloc(&ptr_, n * sizeof(T)) != cudaSuccess)
      throw std::runtime_error("cudaMalloc failed");
  }
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host); }
  ~DeviceArray() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : ptr_(o.ptr_), n_(o.n_) {
    o.ptr_ = nullptr;
    o.n_ = 0;
  }

  T* get() const { return ptr_; }
  size_t size() const { return n_; }
  void upload(const std::vector<T>& host) {
    if (cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice) !=
        cudaSuccess)
      throw std::runtime_error("upload failed");
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (cudaDeviceSynchronize() != cudaSuccess ||
        cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess)
      throw std::runtime_error("download failed");
    return host;
  }
  void poison() { cudaMemset(ptr_, 0xFF, n_ * sizeof(T)); }  // NaN for floats, -1 for ints

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A logit row's greedy choice and how clear it is: rows whose margin is within the error
// bound are near-ties, where a GPU may pick another token than the CPU.
struct TopTwo {
  int32_t best = 0;   // index of the largest logit, the first on a tie
  double margin = 0;  // largest minus second-largest logit (0 when two are equal), exact
};

// The row needs at least two logits.
inline TopTwo top_two(std::span<const float> row) {
  int32_t best = 0;
  float second = -INFINITY;
  for (size_t i = 1; i < row.size(); ++i) {
    if (row[i] > row[static_cast<size_t>(best)]) {
      second = row[static_cast<size_t>(best)];
      best = static_cast<int32_t>(i);
    } else if (row[i] > second) {
      second = row[i];
    }
  }
  return {best, static_cast<double>(row[static_cast<size_t>(best)]) - second};
}

// A suite over the synthetic model at the default model's shapes (the smollm2-135m preset),
// written once for the suite when a GPU is present (else each test skips) and removed after.
class SmolLM2ShapesSuite : public ::testing::Test {
 public:
  // One file per process: ctest runs each test of a suite in its own process, in parallel.
  static std::filesystem::path model_path() {
    return std::filesystem::temp_directory_path() /
           ("granule-gpu-test-smollm2-135m-" + std::to_string(getpid()) + ".gguf");
  }

 protected:
  static void SetUpTestSuite() {
    if (std::string why; gpu_present(&why))
      write_synthetic_model(SyntheticModelSpec::preset("smollm2-135m"), model_path());
  }
  static void TearDownTestSuite() { std::filesystem::remove(model_path()); }
};

// The widths of a Qwen3.5-shaped file (dense or MoE) that the CUDA kernels take: hidden 256,
// attention heads of 128 with a 32-dimension section rope, FFN 512, DeltaNet states of 64.
inline void qwen35_kernel_widths(SyntheticModelSpec& s) {
  s.n_embd = 256;
  s.head_dim = 128;
  s.rope_dims = 32;
  s.rope_sections = {6, 5, 3, 2};
  s.n_ff = 512;
  s.ssm_state_size = 64;
}

// The whole-model GPU tests' heads and vocabulary: 4 query heads over 2 KV heads, Gated DeltaNet
// layers of 2 key / 4 value heads, vocabulary 1000.
inline void qwen35_model_heads(SyntheticModelSpec& s) {
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_vocab = 1000;
  s.ssm_n_k_heads = 2;
  s.ssm_n_v_heads = 4;
}

// A Qwen3.5-shaped hybrid at shapes the CUDA kernels take (heads of 128, DeltaNet states of 64),
// from the tiny-qwen35 preset: the GPU tests' dense Qwen3.5 file.
inline SyntheticModelSpec qwen35_spec(TensorType type) {
  SyntheticModelSpec s = SyntheticModelSpec::preset("tiny-qwen35");
  s.name = "tiny-qwen35-gpu";
  qwen35_kernel_widths(s);
  qwen35_model_heads(s);
  s.weight_type = type;
  s.embedding_type = type;
  s.output_type = type;
  return s;
}

}  // namespace granule::gpu_test
