// Files that mix block types as llama-quantize writes them (Q4_K_M's Q5_0/Q5_1 fallbacks for
// rows that are not multiples of 256, Q6_K heads, and every newer block type in one model)
// open and run on the CPU backend: logits and greedy tokens match the float64 numpy
// reference run on the same file (weights dequantised by gguf.quants, independently of
// Granule), and equal, bit for bit, an F32 copy of the file whose weights are Granule's own
// dequantised values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "granule/gguf.h"
#include "granule/model_config.h"
#include "granule/quant.h"
#include "granule/testkit/gguf_writer.h"
#include "granule/testkit/synthetic_model.h"
#include "memory/kv_space.h"
#include "runtime/runtime.h"
#include "support/model_runtime.h"
#include "support/reference_golden.h"
#include "support/temp_model.h"

namespace granule {
namespace {

namespace fs = std::filesystem;
using test::ReferenceGolden;
using test::write_f32_copy;
using T = TensorType;

// A model file with its CPU backend and KV space (as the engine makes them).
struct CpuModel : test::ModelRuntime {
  explicit CpuModel(const fs::path& path) : ModelRuntime(path, test::cpu_runtime_options(1, 64)) {}
};

// Rows of 256 (the K quants' and IQ4_XS's block), 2 layers.
SyntheticModelSpec wide_spec(uint64_t seed) {
  SyntheticModelSpec s = SyntheticModelSpec::preset("tiny");
  s.n_embd = 256;
  s.n_ff = 512;
  s.n_head = 4;  // over tiny's 2 KV heads
  s.seed = seed;
  return s;
}

struct MixCase {
  std::string name;
  SyntheticModelSpec spec;
  std::set<TensorType> expected_types;  // the 2-D weight types the file must hold
};

std::vector<MixCase> mix_cases() {
  // Q4_K_M as llama-quantize mixes it, with the fallbacks it takes for rows that are not
  // multiples of 256 (Q5_0 for Q4_K, Q5_1 for Q5_K): here attn_q/attn_k and the gate/up
  // products as if their rows were short, Q6_K for attn_v, blk.0's ffn_down and the head.
  SyntheticModelSpec q4km = with_types(wide_spec(31), T::Q4_K, T::Q4_K, T::Q6_K);
  q4km.tensor_types = {{"attn_q.weight", T::Q5_0}, {"attn_k.weight", T::Q5_0},
                       {"attn_v.weight", T::Q6_K}, {"ffn_gate.weight", T::Q5_1},
                       {"ffn_up.weight", T::Q5_1}, {"blk.0.ffn_down.weight", T::Q6_K}};
  // Every newer block type in one forward pass, embeddings and head included.
  SyntheticModelSpec newer = with_types(wide_spec(32), T::Q5_0, T::Q3_K, T::IQ4_XS);
  newer.tensor_types = {{"attn_q.weight", T::Q2_K},        {"attn_k.weight", T::Q3_K},
                        {"attn_v.weight", T::IQ4_NL},      {"attn_output.weight", T::IQ4_XS},
                        {"ffn_gate.weight", T::MXFP4},     {"ffn_up.weight", T::Q5_1},
                        {"blk.1.ffn_down.weight", T::Q2_K}};
  return {
      {"mixed-q4_k_m", q4km, {T::Q4_K, T::Q5_0, T::Q5_1, T::Q6_K}},
      {"mixed-newer-types",
       newer,
       {T::Q5_0, T::Q5_1, T::Q2_K, T::Q3_K, T::IQ4_NL, T::IQ4_XS, T::MXFP4}},
  };
}

const std::vector<int32_t> kPrompt = {1, 45, 300, 7, 99, 256, 12, 3, 200, 150};
constexpr int kGreedy = 8;

// How gtest shows a case: its name, not its bytes.
void PrintTo(const MixCase& c, std::ostream* os) { *os << c.name; }

class MixedTypes : public ::testing::TestWithParam<MixCase> {};

TEST_P(MixedTypes, OpensAndRunsLikeItsDequantisedF32Copy) {
  const MixCase& c = GetParam();
  test::TempModel mixed(c.spec, c.name);
  CpuModel model(mixed.path);
  std::set<TensorType> types;
  for (const TensorInfo& t : model.file->tensors())
    if (t.dims.size() == 2) types.insert(static_cast<TensorType>(t.ggml_type));
  for (TensorType t : c.expected_types)
    EXPECT_TRUE(types.count(t)) << c.name << " lacks " << tensor_type_info(t).name;

  const fs::path f32_path = mixed.path.string() + ".f32.gguf";
  write_f32_copy(*model.file, f32_path);
  CpuModel f32(f32_path);
  const auto [logits, greedy] = model.prompt_and_greedy(kPrompt, kGreedy);
  const auto [f32_logits, f32_greedy] = f32.prompt_and_greedy(kPrompt, kGreedy);
  fs::remove(f32_path);
  // The same decoded weights through the same f32 products: the same bits.
  ASSERT_EQ(logits.size(), f32_logits.size());
  EXPECT_EQ(std::memcmp(logits.data(), f32_logits.data(), logits.size() * sizeof(float)), 0)
      << c.name;
  EXPECT_EQ(greedy, f32_greedy) << c.name;
}

TEST_P(MixedTypes, LogitsAndGreedyMatchNumpyReference) {
  const MixCase& c = GetParam();
  test::TempModel mixed(c.spec, c.name);
  ReferenceGolden g;
  ASSERT_NO_FATAL_FAILURE(test::load_reference_golden(c.name, mixed.path, kPrompt, g));

  CpuModel model(mixed.path);
  ASSERT_EQ(g.vocab, model.config.n_vocab);
  const auto [logits, greedy] = model.prompt_and_greedy(kPrompt, kGreedy);
  ASSERT_EQ(logits.size(), g.logits.size());
  // f32 products against a float64 reference on the same weights (as the other goldens).
  test::expect_rows_near(logits, g, 1e-4, c.name);
  EXPECT_EQ(greedy, g.greedy) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Files, MixedTypes, ::testing::ValuesIn(mix_cases()), [](const auto& info) {
  std::string name = info.param.name;
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
});

}  // namespace
}  // namespace granule
