// The whole forward pass, CUDA backend against the CPU oracle (the CPU backend rounding where
// the GPU rounds: cpu_emulate_device_numerics) and against the plain f32 CPU reference, on
// synthetic models (the project's writer, seeded weights) at small shapes for every block type
// and architecture variant, at the default model's shapes (SmolLM2-135M, Q4_1) and on real
// weights (the default model's first 3 layers, which `setup.sh realweights` writes, and the
// whole default model where it is installed). Teacher-forced over 64 positions. Every row's error
// against the oracle must lie within a bound derived from the arithmetic (compare_rows below); the
// greedy token must agree with the oracle's, a disagreement excused only as a near-tie, and
// near-ties are capped. Each comparison prints its errors against the oracle and against the f32
// reference, per block type ("[per-type]" lines). Covered paths: prefill through the matvec kernels
// (<= 64 rows), prefill through cuBLAS (> 64 rows), decode steps replayed from CUDA graphs,
// batched decode of sequences at different lengths, and Engine::open on the GPU. The prefill
// overlap (the GEMM path's dequantisation on a second stream) is held to the one-stream path's
// logits bit for bit, with layers resident and streamed, and to its budget rule.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <span>

#include "backends/backend.h"
#include "backends/cuda/cuda_backend.h"
#include "gpu_test_support.h"
#include "granule/engine.h"
#include "granule/gguf.h"
#include "granule/model_config.h"
#include "granule/split_layout.h"
#include "granule/testkit/synthetic_model.h"
#include "memory/kv_space.h"
#include "memory/memory_manager.h"
#include "oracle_compare.h"
#include "runtime/runtime.h"
#include "support/engine_chats.h"
#include "support/model_runtime.h"
#include "support/temp_model.h"
#include "support/test_files.h"

namespace granule {
namespace {

// One forward pass of `batch` (the KV mapped through each sequence's last token first): the
// logits of the rows it asks for.
std::vector<float> forward(Runtime& runtime, const std::vector<BatchSequence>& batch) {
  const bool mapped = std::all_of(batch.begin(), batch.end(), [&](const BatchSequence& s) {
    return runtime.kv->map_through(s.slot,
                                   s.start_position + static_cast<int64_t>(s.tokens.size()));
  });
  if (!mapped) throw std::runtime_error("KV map refused");
  std::vector<float> logits;
  runtime.backend->forward(batch, logits);
  return logits;
}

// A backend with its own ledger and KV space over a model file (make_runtime, as the engine).
struct Rig : test::ModelRuntime {
  std::unique_ptr<MemoryManager>& memory = runtime.memory;

  // gpu: the CUDA backend; else the CPU backend, as the oracle when `oracle`.
  Rig(const std::filesystem::path& path, bool gpu, int slots = 4, int64_t context = 512,
      bool oracle = false, std::optional<kernels::KernelConfig> kernel_config = {},
      bool cuda_graphs = true)
      : ModelRuntime(path, options(gpu, slots, context, oracle, kernel_config, cuda_graphs)) {}

  static RuntimeOptions options(bool gpu, int slots, int64_t context, bool oracle,
                                std::optional<kernels::KernelConfig> kernel_config,
                                bool cuda_graphs) {
    RuntimeOptions options;
    options.device = gpu ? DeviceKind::Cuda : DeviceKind::Cpu;
    options.backend.vram_budget_bytes = uint64_t{1} << 40;
    options.context_length = context;
    options.slots = slots;
    options.kv_pool_granules = 0;
    options.backend.cpu_emulate_device_numerics = oracle;
    options.backend.cpu_exact_numerics = !gpu;  // the CPU reference numerics
    options.backend.kernel_config = kernel_config;
    options.backend.cuda_graphs = cuda_graphs;
    return options;
  }

