// Qwen3.5 hybrids (issue 37) until their GPU part lands: the CUDA backend refuses `qwen35` and
// `qwen35moe` in one line (cuda_model_refusal, and DeviceError from Device Cuda), and Device
// Auto runs them on the CPU reference, whose logits the refusal leaves untouched.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backends/backend.h"
#include "gpu_test_support.h"
#include "granule/error.h"
#include "granule/gguf.h"
#include "granule/model_config.h"
#include "granule/testkit/synthetic_model.h"
#include "runtime/runtime.h"
#include "support/model_runtime.h"
#include "support/temp_model.h"

namespace granule {
namespace {

class Qwen35Refusal : public ::testing::TestWithParam<std::string> {};

// Needs no GPU: the refusal is a property of the model.
TEST_P(Qwen35Refusal, CudaRefusesTheHybridInOneLine) {
  test::TempModel model(SyntheticModelSpec::preset(GetParam()), "qwen35-refusal");
  auto file = ModelFile::open(model.path);
  const ModelConfig config = ModelConfig::from_gguf(*file);
  const WeightTable weights = WeightTable::from_gguf(*file, config);
  const std::string why = cuda_model_refusal(config, weights);
  EXPECT_NE(why.find("Gated DeltaNet"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos);
}

// With a GPU: Device Cuda throws DeviceError; Device Auto takes the CPU and runs a step.
TEST_P(Qwen35Refusal, DeviceCudaThrowsAndAutoRunsOnTheCpu) {
  GRANULE_REQUIRE_GPU();
  test::TempModel model(SyntheticModelSpec::preset(GetParam()), "qwen35-auto");
  auto file = ModelFile::open(model.path);
  const ModelConfig config = ModelConfig::from_gguf(*file);
  const WeightTable weights = WeightTable::from_gguf(*file, config);
  RuntimeOptions options = test::cpu_runtime_options(2, 64);
  options.device = DeviceKind::Cuda;
  EXPECT_THROW(make_runtime(*file, config, weights, options), DeviceError);
  options.device = DeviceKind::Auto;
  test::ModelRuntime automatic(model.path, options);
  EXPECT_FALSE(automatic.backend->is_gpu());
  test::ModelRuntime cpu(model.path, test::cpu_runtime_options(2, 64));
  const std::vector<int32_t> prompt = {1, 45, 300, 7};
  EXPECT_EQ(automatic.run(0, prompt, 0, false), cpu.run(0, prompt, 0, false));
}

INSTANTIATE_TEST_SUITE_P(Presets, Qwen35Refusal, ::testing::Values("tiny-qwen35", "tiny-qwen35moe"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace granule
