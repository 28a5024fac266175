// Qwen3.5 hybrids (issue 37) the CUDA backend cannot run: the tiny presets' heads of 32 are
// refused in one line (cuda_model_refusal, and DeviceError from Device Cuda), and Device Auto runs
// them on the CPU reference, whose logits the refusal leaves untouched. The same layers at GPU
// shapes are not refused (qwen35_gpu_test.cpp runs them), nor is qwen35moe at those shapes
// (moe_model_gpu_test.cpp runs it), its shared expert CudaMoe's to run or refuse.
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

std::string refusal_of(const SyntheticModelSpec& spec) {
  test::TempModel model(spec, "qwen35-refusal");
  auto file = ModelFile::open(model.path);
  const ModelConfig config = ModelConfig::from_gguf(*file);
  const WeightTable weights = WeightTable::from_gguf(*file, config);
  return cuda_model_refusal(config, weights);
}

// Needs no GPU: the refusal is a property of the model.
TEST_P(Qwen35Refusal, CudaRefusesTheTinyHeadsInOneLine) {
  const std::string why = refusal_of(SyntheticModelSpec::preset(GetParam()));
  EXPECT_NE(why.find("head sizes 64, 128 and 256"), std::string::npos) << why;
  EXPECT_NE(why.find("not 32"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos);
}

// The hybrid layers at GPU shapes (heads of 128 with a partial rope, DeltaNet heads of 64) are
// not refused (qwen35moe too); a DeltaNet head size the kernels lack is,
// by name.
TEST(Qwen35CudaShapes, GpuShapesRunAndOddStateSizesAreRefused) {
  SyntheticModelSpec s = SyntheticModelSpec::preset("tiny-qwen35");
  gpu_test::qwen35_kernel_widths(s);
  EXPECT_EQ(refusal_of(s), "");
  SyntheticModelSpec moe = s;
  moe.architecture = "qwen35moe";
  moe.n_expert = 8;
  moe.n_expert_used = 2;
  moe.n_ff_exp = 32;
  moe.n_ff_shexp = 64;
  EXPECT_EQ(refusal_of(moe), "");
  s.ssm_state_size = 48;
  EXPECT_NE(refusal_of(s).find("Gated DeltaNet heads of 16, 32, 64 or 128, not 48"),
            std::string::npos)
      << refusal_of(s);
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