  std::vector<float> run(const std::vector<BatchSequence>& batch) {
    return forward(runtime, batch);
  }
};

// Small shapes the GPU kernels support (head size 64 or 128, widths multiples of 256).
SyntheticModelSpec small_spec(const std::string& variant, TensorType type) {
  SyntheticModelSpec s = SyntheticModelSpec::preset("small-256");
  s.name = variant;
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
  } else if (variant == "q4_k_m") {
    // A Q4_K_M file as llama.cpp's quantiser writes one: Q4_K layers and embeddings, Q6_K
    // for attn_v, one ffn_down and the head, one Q5_K ffn_down (a _M mix's 5-bit fallback);
    // every K type in the split layout together.
    s.output_type = TensorType::Q6_K;
    s.tensor_types = {{"attn_v.weight", TensorType::Q6_K},
                      {"blk.0.ffn_down.weight", TensorType::Q6_K},
                      {"blk.1.ffn_down.weight", TensorType::Q5_K}};
  } else if (variant == "llama3") {
    s.llama3_rope_scaling = true;
    s.rope_theta = 500000.0f;
    s.n_head = 8;  // head size 32 would not run; keep 64 with 8 heads over 512
    s.n_embd = 512;
  }
  return s;
}

// --- The bound, derived (no GPU measurement went into it) ---------------------------------
// The oracle rounds the same operands in the same places as the GPU (int8 activation blocks,
// f16 KV, f16 GEMM operands), so what is left is:
// 1. f32 summation order and approximate intrinsics (rsqrtf, expf): a dot of n <= 1536 terms
//    summed in another order differs by ~sqrt(n)·2^-24 ≈ 2e-6 of its terms' size (1e-5 at
//    worst); the layers amplify a perturbation ~20x (measured on the CPU: a relative 2e-7
//    jitter of every normalised activation moves the logits by 4e-6 of their spread), so
//    ~1e-4 of the spread at worst: kSummationTolerance = 1e-3 of the row's spread (std of the
//    logits: the mean offset does not change a softmax) holds it with 10x to spare.
// 2. int8 rounding flips: where (1) moves an activation across a rounding boundary of its
//    int8 block, it moves by a whole step (amax/127) instead of an ulp, and every int8
//    rounding after it (later layers; later positions through the KV) is re-drawn: the row's
//    error is then that of another int8 rounding, at most |gpu - f32| + |f32 - oracle| ≈ twice
//    the oracle's own distance from the f32 reference in that row, d_row: a flip row must stay
//    within kSummationTolerance + kFlipFactor·d_row. Chance of a flip per position: 2·ε·E|q|
//    per int8 element (ε ≈ 2e-7..1e-6 relative from (1), E|q| ≈ 40 of 127), ~2,600 int8
//    elements per position at the 2-layer shapes: 0.04..0.2 per position, so at most
//    a quarter of the rows (kShallow; measured on the CPU with a 2e-7 jitter: 2 of 64). At
//    30 layers (~1e5 int8 elements per position) a flip is expected at every position and
//    the KV carries it on (the same jitter: 63 of 64 rows): no cap there.
// A greedy disagreement with the oracle is a near-tie when the oracle's top-two margin is
// within twice the row's bound; at most 2 per 64 rows at 2 layers (the CPU jitter gave 0) and 4
// at 30 layers (twice the 2 of 64 the jitter gave there, at margins of 0.9% and 1.4% of the
// spread). A greedy disagreement at a larger margin fails however close the logits are.
using gpu_test::kFlipFactor;  // oracle_compare.h, the rule every model test shares
using gpu_test::kSummationTolerance;
struct Caps {
  double flip_share;     // rows past kSummationTolerance, as a share of the rows
  int near_ties_per_64;  // greedy disagreements excused as near-ties, per 64 rows
};
constexpr Caps kShallow{0.25, 2};  // the 2-layer synthetic models
constexpr Caps kDeep{1.0, 4};      // 30 layers: the SmolLM2 shapes and the real model
// Measured on the H200 (2026-12-03), the derivation above holds for the float paths only
// (Q2_K, Q3_K, IQ4_NL, IQ4_XS and MXFP4 were f32-decoded then; since issue 41 they read int8 in
// the split layout and take the int8 caps, reads_int8 below):
// - f32/f16/bf16 and the types decoded to f32 (K-quants, IQ4, MXFP4) in the matvec and graph
//   paths: at most 3e-4 of the spread from the oracle (2e-3 from the f32 reference), no row
//   past kSummationTolerance: kShallow holds and is kept;
// - the int8 types (Q4_0, Q4_1, Q8_0; Q5_0, Q5_1, Q6_K in the split layout) flip at most
//   positions already at 2 layers (11..64 of 64 rows past 1e-3; 0.03..0.07 of the spread from
//   the oracle against 0.08..0.09 from f32), so the flip share is not capped there;
// - the cuBLAS path (150 rows) is 0.0025..0.016 of the spread from the oracle and most rows
//   pass 1e-3 (cuBLAS sums the f16 products in its own order and tiles): not capped either.
// Every row is still held to its bound and greedy agreement is exact away from near-ties.
// Near-ties on the int8 types: 0..3 per 64 rows measured (3: Q5_1, whose bound is widest);
// cap 4, as at 30 layers.
constexpr Caps kShallowInt8{1.0, 4};
constexpr Caps kShallowGemm{1.0, 2};

bool reads_int8(TensorType t) {
  const auto id = static_cast<uint32_t>(t);
  return t == TensorType::Q4_0 || t == TensorType::Q4_1 || t == TensorType::Q8_0 ||
         (kernel_config_from_environment().split_weights && kernels::split::supports(id));
}

using gpu_test::centred_error;
using gpu_test::spread_of;

struct Comparison {
  int rows = 0;
  double worst_vs_oracle = 0;  // max over rows of the centred error / the oracle row's spread
  double worst_vs_reference = 0;
  double worst_oracle_vs_reference = 0;  // d_row's largest value
  double worst_ratio = 0;                // max over rows of error / the row's bound
  int flip_rows = 0;   // rows past kSummationTolerance (within the flip bound, or failing)
  int near_ties = 0;   // greedy disagreements at the oracle's margin within 2 x bound
  int mismatches = 0;  // greedy disagreements at a clear margin
  int gpu_reference_disagreements = 0;  // greedy token differs from the f32 reference's
};

Comparison compare_rows(const std::vector<float>& oracle, const std::vector<float>& reference,
                        const std::vector<float>& gpu, int64_t n_vocab) {
  Comparison c;
  c.rows = static_cast<int>(oracle.size() / static_cast<size_t>(n_vocab));
  EXPECT_EQ(gpu.size(), oracle.size());
  EXPECT_EQ(reference.size(), oracle.size());
  if (gpu.size() != oracle.size() || reference.size() != oracle.size()) return c;
  for (int r = 0; r < c.rows; ++r) {
    const float* o = oracle.data() + r * n_vocab;
    const float* f = reference.data() + r * n_vocab;
    const float* g = gpu.data() + r * n_vocab;
    const double spread = spread_of(o, n_vocab).std;
    const double vs_oracle = centred_error(g, o, n_vocab, spread);
    const double d_row = centred_error(o, f, n_vocab, spread);
    const double bound = kSummationTolerance + kFlipFactor * d_row;
    c.worst_vs_oracle = std::max(c.worst_vs_oracle, vs_oracle);
    c.worst_vs_reference = std::max(c.worst_vs_reference, centred_error(g, f, n_vocab, spread));
    c.worst_oracle_vs_reference = std::max(c.worst_oracle_vs_reference, d_row);
    c.worst_ratio = std::max(c.worst_ratio, vs_oracle / bound);
    if (!(vs_oracle <= kSummationTolerance)) ++c.flip_rows;
    const std::span<const float> gr(g, static_cast<size_t>(n_vocab));
    const gpu_test::TopTwo top = gpu_test::top_two({o, static_cast<size_t>(n_vocab)});
    const int32_t gpu_best = gpu_test::top_two(gr).best;
    if (gpu_best != gpu_test::top_two({f, static_cast<size_t>(n_vocab)}).best)
      ++c.gpu_reference_disagreements;
    if (gpu_best != top.best) {
      if (top.margin <= 2 * bound * spread)
        ++c.near_ties;
      else
        ++c.mismatches;
    }
  }
  return c;
}

// Checks a comparison: every row within its bound, at most caps.flip_share of the rows past
// kSummationTolerance, no greedy mismatch, near-ties capped. Prints the errors (per block
// type where `type` names one).
void expect_close(const Comparison& c, const std::string& what, Caps caps,
                  const std::string& type = "") {
  const int max_flip_rows = static_cast<int>(std::ceil(caps.flip_share * c.rows));
  const int max_near_ties = (c.rows + 63) / 64 * caps.near_ties_per_64;
  std::cout << "[gpu-vs-oracle] " << what << ": rows " << c.rows << ", max |err|/spread vs oracle "
            << c.worst_vs_oracle << ", vs f32 reference " << c.worst_vs_reference
            << " (oracle vs f32 " << c.worst_oracle_vs_reference << "), rows past "
            << kSummationTolerance << ": " << c.flip_rows << " (cap " << max_flip_rows
            << "), worst err/bound " << c.worst_ratio << ", greedy mismatches " << c.mismatches
            << ", near-ties " << c.near_ties << " (cap " << max_near_ties
            << "), greedy differs from f32 in " << c.gpu_reference_disagreements << " rows\n";
  if (!type.empty())
    std::cout << "[per-type] " << type << " | " << what << " | vs oracle " << c.worst_vs_oracle
              << " | vs f32 " << c.worst_vs_reference << "\n";
  EXPECT_LE(c.worst_ratio, 1.0) << what << ": logits outside the bound against the oracle";
  EXPECT_LE(c.flip_rows, max_flip_rows)
      << what << ": more rows past the summation-order bound than int8 flips explain";
  EXPECT_EQ(c.mismatches, 0) << what << ": greedy token differs where the oracle's margin is clear";
  EXPECT_LE(c.near_ties, max_near_ties) << what << ": too many greedy disagreements at near-ties";
}

std::vector<int32_t> random_tokens(int n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(3, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = dist(rng);
  return t;
}

// The positions of `tokens` fed one decode step at a time into `slot` (teacher forcing): the
// logits of every step, one row each.
std::vector<float> run_steps(Rig& rig, int32_t slot, const std::vector<int32_t>& tokens) {
  std::vector<float> rows;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::vector<float> row =
        rig.run({{slot, std::span<const int32_t>(&tokens[i], 1), static_cast<int64_t>(i), false}});
    rows.insert(rows.end(), row.begin(), row.end());
  }
  return rows;
}

// The CPU reference's, the oracle's and the GPU's logits of the same runs, row after row.
struct Rows3 {
  std::vector<float> ref, want, got;
};

// Three sequences at different lengths decoding together: prompts of kBatchLengths tokens
// (seeded prompt_seed + s) prefilled into slots first_slot.. on each rig, then `steps` decode
// steps of one token each for all three in one batch (seeded step_seed + step).
constexpr int kBatchLengths[3] = {5, 40, 1};
Rows3 batched_decode(Rig& cpu, Rig& oracle, Rig& gpu, int first_slot, int steps,
                     uint32_t prompt_seed, uint32_t step_seed) {
  const int64_t vocab = cpu.config.n_vocab;
  for (int s = 0; s < 3; ++s) {
    const std::vector<int32_t> prompt = random_tokens(kBatchLengths[s], vocab, prompt_seed + s);
    for (Rig* r : {&cpu, &oracle, &gpu}) r->run({{first_slot + s, prompt, 0, false}});
  }
  Rows3 rows;
  for (int step = 0; step < steps; ++step) {
    const std::vector<int32_t> next = random_tokens(3, vocab, step_seed + step);
    std::vector<BatchSequence> batch;
    for (int s = 0; s < 3; ++s)
      batch.push_back(
          {first_slot + s, std::span<const int32_t>(&next[s], 1), kBatchLengths[s] + step, false});
    const std::vector<float> c = cpu.run(batch), o = oracle.run(batch), g = gpu.run(batch);
    rows.ref.insert(rows.ref.end(), c.begin(), c.end());
    rows.want.insert(rows.want.end(), o.begin(), o.end());
    rows.got.insert(rows.got.end(), g.begin(), g.end());
  }
  return rows;
}

size_t bitwise_differences(const std::vector<float>& a, const std::vector<float>& b) {
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) ++differ;
  return differ;
}

