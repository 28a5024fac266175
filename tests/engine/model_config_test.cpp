// Tests of ModelConfig / WeightTable: every architecture's hyper-parameters and rope choice
// read from synthetic GGUFs, the real default model's shape when present, and clear errors
// for unsupported architectures, block types, missing keys and bad shapes.
#include "granule/model_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "granule/error.h"
#include "granule/testkit/synthetic_model.h"
#include "support/test_files.h"

namespace granule {
namespace {

namespace fs = std::filesystem;

struct TempFile {
  fs::path path =
      fs::temp_directory_path() / ("granule_model_config_" + std::to_string(::getpid()) + "_" +
                                   std::to_string(std::random_device{}()) + ".gguf");
  ~TempFile() { fs::remove(path); }
};

struct Loaded {
  TempFile file;
  std::unique_ptr<ModelFile> model;
  ModelConfig config;
  WeightTable weights;
  explicit Loaded(const SyntheticModelSpec& spec) {
    write_synthetic_model(spec, file.path);
    model = ModelFile::open(file.path);
    config = ModelConfig::from_gguf(*model);
    weights = WeightTable::from_gguf(*model, config);
  }
};

// The message of the error the callable throws as E ("" if it throws nothing).
template <typename E, typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

TEST(ModelConfig, LlamaShapesAndInterleavedRope) {
  Loaded m(SyntheticModelSpec::preset("tiny-gqa"));
  const ModelConfig& c = m.config;
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.n_layer, 3);
  EXPECT_EQ(c.n_embd, 96);
  EXPECT_EQ(c.n_head, 6);
  EXPECT_EQ(c.n_head_kv, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.n_ff, 160);
  EXPECT_EQ(c.n_vocab, 384);
  EXPECT_EQ(c.context_length, 2048);
  EXPECT_EQ(c.rope_ordering, RopeOrdering::Normal);
  EXPECT_EQ(c.rope_scaling.type, "none");
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_EQ(c.kv_bytes_per_token(2), 3 * 2 * 2 * 16 * 2);
  ASSERT_EQ(m.weights.layers.size(), 3u);
  EXPECT_NE(m.weights.output, m.weights.token_embd);
  EXPECT_EQ(m.weights.layers[2].wk->dims, (std::vector<int64_t>{96, 32}));
  EXPECT_EQ(m.weights.layers[0].bq, nullptr);
}

TEST(ModelConfig, MistralIsReadLikeLlama) {
  auto spec = SyntheticModelSpec::preset("tiny");
  spec.architecture = "mistral";
  Loaded m(spec);
  EXPECT_EQ(m.config.architecture, "mistral");
  EXPECT_EQ(m.config.rope_ordering, RopeOrdering::Normal);
}

TEST(ModelConfig, Qwen2HasBiasTiedEmbeddingsAndNeoXRope) {
  Loaded m(SyntheticModelSpec::preset("tiny-qwen2"));
  EXPECT_EQ(m.config.rope_ordering, RopeOrdering::NeoX);
  EXPECT_TRUE(m.config.qkv_bias);
  EXPECT_TRUE(m.config.tied_embeddings);
  EXPECT_EQ(m.weights.output, m.weights.token_embd);
  EXPECT_NE(m.weights.layers[1].bv, nullptr);
  EXPECT_FLOAT_EQ(m.config.rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(m.config.rms_eps, 1e-6f);
}

TEST(ModelConfig, Qwen3HasQkNormAndExplicitHeadDim) {
  Loaded m(SyntheticModelSpec::preset("tiny-qwen3"));
  EXPECT_EQ(m.config.rope_ordering, RopeOrdering::NeoX);
  EXPECT_TRUE(m.config.qk_norm);
  EXPECT_EQ(m.config.head_dim, 32);  // key_length, not n_embd / n_head = 16
  EXPECT_EQ(m.weights.layers[0].wq->dims, (std::vector<int64_t>{64, 128}));
  EXPECT_NE(m.weights.layers[0].k_norm, nullptr);
}

TEST(ModelConfig, Llama3RopeScalingFromKeysAndRopeFreqs) {
  auto spec = SyntheticModelSpec::preset("tiny");
  spec.llama3_rope_scaling = true;
  spec.rope_scaling_factor = 8.0f;
  spec.rope_original_context = 1024;
  Loaded m(spec);
  EXPECT_EQ(m.config.rope_scaling.type, "llama3");
  EXPECT_FLOAT_EQ(m.config.rope_scaling.factor, 8.0f);
  EXPECT_EQ(m.config.rope_scaling.original_context, 1024);
  ASSERT_NE(m.weights.rope_freqs, nullptr);
  EXPECT_EQ(m.weights.rope_freqs->dims, (std::vector<int64_t>{8}));
}

TEST(ModelConfig, DominantTypeIsTheCommonestWeightType) {
  auto spec = SyntheticModelSpec::preset("tiny");
  spec.weight_type = TensorType::Q4_1;
  spec.embedding_type = TensorType::Q8_0;
  Loaded m(spec);
  EXPECT_EQ(m.config.dominant_type, static_cast<uint32_t>(TensorType::Q4_1));
}

TEST(ModelConfig, UnsupportedArchitectureIsNamed) {
  auto spec = SyntheticModelSpec::preset("tiny");
  spec.architecture = "falcon";
  TempFile f;
  write_synthetic_model(spec, f.path);
  auto model = ModelFile::open(f.path);
  const std::string msg = error_message<UnsupportedError>([&] { ModelConfig::from_gguf(*model); });
  EXPECT_NE(msg.find("falcon"), std::string::npos) << msg;
}

// Rewrites the ggml type id of one tensor in a GGUF image (the writer only makes supported
// types): finds the name in the tensor table, skips n_dims and the dims, patches the type.
void patch_tensor_type(std::vector<uint8_t>& bytes, const std::string& name, uint32_t type) {
  for (size_t i = 0; i + 8 + name.size() < bytes.size(); ++i) {
    uint64_t len;
    std::memcpy(&len, bytes.data() + i, 8);
    if (len != name.size() || std::memcmp(bytes.data() + i + 8, name.data(), name.size()) != 0)
      continue;
    size_t p = i + 8 + name.size();
    uint32_t n_dims;
    std::memcpy(&n_dims, bytes.data() + p, 4);
    p += 4 + 8 * n_dims;
    std::memcpy(bytes.data() + p, &type, 4);
    return;
  }
  FAIL() << "tensor " << name << " not found";
}

TEST(ModelConfig, UnsupportedBlockTypeNamesTensorAndType) {
  auto spec = SyntheticModelSpec::preset("tiny");
  auto bytes = build_synthetic_model(spec).to_bytes();
  // I32 (id 26): a real GGUF type the engine does not run, 4 bytes an element like the F32
  // it replaces, so the file stays valid for the reader.
  patch_tensor_type(bytes, "blk.1.ffn_up.weight", 26);
  TempFile f;
  {
    std::ofstream out(f.path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
  std::string msg;
  try {
    auto model = ModelFile::open(f.path);
    auto config = ModelConfig::from_gguf(*model);
    WeightTable::from_gguf(*model, config);
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("blk.1.ffn_up.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("I32"), std::string::npos) << msg;
}

TEST(ModelConfig, MissingKeyIsNamed) {
  auto writer = build_synthetic_model(SyntheticModelSpec::preset("tiny"));
  auto bytes = writer.to_bytes();
  // Renaming the key's text makes it absent.
  const std::string key = "llama.block_count";
  auto it = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
  ASSERT_NE(it, bytes.end());
  *(it + 6) = 'X';  // "llama.Xlock_count"
  TempFile f;
  {
    std::ofstream out(f.path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
  auto model = ModelFile::open(f.path);
  const std::string msg = error_message<FormatError>([&] { ModelConfig::from_gguf(*model); });
  EXPECT_NE(msg.find("llama.block_count"), std::string::npos) << msg;
}

TEST(ModelConfig, WrongTensorShapeIsNamed) {
  // A file whose header says 4 kv heads while the K/V weights are written for 2.
  auto spec = SyntheticModelSpec::preset("tiny");
  TempFile f;
  auto writer = build_synthetic_model(spec);
  writer.set("llama.attention.head_count_kv", GgufValue::u32(4));
  writer.write(f.path);
  auto model = ModelFile::open(f.path);
  auto config = ModelConfig::from_gguf(*model);
  const std::string msg =
      error_message<FormatError>([&] { WeightTable::from_gguf(*model, config); });
  EXPECT_NE(msg.find("blk.0.attn_k.weight"), std::string::npos) << msg;
}

using granule::test::default_model_path;

TEST(ModelConfig, DefaultModelShape) {
  const fs::path path = default_model_path();
  if (path.empty()) GTEST_SKIP() << test::kNoDefaultModel;
  auto model = ModelFile::open(path);
  auto c = ModelConfig::from_gguf(*model);
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.n_layer, 30);
  EXPECT_EQ(c.n_embd, 576);
  EXPECT_EQ(c.n_head, 9);
  EXPECT_EQ(c.n_head_kv, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.n_ff, 1536);
  EXPECT_EQ(c.n_vocab, 49152);
  EXPECT_EQ(c.context_length, 8192);
  EXPECT_FLOAT_EQ(c.rope_theta, 100000.0f);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.dominant_type, static_cast<uint32_t>(TensorType::Q4_1));
  auto w = WeightTable::from_gguf(*model, c);
  EXPECT_EQ(w.output, w.token_embd);
  EXPECT_GT(w.total_bytes(), 90u << 20);
}

}  // namespace
}  // namespace granule
