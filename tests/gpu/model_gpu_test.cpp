// The whole forward pass, CUDA backend against the CPU reference backend, on synthetic
// models (the project's writer, seeded weights) at small shapes for every block type and
// architecture variant, and at the default model's shapes (SmolLM2-135M, Q4_1). Teacher-
// forced over 64 positions: the logits must lie within a bound at every position (the bound
// is relative to the row's RMS, per weight type), and the greedy token must agree wherever
// the CPU's top-two margin exceeds twice the bound; rows closer than that are near-ties,
// counted and printed, not failed. Covered paths: prefill through the matvec kernels
// (<= 64 rows), prefill through cuBLAS (> 64 rows), decode steps replayed from CUDA graphs,
// batched decode of sequences at different lengths, and Engine::open on the GPU.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <random>

#include "backends/backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/kernel_config_env.h"
#include "gpu_test_support.h"
#include "granule/engine.h"
#include "granule/gguf.h"
#include "granule/model_config.h"
#include "granule/testkit/synthetic_model.h"
#include "memory/kv_space.h"
#include "memory/memory_manager.h"
#include "runtime/runtime.h"
#include "support/test_files.h"

namespace granule {
namespace {

// A backend with its own ledger and KV space over a model file (make_runtime, as the engine).
struct Rig {
  std::unique_ptr<ModelFile> file;
  ModelConfig config;
  WeightTable weights;
  Runtime runtime;
  std::unique_ptr<MemoryManager>& memory = runtime.memory;
  std::unique_ptr<Backend>& backend = runtime.backend;
  std::unique_ptr<KvSpace>& kv = runtime.kv;

  Rig(const std::filesystem::path& path, bool gpu, int slots = 4, int64_t context = 512) {
    file = ModelFile::open(path);
    config = ModelConfig::from_gguf(*file);
    weights = WeightTable::from_gguf(*file, config);
    RuntimeOptions options;
    options.device = gpu ? DeviceKind::Cuda : DeviceKind::Cpu;
    options.backend.vram_budget_bytes = uint64_t{1} << 40;
    options.context_length = context;
    options.slots = slots;
    options.kv_pool_granules = 0;
    runtime = make_runtime(*file, config, weights, options);
  }