struct ModelCase {
  std::string variant;
  TensorType type;
};

class ModelGpuVsCpu : public ::testing::TestWithParam<ModelCase> {};

TEST_P(ModelGpuVsCpu, TeacherForcedPrefillDecodeAndGemmPathsMatchTheOracle) {
  GRANULE_REQUIRE_GPU();
  const ModelCase mc = GetParam();
  const std::string type(tensor_type_info(mc.type).name);
  const std::string name = mc.variant + "-" + type;
  const test::TempModel model(small_spec(mc.variant, mc.type), "granule-gpu-test-" + name);
  const std::filesystem::path& path = model.path;
  Rig cpu(path, false), oracle(path, false, 4, 512, true), gpu(path, true);
  const int64_t vocab = cpu.config.n_vocab;

  // The mixed model holds int8-reading Q5_1 among its f32-decoded types.
  const Caps caps = reads_int8(mc.type) || mc.variant == "mixed" ? kShallowInt8 : kShallow;
  // 1. 64 positions teacher-forced in one prefill (matvec path on the GPU).
  const std::vector<int32_t> tokens = random_tokens(64, vocab, 5);
  const std::vector<float> ref = cpu.run({{0, tokens, 0, true}});
  const std::vector<float> want = oracle.run({{0, tokens, 0, true}});
  expect_close(compare_rows(want, ref, gpu.run({{0, tokens, 0, true}}), vocab),
               name + " prefill 64 (matvec)", caps, type + " prefill-64");

  // 2. The same positions as decode steps (graph replays), slot 1, against the oracle's own
  // one-row steps: a 64-row run may take the f16 products (KernelConfig::f16_mma_min_rows)
  // where a one-row step rounds to int8.
  expect_close(compare_rows(run_steps(oracle, 1, tokens), ref, run_steps(gpu, 1, tokens), vocab),
               name + " decode steps (graphs)", caps, type + " decode");

  // 3. 150 positions in one prefill: the cuBLAS path (f16 operands; the head's input still
  // int8 for the int8 types).
  const std::vector<int32_t> long_tokens = random_tokens(150, vocab, 6);
  expect_close(
      compare_rows(oracle.run({{2, long_tokens, 0, true}}), cpu.run({{2, long_tokens, 0, true}}),
                   gpu.run({{2, long_tokens, 0, true}}), vocab),
      name + " prefill 150 (cuBLAS)", kShallowGemm, type + " prefill-150-cublas");
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

// Q4_K and Q5_K in the split layout (int8 dp4a decode, int8 tensor cores for the 64-row
// prefill, split f16 dequantise for the GEMM, split embedding rows), beside the "llama" cases
// above: the Qwen2 shape (biases, tied embeddings: the head reads the split embedding table) and
// a Q4_K_M-like mix.
INSTANTIATE_TEST_SUITE_P(
    KQuantSplit, ModelGpuVsCpu,
    ::testing::Values(ModelCase{"qwen2", TensorType::Q4_K}, ModelCase{"qwen2", TensorType::Q5_K},
                      ModelCase{"llama3", TensorType::Q5_K}, ModelCase{"q4_k_m", TensorType::Q4_K}),
    [](const ::testing::TestParamInfo<ModelCase>& i) {
      return i.param.variant + "_" + std::string(tensor_type_info(i.param.type).name);
    });

// Sequences at different lengths decoding together in one batch, against the oracle and the
// CPU reference doing the same batches.
TEST(ModelGpuBatch, BatchedDecodeAtDifferentLengthsMatchesTheOracle) {
  GRANULE_REQUIRE_GPU();
  const test::TempModel model(small_spec("llama", TensorType::Q4_0), "granule-gpu-test-batch");
  const std::filesystem::path& path = model.path;
  Rig cpu(path, false), oracle(path, false, 4, 512, true), gpu(path, true);
  const int64_t vocab = cpu.config.n_vocab;
  const Rows3 rows = batched_decode(cpu, oracle, gpu, 0, 12, 100, 200);
  // The 40-token prompt takes the f16 products where they are on for 40 rows: their f16
  // roundings flip far more often than int8 blocks do (each flip is an f16 step, not an int8
  // one), so, as for the int8 types, the share of rows past the summation tolerance is not
  // capped; the bound per row still holds.
  const int f16_from = kernel_config_from_environment().f16_mma_min_rows;
  const bool f16_prompt = f16_from > 0 && f16_from <= kBatchLengths[1];
  expect_close(compare_rows(rows.want, rows.ref, rows.got, vocab), "batched decode (3 sequences)",
               f16_prompt ? kShallowInt8 : kShallow, "Q4_0 batched-decode");
}

// A Q4_K_M-like model (Q4_K layers, a Q5_K and a Q6_K down projection, Q6_K attn_v and head)
// with 8 and then 33 sequences decoding together, one token each per step (decode graphs of 8
// and 64 rows): every product of those steps takes the int8 tensor cores (kernels/README.md),
// the fused SwiGLU on Q4_K gate/up included, against the oracle and the CPU reference doing
// the same batches; and against the dp4a kernels (mma off), whose other summation order must
// show in the logits: the tensor-core path really ran.
TEST(ModelGpuBatch, KQuantDecodeOfManySequencesMatchesTheOracle) {
  GRANULE_REQUIRE_GPU();
  const test::TempModel model(small_spec("q4_k_m", TensorType::Q4_K),
                              "granule-gpu-test-kquant-batch");
  const std::filesystem::path& path = model.path;
  constexpr int kCounts[] = {8, 33};
  constexpr int kSlots = kCounts[0] + kCounts[1], kSteps = 4;
  kernels::KernelConfig dp4a = gpu_test::kernel_config();
  dp4a.mma = false;
  Rig cpu(path, false, kSlots, 64), oracle(path, false, kSlots, 64, true),
      gpu(path, true, kSlots, 64), gpu_dp4a(path, true, kSlots, 64, false, dp4a);
  if (!dynamic_cast<cuda::CudaBackend&>(*gpu.backend).model().kernel_config().mma)
    GTEST_SKIP() << "no int8 mma on this device or build";
  const int64_t vocab = cpu.config.n_vocab;
  int first_slot = 0;
  for (const int count : kCounts) {
    auto prompt_length = [](int s) { return 1 + s % 7; };
    for (int s = 0; s < count; ++s) {
      const std::vector<int32_t> prompt =
          random_tokens(prompt_length(s), vocab, static_cast<uint32_t>(300 + first_slot + s));
      for (Rig* r : {&cpu, &oracle, &gpu, &gpu_dp4a}) r->run({{first_slot + s, prompt, 0, false}});
    }
    Rows3 rows;
    std::vector<float> got_dp4a;
    for (int step = 0; step < kSteps; ++step) {
      const std::vector<int32_t> next =
          random_tokens(count, vocab, static_cast<uint32_t>(400 + 10 * count + step));
      std::vector<BatchSequence> batch;
      for (int s = 0; s < count; ++s)
        batch.push_back({first_slot + s, std::span<const int32_t>(&next[static_cast<size_t>(s)], 1),
                         prompt_length(s) + step, false});
      const std::vector<float> c = cpu.run(batch), o = oracle.run(batch), g = gpu.run(batch),
                               d = gpu_dp4a.run(batch);
      rows.ref.insert(rows.ref.end(), c.begin(), c.end());
      rows.want.insert(rows.want.end(), o.begin(), o.end());
      rows.got.insert(rows.got.end(), g.begin(), g.end());
      got_dp4a.insert(got_dp4a.end(), d.begin(), d.end());
    }
    const std::string what = "Q4_K_M decode, " + std::to_string(count) + " sequences";
    expect_close(compare_rows(rows.want, rows.ref, rows.got, vocab), what, kShallowInt8,
                 "Q4_K batched-decode-" + std::to_string(count));
    EXPECT_GT(bitwise_differences(rows.got, got_dp4a), 0u)
        << what << ": the same logits with mma off: the tensor-core path did not run";
    first_slot += count;
  }
}

// The f16 tensor-core products (KernelConfig::f16_mma_min_rows = 1: every run of at most 64
// rows of split Q4_0/Q4_1/Q8_0/Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_NL/IQ4_XS/MXFP4 layers reads f16
// activations and weights dequantised to f16 in registers) against the oracle, which rounds as the
// int8 path does: the f16 path sits nearer the f32 reference, so its distance to the oracle is the
// oracle's own int8 rounding, inside the bound (twice that). A 64-row teacher-forced run, 1-row
// decode steps (graphs) and three sequences at different lengths decoding together; the SmolLM2
// shapes (30 layers, Q4_1, 576 wide) too. The logits must differ from the int8 path's: the f16
// path really ran.
// A model case of the parametrised suites below: its name, spec and the caps it is held to.
struct SpecCase {
  std::string name;
  SyntheticModelSpec spec;
  Caps caps;
};
std::string spec_case_name(const ::testing::TestParamInfo<SpecCase>& i) { return i.param.name; }

class ModelGpuF16Mma : public ::testing::TestWithParam<SpecCase> {};

TEST_P(ModelGpuF16Mma, DecodeRunsMatchTheOracle) {
  GRANULE_REQUIRE_GPU();
  const SpecCase& fc = GetParam();
  const test::TempModel model(fc.spec, "granule-gpu-test-f16mma-" + fc.name);
  const std::filesystem::path& path = model.path;
  kernels::KernelConfig f16 = gpu_test::kernel_config(), int8 = f16;
  f16.f16_mma_min_rows = 1;
  int8.f16_mma_min_rows = 0;
  Rig cpu(path, false), oracle(path, false, 4, 512, true), gpu(path, true, 4, 512, false, f16),
      gpu_int8(path, true, 4, 512, false, int8);
  ASSERT_EQ(dynamic_cast<cuda::CudaBackend&>(*gpu.backend).model().kernel_config().f16_mma_min_rows,
            1)
      << "the device turned the f16 products off";
  const int64_t vocab = cpu.config.n_vocab;

  const std::vector<int32_t> tokens = random_tokens(64, vocab, 7);
  const std::vector<float> got = gpu.run({{0, tokens, 0, true}});
  expect_close(
      compare_rows(oracle.run({{0, tokens, 0, true}}), cpu.run({{0, tokens, 0, true}}), got, vocab),
      fc.name + " f16 mma, 64 rows", fc.caps, fc.name + " f16mma-64");
  EXPECT_GT(bitwise_differences(got, gpu_int8.run({{0, tokens, 0, true}})), got.size() / 2)
      << "the f16 and int8 paths gave the same logits: the f16 path did not run";

  std::vector<float> stepped, want, ref;
  for (size_t i = 0; i < 16; ++i) {
    const std::span<const int32_t> one(&tokens[i], 1);
    const std::vector<float> g = gpu.run({{1, one, static_cast<int64_t>(i), false}}),
                             o = oracle.run({{1, one, static_cast<int64_t>(i), false}}),
                             c = cpu.run({{1, one, static_cast<int64_t>(i), false}});
    stepped.insert(stepped.end(), g.begin(), g.end());
    want.insert(want.end(), o.begin(), o.end());
    ref.insert(ref.end(), c.begin(), c.end());
  }
  expect_close(compare_rows(want, ref, stepped, vocab), fc.name + " f16 mma, decode steps", fc.caps,
               fc.name + " f16mma-decode");

  const Rows3 batched = batched_decode(cpu, oracle, gpu, 1, 8, 300, 400);
  expect_close(compare_rows(batched.want, batched.ref, batched.got, vocab),
               fc.name + " f16 mma, 3 sequences", fc.caps, fc.name + " f16mma-batched");
}

INSTANTIATE_TEST_SUITE_P(
    Models, ModelGpuF16Mma,
    ::testing::Values(
        SpecCase{"llama_Q4_0", small_spec("llama", TensorType::Q4_0), kShallowInt8},
        SpecCase{"llama_Q4_1", small_spec("llama", TensorType::Q4_1), kShallowInt8},
        SpecCase{"llama3_Q4_0", small_spec("llama3", TensorType::Q4_0), kShallowInt8},
        SpecCase{"llama_Q8_0", small_spec("llama", TensorType::Q8_0), kShallowInt8},
        SpecCase{"llama_Q2_K", small_spec("llama", TensorType::Q2_K), kShallowInt8},
        SpecCase{"llama_Q3_K", small_spec("llama", TensorType::Q3_K), kShallowInt8},
        SpecCase{"llama_Q4_K", small_spec("llama", TensorType::Q4_K), kShallowInt8},
        SpecCase{"llama_Q5_K", small_spec("llama", TensorType::Q5_K), kShallowInt8},
        SpecCase{"llama_Q6_K", small_spec("llama", TensorType::Q6_K), kShallowInt8},
        SpecCase{"llama_IQ4_NL", small_spec("llama", TensorType::IQ4_NL), kShallowInt8},
        SpecCase{"llama_IQ4_XS", small_spec("llama", TensorType::IQ4_XS), kShallowInt8},
        SpecCase{"llama_MXFP4", small_spec("llama", TensorType::MXFP4), kShallowInt8},
        SpecCase{"q4_k_m", small_spec("q4_k_m", TensorType::Q4_K), kShallowInt8},
        SpecCase{"smollm2_shapes", SyntheticModelSpec::preset("smollm2-135m"), kDeep}),
    spec_case_name);

// The batch-1 fusion (kernels/README.md): the output and down projections hand the next
// RMSNorm's input over as int8 blocks of y·w with the sums of squares, the gate/up product
// quantises its SwiGLU result (where it runs in one wave: the small models, the SmolLM2 shapes;
// a wide feed-forward, 8B-like with more 32-row blocks than SMs, in blocks that own a 32-row
// block each, wide_ff_spec), the Q/K/V product does RoPE and the K/V write (llama and the
// SmolLM2 shapes; Qwen2's NeoX pairs and Qwen3's Q/K norms keep rope_kv), and the embedding
// gather and the last down projection hand the first and the output norm over. One-row decode
// steps (graphs) against the oracle's own steps; two passes over the same positions must give
// the same bits, and the step's graph must hold only the fused kernels: the gather, per layer
// Q/K/V (+ rope_kv), attention, the output projection, gate/up and down, and the head.

class ModelGpuDecodeFusion : public ::testing::TestWithParam<SpecCase> {};

// A feed-forward wider than the SMs hold 32-row blocks of 32 warps at once (8,192: 256 blocks),
// as an 8B model's: the gate/up product quantises its result in blocks that own a 32-row block
// each.
SyntheticModelSpec wide_ff_spec() {
  SyntheticModelSpec s = small_spec("llama", TensorType::Q4_0);
  s.n_ff = 8192;
  return s;
}

TEST_P(ModelGpuDecodeFusion, OneRowStepsMatchTheOracle) {
  GRANULE_REQUIRE_GPU();
  const SpecCase& fc = GetParam();
  const test::TempModel model(fc.spec, "granule-gpu-test-fusion-" + fc.name);
  const std::filesystem::path& path = model.path;
  Rig cpu(path, false, 2, 256), oracle(path, false, 2, 256, true), gpu(path, true, 2, 256);
  const int64_t vocab = cpu.config.n_vocab;
  const std::vector<int32_t> tokens = random_tokens(24, vocab, 11);
  const std::vector<float> ref = run_steps(cpu, 0, tokens), want = run_steps(oracle, 0, tokens);
  const std::vector<float> got = run_steps(gpu, 0, tokens);
  expect_close(compare_rows(want, ref, got, vocab), fc.name + " decode steps, fused", fc.caps,
               fc.name + " fused");
  EXPECT_EQ(bitwise_differences(got, run_steps(gpu, 1, tokens)), 0u)
      << "a second pass gave other bits";
  TelemetrySnapshot snapshot;
  gpu.backend->fill_telemetry(snapshot);
  const bool rope_kv = gpu.config.rope_ordering == RopeOrdering::NeoX || gpu.config.qk_norm;
  EXPECT_EQ(snapshot.graphs.nodes, 2 + gpu.config.n_layer * (rope_kv ? 6 : 5))
      << "the one-row step's graph holds kernels the fusion leaves out";
}

INSTANTIATE_TEST_SUITE_P(
    Models, ModelGpuDecodeFusion,
    ::testing::Values(
        SpecCase{"llama_Q4_0", small_spec("llama", TensorType::Q4_0), kShallowInt8},
        SpecCase{"qwen3_Q4_K", small_spec("qwen3", TensorType::Q4_K), kShallowInt8},
        SpecCase{"qwen2_Q8_0", small_spec("qwen2", TensorType::Q8_0), kShallowInt8},
        SpecCase{"smollm2_shapes", SyntheticModelSpec::preset("smollm2-135m"), kDeep},
        SpecCase{"llama_Q4_0_wide_ff", wide_ff_spec(), kShallowInt8},
        // issue 41: the types that joined the split layout
        SpecCase{"llama_Q2_K", small_spec("llama", TensorType::Q2_K), kShallowInt8},
        SpecCase{"llama_Q3_K", small_spec("llama", TensorType::Q3_K), kShallowInt8},
        SpecCase{"llama_IQ4_NL", small_spec("llama", TensorType::IQ4_NL), kShallowInt8},
        SpecCase{"llama_IQ4_XS", small_spec("llama", TensorType::IQ4_XS), kShallowInt8},
        SpecCase{"llama_MXFP4", small_spec("llama", TensorType::MXFP4), kShallowInt8}),
    spec_case_name);

// The default model's shapes: 30 layers, 576 wide, 9/3 heads, ff 1536, vocab 49152, Q4_1
// layers, Q8_0 tied embeddings (the smollm2-135m preset). Deep: int8 flips at every position
// (no cap on flip rows; see the bound's derivation).
TEST(ModelGpuDefaultShapes, SmolLM2ShapesTeacherForced64Positions) {
  GRANULE_REQUIRE_GPU();
  const test::TempModel model(SyntheticModelSpec::preset("smollm2-135m"),
                              "granule-gpu-test-smollm2-135m");
  const std::filesystem::path& path = model.path;
  Rig cpu(path, false, 2, 256), oracle(path, false, 2, 256, true), gpu(path, true, 2, 256);
  const int64_t vocab = cpu.config.n_vocab;
  const std::vector<int32_t> tokens = random_tokens(64, vocab, 7);
  const std::vector<float> ref = cpu.run({{0, tokens, 0, true}});
  const std::vector<float> want = oracle.run({{0, tokens, 0, true}});
  expect_close(compare_rows(want, ref, gpu.run({{0, tokens, 0, true}}), vocab),
               "smollm2-135m shapes prefill 64", kDeep, "Q4_1+Q8_0 smollm2-shapes prefill-64");
  expect_close(compare_rows(run_steps(oracle, 1, tokens), ref, run_steps(gpu, 1, tokens), vocab),
               "smollm2-135m shapes decode steps", kDeep, "Q4_1+Q8_0 smollm2-shapes decode");
}

std::unique_ptr<Engine> open_engine(const std::filesystem::path& path, DeviceKind device,
                                    bool oracle = false) {
  EngineOptions options;
  options.device = device;
  options.context_length = 256;
  options.cpu_emulate_device_numerics = oracle;
  options.cpu_exact_numerics = device == DeviceKind::Cpu;  // the CPU reference numerics
  return Engine::open(path, options);
}

std::vector<float> flat(const std::vector<std::vector<float>>& rows) {
  std::vector<float> out;
  for (const auto& row : rows) out.insert(out.end(), row.begin(), row.end());
  return out;
}

// --- Real weights ----------------------------------------------------------------------
// The default model's first layers (test::kRealWeightsLayers: 3) with its real embeddings, head
// and tokenizer (38.5 MB,
// written by `setup.sh realweights` into the test data folder: small enough to travel to a GPU
// machine), and the whole default model (SmolLM2-135M-Instruct Q4_1, 30 layers) where it is
// installed: real activations, Q4_1 layers (int8 flips at most positions: no cap on flip rows,
// as kShallowInt8 and kDeep say) and Q8_0 tied embeddings.
struct RealModel {
  std::string name;
  std::function<std::filesystem::path()> path;  // empty when the file is not there
  std::string missing;                          // how to get it
  Caps caps;
};

// How gtest shows a case: its name.
void PrintTo(const RealModel& m, std::ostream* os) { *os << m.name; }

class ModelGpuRealWeights : public ::testing::TestWithParam<RealModel> {
 protected:
  void SetUp() override {
    GRANULE_REQUIRE_GPU();
    path_ = GetParam().path();
    if (path_.empty()) GTEST_SKIP() << GetParam().name << " is not there: " << GetParam().missing;
  }
  std::filesystem::path path_;
};

// 64 positions of English text teacher-forced through the engine on the GPU, the oracle and
// the CPU.
TEST_P(ModelGpuRealWeights, TeacherForced64PositionsMatchTheOracle) {
  const RealModel& model = GetParam();
  auto gpu = open_engine(path_, DeviceKind::Cuda), cpu = open_engine(path_, DeviceKind::Cpu),
       oracle = open_engine(path_, DeviceKind::Cpu, true);
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
  expect_close(compare_rows(flat(oracle->logits_for(tokens)), flat(cpu->logits_for(tokens)),
                            flat(gpu->logits_for(tokens)), gpu->config().n_vocab),
               "real SmolLM2-135M-Instruct Q4_1, " + model.name + ", logits_for 64", model.caps,
               "Q4_1+Q8_0 real-smollm2-" + model.name + " prefill-64");
}

// A chat question answered greedily through the engine, 32 tokens with EOS ignored: the GPU
// must give all 32 and finish at the token limit, and its tokens must be the oracle's; a
// divergence is excused only where the oracle's top-two margin at that position is within
// twice the row's bound (compare_rows' bound, relative to the spread of the logits, not to an
// RMS that includes their mean). The f32 reference's answer is reported.
TEST_P(ModelGpuRealWeights, GreedyAnswerMatchesTheOracle) {
  const RealModel& model = GetParam();
  constexpr int32_t kTokens = 32;
  auto gpu = open_engine(path_, DeviceKind::Cuda), cpu = open_engine(path_, DeviceKind::Cpu),
       oracle = open_engine(path_, DeviceKind::Cpu, true);
  const std::vector<int32_t> prompt = cpu->tokenizer().encode(
      "<|im_start|>user\nWhat is the capital of France? Answer in one sentence.<|im_end|>\n"
      "<|im_start|>assistant\n",
      false, true);
  auto greedy_answer = [&prompt](Engine& engine) {
    test::Output out;
    engine.submit(test::chat_request({prompt, kTokens}, out));
    test::run_to_idle(engine);
    return out;
  };
  const test::Output on_gpu = greedy_answer(*gpu), on_oracle = greedy_answer(*oracle),
                     on_cpu = greedy_answer(*cpu);
  ASSERT_EQ(on_gpu.reason, FinishReason::MaxTokens) << "GPU: " << on_gpu.error;
  ASSERT_EQ(on_gpu.tokens.size(), static_cast<size_t>(kTokens));
  ASSERT_EQ(on_oracle.reason, FinishReason::MaxTokens) << "oracle: " << on_oracle.error;
  ASSERT_EQ(on_oracle.tokens.size(), static_cast<size_t>(kTokens));
  ASSERT_EQ(on_cpu.tokens.size(), static_cast<size_t>(kTokens)) << on_cpu.error;
  auto common_prefix = [](const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    return static_cast<size_t>(std::mismatch(a.begin(), a.end(), b.begin(), b.end()).first -
                               a.begin());
  };
  const size_t common = common_prefix(on_gpu.tokens, on_oracle.tokens);
  std::cout << "[gpu-vs-oracle] real SmolLM2 " << model.name << " greedy answer, " << kTokens
            << " tokens: GPU and oracle identical for " << common << ", GPU and f32 reference for "
            << common_prefix(on_gpu.tokens, on_cpu.tokens) << " (\""
            << gpu->tokenizer().decode(on_gpu.tokens) << "\")\n";
  if (common < on_gpu.tokens.size()) {
    std::vector<int32_t> context = prompt;
    context.insert(context.end(), on_oracle.tokens.begin(),
                   on_oracle.tokens.begin() + static_cast<long>(common));
    const std::vector<float> o = oracle->logits_for(context).back();
    const std::vector<float> f = cpu->logits_for(context).back();
    const auto n = static_cast<int64_t>(o.size());
    const double spread = spread_of(o.data(), n).std;
    const double bound = gpu_test::row_bound(o.data(), f.data(), n, spread);
    const double margin = gpu_test::top_two(o).margin;
    std::cout << "[gpu-vs-oracle] diverged at token " << common << ": oracle margin " << margin
              << " = " << margin / spread << " x spread (near-tie up to " << 2 * bound << ")\n";
    EXPECT_LE(margin, 2 * bound * spread)
        << "the answers diverge where the oracle's choice is clear";
  }
}

INSTANTIATE_TEST_SUITE_P(
    SmolLM2, ModelGpuRealWeights,
    ::testing::Values(RealModel{"first_" + std::to_string(test::kRealWeightsLayers) + "_layers",
                                test::real_weights_model_path,
                                "write it with 'bash packaging/setup.sh realweights' (into " +
                                    std::string(GRANULE_TESTDATA_DIR) + ")",
                                kShallowInt8},
                      RealModel{"all_30_layers", test::default_model_path,
                                "the default model is not installed (setup.sh model)", kDeep}),
    [](const ::testing::TestParamInfo<RealModel>& i) { return i.param.name; });

// Device sampling through the backend: greedy picks the argmax of the logits forward()
// returns for the same step.
TEST(ModelGpuSampling, GreedyForwardSampleMatchesLogitsArgmax) {
  GRANULE_REQUIRE_GPU();
  const test::TempModel model(small_spec("llama", TensorType::Q4_K), "granule-gpu-test-sample");
  const std::filesystem::path& path = model.path;
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

// Decode graphs with a token head copy their own inputs and tokens: they give the tokens of
// eager steps, whose copies are queued around the kernels, greedy and sampled (penalties over
// the history, seeded draws), at 1 and 3 rows (bucket 4: a padding row), each step's tokens fed
// back.
TEST(ModelGpuSampling, StepCopiesInTheGraphGiveTheSameTokens) {
  GRANULE_REQUIRE_GPU();
  const test::TempModel model(small_spec("llama", TensorType::Q4_0), "granule-gpu-test-graph-io");
  const std::filesystem::path& path = model.path;
  SamplingParams sampled;  // the defaults: temperature, top-k/p, min-p, repetition penalty
  sampled.seed = 5;
  for (const SamplingParams& params : {SamplingParams::greedy(), sampled}) {
    for (const int rows : {1, 3}) {
      std::vector<std::vector<int32_t>> answers;
      for (const bool graphs : {false, true}) {
        Rig gpu(path, true, 4, 512, false, {}, graphs);
        std::vector<std::vector<int32_t>> history(static_cast<size_t>(rows));
        std::vector<int32_t> current(static_cast<size_t>(rows));
        for (int s = 0; s < rows; ++s) {
          history[s] = random_tokens(6, gpu.config.n_vocab, 30 + static_cast<uint32_t>(s));
          gpu.run({{s, std::span<const int32_t>(history[s].data(), 5), 0, false}});
          current[s] = history[s][5];
        }
        std::vector<int32_t> produced;
        for (int step = 0; step < 12; ++step) {
          std::vector<BatchSequence> batch;
          for (int s = 0; s < rows; ++s) {
            const int64_t position = 5 + step;
            ASSERT_TRUE(gpu.kv->map_through(s, position + 1));
            batch.push_back({s, std::span<const int32_t>(&current[s], 1), position, false});
          }
          const std::vector<SamplingParams> p(static_cast<size_t>(rows), params);
          const std::vector<uint64_t> draws(static_cast<size_t>(rows), static_cast<uint64_t>(step));
          const std::vector<int32_t> next = gpu.backend->forward_sample(batch, p, history, draws);
          ASSERT_EQ(next.size(), static_cast<size_t>(rows));
          for (int s = 0; s < rows; ++s) {
            ASSERT_GE(next[s], 0);
            ASSERT_LT(next[s], gpu.config.n_vocab);
            current[s] = next[s];
            history[s].push_back(next[s]);
            produced.push_back(next[s]);
          }
        }
        answers.push_back(produced);
      }
      EXPECT_EQ(answers[0], answers[1])
          << (params.temperature > 0 ? "sampled" : "greedy") << ", " << rows << " rows";
    }
  }
}

// Engine::open picks the GPU and its teacher-forced logits match the oracle engine's.
TEST(ModelGpuEngine, EngineOnCudaMatchesTheOracleEngine) {
  GRANULE_REQUIRE_GPU();
  const test::TempModel model(small_spec("llama", TensorType::Q6_K), "granule-gpu-test-engine");
  const std::filesystem::path& path = model.path;
  auto gpu = open_engine(path, DeviceKind::Cuda), cpu = open_engine(path, DeviceKind::Cpu),
       oracle = open_engine(path, DeviceKind::Cpu, true);
  EXPECT_NE(gpu->device_name().find("CUDA"), std::string::npos) << gpu->device_name();
  const std::vector<int32_t> tokens = random_tokens(40, gpu->config().n_vocab, 11);
  expect_close(compare_rows(flat(oracle->logits_for(tokens)), flat(cpu->logits_for(tokens)),
                            flat(gpu->logits_for(tokens)), gpu->config().n_vocab),
               "engine logits_for", kShallowInt8, "Q6_K engine-logits_for");
}

// --- The prefill overlap ------------------------------------------------------------------

// A CUDA backend under a budget (runs of more than 64 rows on the GEMM path, whose overlap takes
// a second f16 scratch where the budget holds it); the attention scratch planned for the context
// the KV space gets, so the ledger after make_runtime is what the placement planned for.
struct OverlapRig : test::ModelRuntime {
  explicit OverlapRig(const std::filesystem::path& path, uint64_t budget = uint64_t{1} << 40)
      : ModelRuntime(path, options(budget)) {}

  static RuntimeOptions options(uint64_t budget) {
    RuntimeOptions options;
    options.device = DeviceKind::Cuda;
    options.backend.vram_budget_bytes = budget;
    options.backend.context_length = 512;
    options.context_length = 512;
    options.slots = 4;
    options.kv_pool_granules = 0;
    return options;
  }
  cuda::CudaModel& model() { return dynamic_cast<cuda::CudaBackend&>(*runtime.backend).model(); }
  uint64_t workspace_bytes() const { return runtime.memory->bytes(MemoryCategory::Workspace); }

  std::vector<float> run(const std::vector<BatchSequence>& batch) {
    return forward(runtime, batch);
  }
};

// Six Q4_0 layers: make_room() can then stream three of them through the two staging slots.
SyntheticModelSpec overlap_spec() {
  SyntheticModelSpec s = small_spec("llama", TensorType::Q4_0);
  s.n_layer = 6;
  return s;
}

// The second scratch holds the largest layer matrix in f16, as the first does.
uint64_t overlap_scratch_bytes(const SyntheticModelSpec& s) {
  return static_cast<uint64_t>(std::max(s.n_ff, s.n_embd) * s.n_embd) * sizeof(uint16_t);
}

// The overlap moves work between streams, not what it computes: the same dequantisation kernel
// writes the same f16 matrix for the same cuBLAS GEMM, so every logit of a 150-row prompt, of its
// second chunk (reading the KV of the first) and of a mixed 171-row step (two prompts and a
// decode row) is bitwise that of the one-stream path; then again with the last three of the six
// layers streamed (their dequantisations follow the copies into the staging ring, and a slot is
// reused only after the dequantisations that read it). The one-stream run repeated first shows
// the path is deterministic, so a difference can only come from the overlap's ordering. The
// one-stream rig is built under a budget without room for the second scratch (the overlap's
// bytes less half of it), then given the other rig's budget for its KV.
TEST(ModelGpuPrefillOverlap, LogitsAreBitwiseThoseOfTheOneStreamPath) {
  GRANULE_REQUIRE_GPU();
  const SyntheticModelSpec spec = overlap_spec();
  const test::TempModel model(spec, "granule-gpu-test-prefill-overlap");
  const std::filesystem::path& path = model.path;
  OverlapRig on(path);
  OverlapRig off(path, on.runtime.memory->used_bytes() - overlap_scratch_bytes(spec) / 2);
  off.runtime.memory->set_budget_bytes(on.runtime.memory->budget_bytes());
  ASSERT_TRUE(on.model().prefill_overlap());
  ASSERT_FALSE(off.model().prefill_overlap());
  EXPECT_EQ(on.workspace_bytes() - off.workspace_bytes(), overlap_scratch_bytes(spec))
      << "the second f16 scratch is charged to the ledger as workspace";
  const int64_t vocab = on.config.n_vocab;
  const std::vector<int32_t> prompt = random_tokens(150, vocab, 21),
                             more = random_tokens(130, vocab, 22),
                             first = random_tokens(40, vocab, 23),
                             decode = random_tokens(1, vocab, 24),
                             a = random_tokens(100, vocab, 25), b = random_tokens(70, vocab, 26);
  {
    const std::vector<float> once = off.run({{0, prompt, 0, true}});
    const std::vector<float> again = off.run({{0, prompt, 0, true}});
    ASSERT_EQ(once.size(), again.size());
    ASSERT_EQ(bitwise_differences(once, again), 0u)
        << "the one-stream GEMM path is not deterministic: a bitwise comparison cannot hold";
  }
  auto expect_same = [&](const std::vector<BatchSequence>& step, const std::string& what) {
    const std::vector<float> got_on = on.run(step), got_off = off.run(step);
    ASSERT_EQ(got_on.size(), got_off.size()) << what;
    ASSERT_FALSE(got_on.empty()) << what;
    const size_t differ = bitwise_differences(got_on, got_off);
    std::cout << "[prefill-overlap] " << what << ": " << got_on.size() / static_cast<size_t>(vocab)
              << " rows, " << differ << " of " << got_on.size() << " logits differ\n";
    EXPECT_EQ(differ, 0u) << what << ": logits differ from the one-stream path";
  };
  auto passes = [&](const std::string& placement) {
    expect_same({{0, prompt, 0, true}}, placement + ": prompt 150");
    expect_same({{0, more, 150, true}}, placement + ": its second chunk, 130 rows");
    for (OverlapRig* r : {&on, &off}) r->run({{1, first, 0, false}});  // the matvec path
    expect_same({{2, a, 0, true}, {1, decode, 40, true}, {3, b, 0, true}},
                placement + ": mixed step, 171 rows");
  };
  passes("every layer resident");
  for (OverlapRig* r : {&on, &off}) {
    EXPECT_GT(r->runtime.backend->make_room(1, "test: stream the last layers"), 0u);
    ASSERT_EQ(r->model().streamer().streamed_layers(), 3);
  }
  ASSERT_TRUE(on.model().prefill_overlap());
  passes("3 of 6 layers streamed");
}

// A budget that holds every layer with one scratch but not with two keeps one (the overlap
// off, no layer streamed, no error); with room for the second, it is taken and charged.
TEST(ModelGpuPrefillOverlap, ABudgetWithoutRoomForTheSecondScratchKeepsEveryLayerResident) {
  GRANULE_REQUIRE_GPU();
  const SyntheticModelSpec spec = overlap_spec();
  const test::TempModel model(spec, "granule-gpu-test-prefill-overlap-budget");
  const std::filesystem::path& path = model.path;
  const uint64_t scratch = overlap_scratch_bytes(spec);
  uint64_t one_scratch_bytes = 0, one_scratch_workspace = 0;
  {
    OverlapRig unlimited(path);
    ASSERT_TRUE(unlimited.model().prefill_overlap());
    ASSERT_EQ(unlimited.model().streamer().streamed_layers(), 0);
    one_scratch_bytes = unlimited.runtime.memory->used_bytes() - scratch;
    one_scratch_workspace = unlimited.workspace_bytes() - scratch;
  }
  {
    OverlapRig tight(path, one_scratch_bytes + scratch / 2);
    EXPECT_FALSE(tight.model().prefill_overlap());
    EXPECT_EQ(tight.model().streamer().streamed_layers(), 0);
    EXPECT_EQ(tight.workspace_bytes(), one_scratch_workspace);
  }
  {
    OverlapRig roomy(path, one_scratch_bytes + 2 * scratch);
    EXPECT_TRUE(roomy.model().prefill_overlap());
    EXPECT_EQ(roomy.model().streamer().streamed_layers(), 0);
    EXPECT_EQ(roomy.workspace_bytes(), one_scratch_workspace + scratch);
  }
}

}  // namespace
}  // namespace granule
