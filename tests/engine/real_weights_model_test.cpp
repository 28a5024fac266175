// The real-weights model: a model cut to its first layers by the testkit
// (granule/testkit/first_layers.h) keeps every tensor outside the dropped blocks and every
// metadata value byte for byte, with block_count the layers kept; on a synthetic model always,
// and on the default model's first layers when `setup.sh realweights` wrote them: the file
// opens with 3 layers, is under 40 MB, tokenizes as the full model does, and the CPU
// reference and the CPU oracle give finite logits on real text.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "granule/engine.h"
#include "granule/error.h"
#include "granule/gguf.h"
#include "granule/model_config.h"
#include "granule/testkit/first_layers.h"
#include "granule/testkit/synthetic_model.h"
#include "support/engine_chats.h"
#include "support/temp_model.h"
#include "support/test_files.h"

namespace granule {
namespace {

namespace fs = std::filesystem;
using test::TempModel;

// A file in the temporary folder for this process (ctest runs each test in its own), removed
// with the test.
struct TempPath {
  fs::path path;
  explicit TempPath(const std::string& name)
      : path(fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()) + ".gguf")) {}
  ~TempPath() { fs::remove(path); }
};

bool same_bytes(const TensorInfo& a, const TensorInfo& b) {
  return a.dims == b.dims && a.ggml_type == b.ggml_type && a.size_bytes == b.size_bytes &&
         std::memcmp(a.data, b.data, a.size_bytes) == 0;
}

// Every tensor of `cut` is `source`'s, and `cut` holds every one of `source`'s tensors outside
// blocks >= layers; every metadata value but block_count and general.name is the source's.
void expect_first_layers_of(const ModelFile& source, const ModelFile& cut, int64_t layers) {
  size_t kept = 0;
  for (const TensorInfo& t : source.tensors()) {
    const TensorInfo* c = cut.find_tensor(t.name);
    if (tensor_layer(t.name) >= layers) {
      EXPECT_EQ(c, nullptr) << t.name << " belongs to a dropped layer";
      continue;
    }
    ++kept;
    ASSERT_NE(c, nullptr) << t.name << " is missing";
    EXPECT_TRUE(same_bytes(t, *c)) << t.name << " differs from the source";
  }
  EXPECT_EQ(cut.tensors().size(), kept);
  const std::string block_count = *source.get_string("general.architecture") + ".block_count";
  EXPECT_EQ(cut.get_int(block_count), layers);
  EXPECT_EQ(cut.metadata().size(), source.metadata().size());
  for (const auto& [key, value] : source.metadata()) {
    if (key == block_count || key == "general.name") continue;
    const GgufValue* v = cut.find(key);
    ASSERT_NE(v, nullptr) << key;
    EXPECT_EQ(v->type, value.type) << key;
    EXPECT_EQ(v->array_type, value.array_type) << key;
    EXPECT_EQ(v->u64, value.u64) << key;
    EXPECT_EQ(v->f64, value.f64) << key;
    EXPECT_EQ(v->str, value.str) << key;
    EXPECT_EQ(v->strings, value.strings) << key;
    EXPECT_EQ(v->ints, value.ints) << key;
    EXPECT_EQ(v->floats, value.floats) << key;
  }
}

// Every logit of every row is a finite number.
void expect_finite(const std::vector<std::vector<float>>& rows, const std::string& what) {
  ASSERT_FALSE(rows.empty()) << what;
  size_t bad = 0;
  for (const auto& row : rows)
    for (float x : row) bad += !std::isfinite(x);
  EXPECT_EQ(bad, 0u) << what << ": logits that are not finite";
}

std::unique_ptr<Engine> open_cpu(const fs::path& path, bool oracle) {
  EngineOptions o = test::cpu_engine_options(256, 1);
  o.cpu_emulate_device_numerics = oracle;
  return Engine::open(path, o);
}

TEST(FirstLayers, TensorLayerReadsTheBlockNumber) {
  EXPECT_EQ(tensor_layer("blk.0.attn_q.weight"), 0);
  EXPECT_EQ(tensor_layer("blk.12.ffn_down.weight"), 12);
  EXPECT_EQ(tensor_layer("token_embd.weight"), -1);
  EXPECT_EQ(tensor_layer("output_norm.weight"), -1);
  EXPECT_EQ(tensor_layer("blk.x.attn_q.weight"), -1);
  EXPECT_EQ(tensor_layer("blk.3"), -1);
}

// The case: 2 of a synthetic model's 4 layers (untied head, Q4_1 layers, Q8_0 embeddings):
// the file holds exactly the source's bytes for what it keeps, opens with 2 layers and gives
// finite logits on the CPU; a count outside 1..4 is refused.
TEST(FirstLayers, KeepsTheFirstLayersAndEverythingOutsideTheBlocksByteForByte) {
  SyntheticModelSpec spec = SyntheticModelSpec::preset("tiny-gqa");
  spec.n_layer = 4;
  spec.weight_type = TensorType::Q4_1;
  spec.embedding_type = TensorType::Q8_0;
  TempModel model(spec, "granule_first_layers");
  const auto source = ModelFile::open(model.path);
  EXPECT_THROW(first_layers_model(*source, 0), UsageError);
  EXPECT_THROW(first_layers_model(*source, 5), UsageError);
  TempPath cut("granule_first_layers_cut");
  write_first_layers(*source, 2, cut.path);
  const auto written = ModelFile::open(cut.path);
  expect_first_layers_of(*source, *written, 2);
  EXPECT_EQ(ModelConfig::from_gguf(*written).n_layer, 2);
  EXPECT_NE(written->get_string("general.name")->find("first 2 of 4 layers"), std::string::npos);
  expect_finite(open_cpu(cut.path, false)->logits_for({1, 40, 41, 42, 300}), "2 of 4 layers");
}

// The case: the real-weights model `setup.sh realweights` wrote from the default model.
TEST(RealWeightsModel, HasTheFirstLayersTheFullTokenizerAndFiniteLogits) {
  const fs::path path = test::real_weights_model_path();
  if (path.empty())
    GTEST_SKIP() << "the real-weights model is not written (setup.sh realweights) in "
                 << GRANULE_TESTDATA_DIR;
  EXPECT_LT(fs::file_size(path), 40'000'000u) << "too large to travel to a GPU machine";
  const auto file = ModelFile::open(path);
  const ModelConfig config = ModelConfig::from_gguf(*file);
  EXPECT_EQ(config.n_layer, test::kRealWeightsLayers);
  EXPECT_EQ(config.n_embd, 576);
  EXPECT_EQ(config.n_vocab, 49152);
  const std::string text =
      "<|im_start|>user\nWhat is the capital of France? Answer in one sentence.<|im_end|>\n"
      "<|im_start|>assistant\nThe printing press spread across Europe within fifty years.";
  auto reference = open_cpu(path, false), oracle = open_cpu(path, true);
  const std::vector<int32_t> tokens = reference->tokenizer().encode(text, false, true);
  ASSERT_GT(tokens.size(), 20u);

  const fs::path full = test::default_model_path();
  if (!full.empty()) {
    const auto source = ModelFile::open(full);
    expect_first_layers_of(*source, *file, test::kRealWeightsLayers);
    EXPECT_EQ(open_cpu(full, false)->tokenizer().encode(text, false, true), tokens)
        << "the cut model tokenizes otherwise than the full model";
  }
  expect_finite(reference->logits_for(tokens), "CPU reference");
  expect_finite(oracle->logits_for(tokens), "CPU oracle");
}

}  // namespace
}  // namespace granule