  std::vector<float> run(std::vector<BatchSequence> batch) {
    for (const BatchSequence& s : batch)
      if (!kv->map_through(s.slot, s.start_position + static_cast<int64_t>(s.tokens.size())))
        throw std::runtime_error("KV map refused");
    std::vector<float> logits;
    backend->forward(batch, logits);
    return logits;
  }
};

std::filesystem::path model_path(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("granule-gpu-test-" + name + ".gguf");
}

// Small shapes the GPU kernels support (head size 64 or 128, widths multiples of 256).
SyntheticModelSpec small_spec(const std::string& variant, TensorType type) {
  SyntheticModelSpec s;
  s.name = variant;
  s.n_layer = 2;
  s.n_embd = 256;
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ff = 512;
  s.n_vocab = 1000;
  s.weight_type = type;
  s.embedding_type = type;
  s.output_type = type;
  s.seed = 17 + static_cast<uint64_t>(type);
  if (variant == "qwen2") {
    s.architecture = "qwen2";
    s.qkv_bias = true;
    s.tied_embeddings = true;
    s.rope_theta = 1e6f;
  } else if (variant == "qwen3") {
    s.architecture = "qwen3";
    s.qk_norm = true;
    s.head_dim = 128;  // q width 512 differs from the hidden size, as in Qwen3
    s.n_head_kv = 1;
  } else if (variant == "mixed") {
    // Every newer block type in one model, as mixed_types_test runs it on the CPU.
    s.embedding_type = TensorType::Q3_K;
    s.output_type = TensorType::IQ4_XS;
    s.tensor_types = {
        {"attn_q.weight", TensorType::Q2_K},        {"attn_k.weight", TensorType::Q3_K},
        {"attn_v.weight", TensorType::IQ4_NL},      {"attn_output.weight", TensorType::IQ4_XS},
        {"ffn_gate.weight", TensorType::MXFP4},     {"ffn_up.weight", TensorType::Q5_1},
        {"blk.1.ffn_down.weight", TensorType::Q2_K}};
  } else if (variant == "llama3") {
    s.llama3_rope_scaling = true;
    s.rope_theta = 500000.0f;
    s.n_head = 8;  // head size 32 would not run; keep 64 with 8 heads over 512
    s.n_embd = 512;
  }
  return s;
}

struct Comparison {
  double worst_ratio = 0;  // max over rows of max|gpu - cpu| / (tolerance * rms(cpu))
  double worst_relative = 0;
  int near_ties = 0;
  int mismatches = 0;
  int rows = 0;
};

Comparison compare_rows(const std::vector<float>& cpu, const std::vector<float>& gpu,
                        int64_t n_vocab, double tolerance) {
  Comparison c;
  c.rows = static_cast<int>(cpu.size() / static_cast<size_t>(n_vocab));
  for (int r = 0; r < c.rows; ++r) {
    const float* a = cpu.data() + r * n_vocab;
    const float* b = gpu.data() + r * n_vocab;
    double sum_sq = 0, max_err = 0;
    int gpu_best = 0;
    for (int64_t i = 0; i < n_vocab; ++i) {
      sum_sq += static_cast<double>(a[i]) * a[i];
      const double err = std::fabs(static_cast<double>(a[i]) - b[i]);
      max_err = std::isnan(err) ? INFINITY : std::max(max_err, err);
      if (b[i] > b[gpu_best]) gpu_best = static_cast<int>(i);
    }
    const gpu_test::TopTwo top = gpu_test::top_two({a, static_cast<size_t>(n_vocab)});
    const double rms = std::sqrt(sum_sq / static_cast<double>(n_vocab));
    const double bound = tolerance * rms;
    c.worst_ratio = std::max(c.worst_ratio, max_err / bound);
    c.worst_relative = std::max(c.worst_relative, max_err / rms);
    if (top.margin > 2 * bound) {
      if (gpu_best != top.best) ++c.mismatches;
    } else {
      ++c.near_ties;
    }
  }
  return c;
}

void expect_close(const Comparison& c, const std::string& what) {
  std::cout << "[gpu-vs-cpu] " << what << ": rows " << c.rows << ", max |err|/rms "
            << c.worst_relative << ", worst err/bound " << c.worst_ratio << ", greedy mismatches "
            << c.mismatches << ", near-ties " << c.near_ties << "\n";
  EXPECT_LE(c.worst_ratio, 1.0) << what << ": logits outside the bound";
  EXPECT_EQ(c.mismatches, 0) << what << ": greedy token differs where the CPU's margin is clear";
}

// Relative-to-RMS bounds. Every type: f16 KV (and f16 GEMM operands on the cuBLAS path);
// measured on the H200 at about 0.2% of the logits' RMS (0.6% through cuBLAS), bound 2%.
// Q4_0/Q4_1/Q8_0 decode kernels also round every activation to int8 blocks (as llama.cpp's
// MMVQ kernels do): about 0.4% per element, which these random-weight models amplify to
// 8-10% of the logits' RMS (16% at the 30-layer SmolLM2 shapes); bound 25%. The kernel
// tests bound the int8 rounding exactly; here the greedy-agreement check is what matters.
// Q6_K, Q5_0 and Q5_1 join them when their weights are in the split layout (the default; its
// kernels read int8 activations too), unless GRANULE_SPLIT_WEIGHTS=0 (read as the backend
// reads it).
bool split_weights_on() { return kernel_config_from_environment().split_weights; }

double tolerance_for(TensorType t) {
  switch (t) {
    case TensorType::Q4_0:
    case TensorType::Q4_1:
    case TensorType::Q8_0:
      return 0.25;
    case TensorType::Q6_K:
    case TensorType::Q5_0:  // (and the "mixed" case, whose blk.0 ffn_down is Q5_0)
    case TensorType::Q5_1:
      return split_weights_on() ? 0.25 : 0.02;
    default:
      return 0.02;
  }
}

std::vector<int32_t> random_tokens(int n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(3, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = dist(rng);
  return t;
}

struct ModelCase {
  std::string variant;
  TensorType type;
};

class ModelGpuVsCpu : public ::testing::TestWithParam<ModelCase> {};

TEST_P(ModelGpuVsCpu, TeacherForcedPrefillDecodeAndGemmPathsMatchCpu) {
  GRANULE_REQUIRE_GPU();
  const ModelCase mc = GetParam();
  const std::string name = mc.variant + "-" + std::string(tensor_type_info(mc.type).name);
  const auto path = model_path(name);
  write_synthetic_model(small_spec(mc.variant, mc.type), path);
  Rig cpu(path, false), gpu(path, true);
  const int64_t vocab = cpu.config.n_vocab;
  const double tol = tolerance_for(mc.type);

  // 1. 64 positions teacher-forced in one prefill (matvec path on the GPU).
  const std::vector<int32_t> tokens = random_tokens(64, vocab, 5);
  const std::vector<float> ref = cpu.run({{0, tokens, 0, true}});
  expect_close(compare_rows(ref, gpu.run({{0, tokens, 0, true}}), vocab, tol),
               name + " prefill 64 (matvec)");

  // 2. The same positions as decode steps (graph replays), slot 1.
  std::vector<float> stepped;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::vector<float> row =
        gpu.run({{1, std::span<const int32_t>(&tokens[i], 1), static_cast<int64_t>(i), false}});
    stepped.insert(stepped.end(), row.begin(), row.end());
  }
  expect_close(compare_rows(ref, stepped, vocab, tol), name + " decode steps (graphs)");

  // 3. 150 positions in one prefill: the cuBLAS path (f16 operands).
  const std::vector<int32_t> long_tokens = random_tokens(150, vocab, 6);
  // f16 activations for every type on this path (no int8): measured below 3% of the RMS.
  expect_close(compare_rows(cpu.run({{2, long_tokens, 0, true}}),
                            gpu.run({{2, long_tokens, 0, true}}), vocab, 0.05),
               name + " prefill 150 (cuBLAS)");
  std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ModelGpuVsCpu,
    ::testing::Values(ModelCase{"llama", TensorType::F32}, ModelCase{"llama", TensorType::F16},
                      ModelCase{"llama", TensorType::BF16}, ModelCase{"llama", TensorType::Q8_0},
                      ModelCase{"llama", TensorType::Q4_0}, ModelCase{"llama", TensorType::Q4_1},
                      ModelCase{"llama", TensorType::Q4_K}, ModelCase{"llama", TensorType::Q5_K},
                      ModelCase{"llama", TensorType::Q6_K}, ModelCase{"qwen2", TensorType::Q8_0},
                      ModelCase{"qwen3", TensorType::Q4_K}, ModelCase{"llama3", TensorType::Q4_0},
                      ModelCase{"llama", TensorType::Q5_0}, ModelCase{"llama", TensorType::Q5_1},
                      ModelCase{"llama", TensorType::Q2_K}, ModelCase{"llama", TensorType::Q3_K},
                      ModelCase{"llama", TensorType::IQ4_NL},
                      ModelCase{"llama", TensorType::IQ4_XS}, ModelCase{"llama", TensorType::MXFP4},
                      ModelCase{"qwen2", TensorType::Q5_0}, ModelCase{"mixed", TensorType::Q5_0}),
    [](const ::testing::TestParamInfo<ModelCase>& i) {
      return i.param.variant + "_" + std::string(tensor_type_info(i.param.type).name);
    });

// Sequences at different lengths decoding together in one batch, against the CPU doing
// the same batches.
TEST(ModelGpuBatch, BatchedDecodeAtDifferentLengthsMatchesCpu) {
  GRANULE_REQUIRE_GPU();
  const auto path = model_path("batch");
  write_synthetic_model(small_spec("llama", TensorType::Q4_0), path);
  Rig cpu(path, false), gpu(path, true);
  const int64_t vocab = cpu.config.n_vocab;
  const int lengths[3] = {5, 40, 1};
  std::vector<std::vector<int32_t>> prompts;
  for (int s = 0; s < 3; ++s) {
    prompts.push_back(random_tokens(lengths[s], vocab, 100 + s));
    cpu.run({{s, prompts[s], 0, false}});
    gpu.run({{s, prompts[s], 0, false}});
  }
  std::vector<float> ref, got;
  for (int step = 0; step < 12; ++step) {
    const std::vector<int32_t> next = random_tokens(3, vocab, 200 + step);
    std::vector<BatchSequence> batch;
    for (int s = 0; s < 3; ++s)
      batch.push_back({s, std::span<const int32_t>(&next[s], 1), lengths[s] + step, false});
    const std::vector<float> c = cpu.run(batch), g = gpu.run(batch);
    ref.insert(ref.end(), c.begin(), c.end());
    got.insert(got.end(), g.begin(), g.end());
  }
  expect_close(compare_rows(ref, got, vocab, tolerance_for(TensorType::Q4_0)),
               "batched decode (3 sequences)");
  std::filesystem::remove(path);
}

// The default model's shapes: 30 layers, 576 wide, 9/3 heads, ff 1536, vocab 49152, Q4_1
// layers, Q8_0 tied embeddings (the smollm2-135m preset).
TEST(ModelGpuDefaultShapes, SmolLM2ShapesTeacherForced64Positions) {
  GRANULE_REQUIRE_GPU();
  const auto path = model_path("smollm2-135m");
  write_synthetic_model(SyntheticModelSpec::preset("smollm2-135m"), path);
  Rig cpu(path, false, 2, 256), gpu(path, true, 2, 256);
  const int64_t vocab = cpu.config.n_vocab;
  const std::vector<int32_t> tokens = random_tokens(64, vocab, 7);
  const std::vector<float> ref = cpu.run({{0, tokens, 0, true}});
  expect_close(
      compare_rows(ref, gpu.run({{0, tokens, 0, true}}), vocab, tolerance_for(TensorType::Q4_1)),
      "smollm2-135m shapes prefill 64");
  std::vector<float> stepped;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::vector<float> row =
        gpu.run({{1, std::span<const int32_t>(&tokens[i], 1), static_cast<int64_t>(i), false}});
    stepped.insert(stepped.end(), row.begin(), row.end());
  }
  expect_close(compare_rows(ref, stepped, vocab, tolerance_for(TensorType::Q4_1)),
               "smollm2-135m shapes decode steps");
  std::filesystem::remove(path);
}

std::unique_ptr<Engine> open_engine(const std::filesystem::path& path, DeviceKind device) {
  EngineOptions options;
  options.device = device;
  options.context_length = 256;
  return Engine::open(path, options);
}

// The real default model (SmolLM2-135M-Instruct Q4_1), when it is installed: 64 positions of
// English text teacher-forced through the engine on the GPU and on the CPU.
TEST(ModelGpuDefaultModel, RealSmolLM2TeacherForced64Positions) {
  GRANULE_REQUIRE_GPU();
  const std::filesystem::path path = test::default_model_path();
  if (path.empty()) GTEST_SKIP() << "the default model is not installed (setup.sh model)";
  auto gpu = open_engine(path, DeviceKind::Cuda), cpu = open_engine(path, DeviceKind::Cpu);
  const std::string text =
      "The history of the printing press begins in the fifteenth century, when Johannes "
      "Gutenberg combined movable metal type, oil-based ink and a wooden screw press. Within "
      "fifty years presses were running in more than two hundred cities across Europe, and the "
      "price of books fell so far that reading spread well beyond monasteries and universities. "
      "Printers standardised spelling, scholars compared identical copies of the same text, and "
      "pamphlets carried news and arguments faster than any messenger could.";
  std::vector<int32_t> tokens = gpu->tokenizer().encode(text, true, false);
  ASSERT_GE(tokens.size(), 64u);
  tokens.resize(64);
  const auto g = gpu->logits_for(tokens), c = cpu->logits_for(tokens);
  std::vector<float> gf, cf;
  for (const auto& row : g) gf.insert(gf.end(), row.begin(), row.end());
  for (const auto& row : c) cf.insert(cf.end(), row.begin(), row.end());
  expect_close(compare_rows(cf, gf, gpu->config().n_vocab, tolerance_for(TensorType::Q4_1)),
               "real SmolLM2-135M-Instruct Q4_1 logits_for 64");
}

// The real default model answering a chat question greedily through the engine, on the GPU
// and on the CPU: the same tokens, or a divergence only where the CPU's top-two margin at
// that token is within twice the Q4_1 bound (a near-tie, reported).
TEST(ModelGpuDefaultModel, RealSmolLM2GreedyAnswerMatchesCpu) {
  GRANULE_REQUIRE_GPU();
  const std::filesystem::path path = test::default_model_path();
  if (path.empty()) GTEST_SKIP() << "the default model is not installed (setup.sh model)";
  auto gpu = open_engine(path, DeviceKind::Cuda), cpu = open_engine(path, DeviceKind::Cpu);
  const std::vector<int32_t> prompt = cpu->tokenizer().encode(
      "<|im_start|>user\nWhat is the capital of France? Answer in one sentence.<|im_end|>\n"
      "<|im_start|>assistant\n",
      false, true);
  auto answer = [&](Engine& engine) {
    std::vector<int32_t> tokens;
    Request r;
    r.prompt_tokens = prompt;
    r.sampling = SamplingParams::greedy();
    r.sampling.max_tokens = 32;
    r.sink.on_token = [&](SequenceId, const std::string&, int32_t t) {
      if (t != kNoToken) tokens.push_back(t);
    };
    r.sink.on_finish = [](SequenceId, FinishReason, const std::string&) {};
    engine.submit(std::move(r));
    for (int i = 0; i < 1000 && engine.step(); ++i) {
    }
    return tokens;
  };
  const std::vector<int32_t> on_gpu = answer(*gpu), on_cpu = answer(*cpu);
  ASSERT_FALSE(on_cpu.empty());
  const size_t common = static_cast<size_t>(
      std::mismatch(on_gpu.begin(), on_gpu.end(), on_cpu.begin(), on_cpu.end()).first -
      on_gpu.begin());
  std::cout << "[gpu-vs-cpu] real SmolLM2 greedy answer: GPU " << on_gpu.size() << " tokens, CPU "
            << on_cpu.size() << ", identical for " << common << " (\""
            << cpu->tokenizer().decode(on_cpu) << "\")\n";
  if (common < std::min(on_gpu.size(), on_cpu.size())) {
    std::vector<int32_t> context = prompt;
    context.insert(context.end(), on_cpu.begin(), on_cpu.begin() + static_cast<long>(common));
    const std::vector<float> row = cpu->logits_for(context).back();
    double sum_sq = 0;
    for (float x : row) sum_sq += static_cast<double>(x) * x;
    const double rms = std::sqrt(sum_sq / static_cast<double>(row.size()));
    const double margin = gpu_test::top_two(row).margin;
    std::cout << "[gpu-vs-cpu] diverged at token " << common << ": CPU margin " << margin << " = "
              << margin / rms << " x RMS\n";
    EXPECT_LE(margin, 2 * tolerance_for(TensorType::Q4_1) * rms)
        << "the answers diverge where the CPU's choice is clear";
  }
}

// Device sampling through the backend: greedy picks the argmax of the logits forward()
// returns for the same step.
TEST(ModelGpuSampling, GreedyForwardSampleMatchesLogitsArgmax) {
  GRANULE_REQUIRE_GPU();
  const auto path = model_path("sample");
  write_synthetic_model(small_spec("llama", TensorType::Q4_K), path);
  Rig gpu(path, true);
  auto& cuda = dynamic_cast<cuda::CudaBackend&>(*gpu.backend);
  const std::vector<int32_t> prompt = random_tokens(10, gpu.config.n_vocab, 9);
  std::vector<float> logits = gpu.run({{0, std::span<const int32_t>(prompt.data(), 9), 0, false}});
  const std::vector<SamplingParams> params = {SamplingParams::greedy()};
  const std::vector<uint64_t> draw = {0};
  // Same step twice in slot 0 (position 9 is rewritten with the same K/V).
  logits = gpu.run({{0, std::span<const int32_t>(&prompt[9], 1), 9, false}});
  const std::vector<int32_t> token = cuda.forward_sample(
      std::vector<BatchSequence>{{0, std::span<const int32_t>(&prompt[9], 1), 9, false}}, params,
      {}, draw);
  const auto best = std::max_element(logits.begin(), logits.end()) - logits.begin();
  EXPECT_EQ(token[0], best);
}

// Engine::open picks the GPU and its teacher-forced logits match the CPU engine's.
TEST(ModelGpuEngine, EngineOnCudaMatchesEngineOnCpu) {
  GRANULE_REQUIRE_GPU();
  const auto path = model_path("engine");
  write_synthetic_model(small_spec("llama", TensorType::Q6_K), path);
  EngineOptions gpu_options, cpu_options;
  gpu_options.device = DeviceKind::Cuda;
  cpu_options.device = DeviceKind::Cpu;
  gpu_options.context_length = cpu_options.context_length = 256;
  auto gpu = Engine::open(path, gpu_options);
  auto cpu = Engine::open(path, cpu_options);
  EXPECT_NE(gpu->device_name().find("CUDA"), std::string::npos) << gpu->device_name();
  const std::vector<int32_t> tokens = random_tokens(40, gpu->config().n_vocab, 11);
  const auto g = gpu->logits_for(tokens), c = cpu->logits_for(tokens);
  std::vector<float> gf, cf;
  for (const auto& row : g) gf.insert(gf.end(), row.begin(), row.end());
  for (const auto& row : c) cf.insert(cf.end(), row.begin(), row.end());
  expect_close(compare_rows(cf, gf, gpu->config().n_vocab, tolerance_for(TensorType::Q6_K)),
               "engine logits_for");
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace granule
