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

// Writes `bytes`, a whole GGUF file, to `path`.
void write_file(const fs::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// Changes character `at` of metadata key `key`'s text in `bytes` to 'X', so the file no longer
// has the key; false when the key is not there.
bool hide_key(std::vector<uint8_t>& bytes, const std::string& key, size_t at) {
  const auto it = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
  if (it == bytes.end()) return false;
  *(it + static_cast<std::ptrdiff_t>(at)) = 'X';
  return true;
}

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

TEST(ModelConfig, Llama3RopeScalingFromRopeFreqs) {
  // Llama 3.1 files carry the divisors in rope_freqs.weight and no rope.scaling.type.
  auto spec = SyntheticModelSpec::preset("tiny");
  spec.llama3_rope_scaling = true;
  spec.rope_scaling_factor = 8.0f;
  spec.rope_original_context = 1024;
  Loaded m(spec);
  EXPECT_EQ(m.config.rope_scaling.type, "llama3");
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
  write_file(f.path, bytes);
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
  ASSERT_TRUE(hide_key(bytes, "llama.block_count", 6));  // "llama.Xlock_count"
  TempFile f;
  write_file(f.path, bytes);
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

// ---- mixtures of experts (issue 36) --------------------------------------------------------

uint64_t file_tensor_bytes(const ModelFile& file) {
  uint64_t total = 0;
  for (const TensorInfo& t : file.tensors()) total += t.size_bytes;
  return total;
}

TEST(ModelConfigMoe, Qwen3MoeReadsExpertsAndSoftmaxNormalisedGating) {
  Loaded m(SyntheticModelSpec::preset("tiny-qwen3moe"));
  const ModelConfig& c = m.config;
  ASSERT_TRUE(c.is_moe());
  EXPECT_EQ(c.moe.n_expert, 8);
  EXPECT_EQ(c.moe.n_expert_used, 2);
  EXPECT_EQ(c.moe.n_ff_exp, 32);
  EXPECT_EQ(c.moe.n_ff_shexp, 0);
  EXPECT_EQ(c.moe.gating, ExpertGating::Softmax);
  EXPECT_TRUE(c.moe.normalize_weights);
  EXPECT_EQ(c.moe.weights_scale, 1.0f);
  EXPECT_EQ(c.activation, FfnActivation::Swiglu);
  EXPECT_EQ(c.rope_ordering, RopeOrdering::NeoX);
  EXPECT_TRUE(c.qk_norm);
  for (const LayerWeights& l : m.weights.layers) {
    EXPECT_EQ(l.w_gate, nullptr);
    EXPECT_EQ(l.w_up, nullptr);
    EXPECT_EQ(l.w_down, nullptr);
    ASSERT_NE(l.router, nullptr);
    ASSERT_NE(l.gate_exps, nullptr);
    EXPECT_EQ(l.down_exps->dims, (std::vector<int64_t>{32, 64, 8}));
    EXPECT_EQ(l.router_bias, nullptr);
    EXPECT_EQ(l.gate_exps_bias, nullptr);
  }
}

TEST(ModelConfigMoe, MixtralIsLlamaWithExpertsAsWideAsTheFfn) {
  Loaded m(SyntheticModelSpec::preset("tiny-mixtral"));
  const ModelConfig& c = m.config;
  ASSERT_TRUE(c.is_moe());
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.moe.n_expert, 4);
  EXPECT_EQ(c.moe.n_ff_exp, c.n_ff);
  EXPECT_EQ(c.moe.gating, ExpertGating::Softmax);
  EXPECT_TRUE(c.moe.normalize_weights);
  EXPECT_EQ(c.rope_ordering, RopeOrdering::Normal);
}

TEST(ModelConfigMoe, GptOssExpertPartHasBiasesTopKSoftmaxAndClampedSwiglu) {
  SyntheticModelSpec spec = SyntheticModelSpec::preset("tiny-qwen3moe");
  spec.architecture = "gpt-oss";
  spec.qk_norm = false;
  spec.expert_biases = true;
  spec.sliding_window = 8;  // required for gpt-oss, as llama.cpp requires it
  Loaded m(spec);
  const ModelConfig& c = m.config;
  ASSERT_TRUE(c.is_moe());
  EXPECT_EQ(c.moe.gating, ExpertGating::SoftmaxOfTopK);
  EXPECT_FALSE(c.moe.normalize_weights);
  EXPECT_EQ(c.activation, FfnActivation::SwigluClamped);
  const LayerWeights& l = m.weights.layers[1];
  ASSERT_NE(l.ffn_norm, nullptr);
  EXPECT_EQ(l.ffn_norm->name, "blk.1.post_attention_norm.weight");
  ASSERT_NE(l.router_bias, nullptr);
  ASSERT_NE(l.gate_exps_bias, nullptr);
  ASSERT_NE(l.up_exps_bias, nullptr);
  ASSERT_NE(l.down_exps_bias, nullptr);
  EXPECT_EQ(l.down_exps_bias->dims, (std::vector<int64_t>{64, 8}));
}

TEST(ModelConfigMoe, GatingKeysAreReadAsLlamaCppReadsThem) {
  // llama.cpp's qwen3moe graph fixes softmax and normalisation in code; the keys are ignored.
  SyntheticModelSpec spec = SyntheticModelSpec::preset("tiny-qwen3moe");
  spec.expert_gating_func = 2;
  spec.expert_weights_norm = 0;
  spec.expert_weights_scale = 2.5f;
  Loaded m(spec);
  EXPECT_EQ(m.config.moe.gating, ExpertGating::Softmax);
  EXPECT_TRUE(m.config.moe.normalize_weights);
  EXPECT_EQ(m.config.moe.weights_scale, 1.0f);
}

TEST(ModelConfigMoe, Qwen3MoeExpertWidthDefaultsToFfOverTopK) {
  SyntheticModelSpec spec = SyntheticModelSpec::preset("tiny-qwen3moe");
  spec.n_ff = 64;  // 2 × the experts' 32
  auto bytes = build_synthetic_model(spec).to_bytes();
  // "qwen3moe.Xxpert_feed_forward_length": absent.
  ASSERT_TRUE(hide_key(bytes, "qwen3moe.expert_feed_forward_length", 9));
  TempFile f;
  write_file(f.path, bytes);
  auto model = ModelFile::open(f.path);
  const ModelConfig c = ModelConfig::from_gguf(*model);
  EXPECT_EQ(c.moe.n_ff_exp, 32);
  EXPECT_NO_THROW(WeightTable::from_gguf(*model, c));
}

TEST(ModelConfigMoe, TopKAboveTheExpertCountIsAnError) {
  auto writer = build_synthetic_model(SyntheticModelSpec::preset("tiny-qwen3moe"));
  writer.set("qwen3moe.expert_used_count", GgufValue::u32(9));
  TempFile f;
  writer.write(f.path);
  auto model = ModelFile::open(f.path);
  const std::string msg = error_message<FormatError>([&] { ModelConfig::from_gguf(*model); });
  EXPECT_NE(msg.find("expert_used_count 9"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expert_count 8"), std::string::npos) << msg;
}

TEST(ModelConfigMoe, MissingExpertCountIsNamed) {
  auto bytes = build_synthetic_model(SyntheticModelSpec::preset("tiny-qwen3moe")).to_bytes();
  ASSERT_TRUE(hide_key(bytes, "qwen3moe.expert_count", 9));
  TempFile f;
  write_file(f.path, bytes);
  auto model = ModelFile::open(f.path);
  const std::string msg = error_message<FormatError>([&] { ModelConfig::from_gguf(*model); });
  EXPECT_NE(msg.find("qwen3moe.expert_count"), std::string::npos) << msg;
}

TEST(ModelConfigMoe, ExpertTensorOfTheWrongShapeIsNamed) {
  // The header says 6 experts, the tensors hold 8.
  auto writer = build_synthetic_model(SyntheticModelSpec::preset("tiny-mixtral"));
  writer.set("llama.expert_count", GgufValue::u32(6));
  TempFile f;
  writer.write(f.path);
  auto model = ModelFile::open(f.path);
  auto config = ModelConfig::from_gguf(*model);
  const std::string msg =
      error_message<FormatError>([&] { WeightTable::from_gguf(*model, config); });
  EXPECT_NE(msg.find("blk.0.ffn_gate_inp.weight"), std::string::npos) << msg;
}

TEST(ModelConfigMoe, BlockQuantisedRouterIsRefused) {
  SyntheticModelSpec spec = SyntheticModelSpec::preset("tiny-qwen3moe");
  spec.router_type = TensorType::Q4_0;
  TempFile f;
  write_synthetic_model(spec, f.path);
  auto model = ModelFile::open(f.path);
  auto config = ModelConfig::from_gguf(*model);
  const std::string msg =
      error_message<UnsupportedError>([&] { WeightTable::from_gguf(*model, config); });
  EXPECT_NE(msg.find("ffn_gate_inp.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Q4_0"), std::string::npos) << msg;
}

TEST(ModelConfigMoe, ExpertsOnADenseOnlyArchitectureAreRefused) {
  auto writer = build_synthetic_model(SyntheticModelSpec::preset("tiny-qwen3"));
  writer.set("qwen3.expert_count", GgufValue::u32(8));
  TempFile f;
  writer.write(f.path);
  auto model = ModelFile::open(f.path);
  const std::string msg = error_message<UnsupportedError>([&] { ModelConfig::from_gguf(*model); });
  EXPECT_NE(msg.find("qwen3"), std::string::npos) << msg;
}

TEST(ModelConfigMoe, WeightBytesCountEveryExpert) {
  for (const char* name : {"tiny-qwen3moe", "tiny-mixtral"}) {
    Loaded m(SyntheticModelSpec::preset(name));
    EXPECT_EQ(m.weights.total_bytes(), file_tensor_bytes(*m.model)) << name;
    uint64_t layer0 = 0;
    for (const TensorInfo& t : m.model->tensors())
      if (t.name.rfind("blk.0.", 0) == 0) layer0 += t.size_bytes;
    EXPECT_EQ(m.weights.layer_bytes(0), layer0) << name;
  }
}

TEST(ModelConfigMoe, RealShapePresetsDescribeTheModels) {
  const SyntheticModelSpec q = SyntheticModelSpec::preset("qwen3-30b-a3b");
  EXPECT_EQ(q.architecture, "qwen3moe");
  EXPECT_EQ(q.n_layer, 48);
  EXPECT_EQ(q.n_embd, 2048);
  EXPECT_EQ(q.n_head, 32);
  EXPECT_EQ(q.n_head_kv, 4);
  EXPECT_EQ(q.head_dim, 128);
  EXPECT_EQ(q.n_expert, 128);
  EXPECT_EQ(q.n_expert_used, 8);
  EXPECT_EQ(q.n_ff_exp, 768);
  EXPECT_EQ(q.n_vocab, 151936);
  EXPECT_EQ(q.expert_type, TensorType::Q4_K);
  EXPECT_EQ(q.router_type, TensorType::F32);
  const auto down_q6 = std::count_if(q.tensor_types.begin(), q.tensor_types.end(), [](auto& o) {
    return o.suffix.ends_with("ffn_down_exps.weight") && o.type == TensorType::Q6_K;
  });
  EXPECT_GT(down_q6, 0);
  EXPECT_LT(down_q6, 48);
  // The mix written and read back, on a copy small enough to write here (8 layers, 4 experts
  // of 256, 256 wide).
  SyntheticModelSpec small = q;
  small.n_layer = 8;
  small.n_expert = 4;
  small.n_expert_used = 2;
  small.n_vocab = 1000;
  small.n_embd = 256;
  small.n_head = 2;
  small.n_head_kv = 1;
  small.n_ff_exp = 256;
  small.tensor_types.clear();  // llama-quantize's use_more_bits() layers of 8: 0, 3, 6, 7
  for (int64_t i : {0, 3, 6, 7})
    small.tensor_types.push_back(
        {"blk." + std::to_string(i) + ".ffn_down_exps.weight", TensorType::Q6_K});
  Loaded m(small);
  EXPECT_EQ(m.config.moe.n_ff_exp, 256);
  EXPECT_EQ(m.config.dominant_type, static_cast<uint32_t>(TensorType::Q4_K));
  EXPECT_EQ(m.weights.layers[3].down_exps->ggml_type, static_cast<uint32_t>(TensorType::Q6_K));
  EXPECT_EQ(m.weights.layers[4].down_exps->ggml_type, static_cast<uint32_t>(TensorType::Q4_K));
  EXPECT_EQ(m.weights.layers[4].router->ggml_type, static_cast<uint32_t>(TensorType::F32));
  const SyntheticModelSpec x = SyntheticModelSpec::preset("mixtral-8x7b");
  EXPECT_EQ(x.architecture, "llama");
  EXPECT_EQ(x.n_expert, 8);
  EXPECT_EQ(x.n_expert_used, 2);
  EXPECT_EQ(x.n_ff, 14336);
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
