// DeviceKind::Auto in a CUDA build: with a usable GPU the engine runs on it; without one (the
// development machines: CUDA toolkit, no GPU) it falls back to the CPU backend and works,
// while DeviceKind::Cuda fails with a DeviceError. A build without CUDA has no fallback to
// test: the test is skipped, saying so.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <iostream>
#include <string>

#include "backends/backend.h"
#include "granule/engine.h"
#include "granule/error.h"
#include "granule/testkit/synthetic_model.h"

namespace granule {
namespace {

namespace fs = std::filesystem;

TEST(DeviceAutoFallback, CudaBuildPicksTheGpuOrFallsBackToTheCpu) {
#ifndef GRANULE_HAVE_CUDA
  GTEST_SKIP() << "skipped: built without CUDA, so Auto has no GPU backend to fall back from";
#else
  std::string no_gpu_reason;
  try {
    const CudaDeviceInfo info = probe_cuda_device();
    std::cout << "[auto] GPU present: " << info.name << "\n";
  } catch (const DeviceError& e) {
    no_gpu_reason = e.what();
    std::cout << "[auto] no usable GPU: " << no_gpu_reason << "\n";
  }
  const fs::path path =
      fs::temp_directory_path() / ("granule-auto-fallback-" + std::to_string(getpid()) + ".gguf");
  // "small-256": the smallest shapes the GPU kernels run ("tiny"'s heads of 16 are CPU-only,
  // so Auto would rightly pick the CPU for it on any machine).
  write_synthetic_model(SyntheticModelSpec::preset("small-256"), path);
  EngineOptions options;
  options.device = DeviceKind::Auto;
  options.context_length = 128;
  options.cpu_threads = 2;
  std::unique_ptr<Engine> engine;
  ASSERT_NO_THROW(engine = Engine::open(path, options));
  const std::string name = engine->device_name();
  std::cout << "[auto] Engine::open(Auto) runs on " << name << "\n";
  const std::vector<int32_t> tokens = {5, 17, 42, 99, 7};
  const auto logits = engine->logits_for(tokens);
  ASSERT_EQ(logits.size(), tokens.size());
  ASSERT_EQ(logits[0].size(), static_cast<size_t>(engine->config().n_vocab));
  if (no_gpu_reason.empty()) {
    EXPECT_EQ(name.rfind("CUDA", 0), 0u) << "a GPU is usable, yet Auto picked " << name;
  } else {
    EXPECT_EQ(name.rfind("CPU", 0), 0u) << "no GPU, yet Auto runs on " << name;
    // The fallback is the CPU backend itself: the same logits as asking for the CPU.
    options.device = DeviceKind::Cpu;
    EXPECT_EQ(Engine::open(path, options)->logits_for(tokens), logits);
    // Asking for CUDA explicitly is a clear error, not a silent CPU.
    options.device = DeviceKind::Cuda;
    try {
      Engine::open(path, options);
      ADD_FAILURE() << "DeviceKind::Cuda opened without a GPU";
    } catch (const DeviceError& e) {
      const std::string message = e.what();
      EXPECT_FALSE(message.empty());
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
      std::cout << "[auto] DeviceKind::Cuda: " << message << "\n";
    }
  }
  fs::remove(path);
#endif
}

}  // namespace
}  // namespace granule
