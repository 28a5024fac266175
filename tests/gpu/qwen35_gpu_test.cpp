// Qwen3.5 (`qwen35`) on the GPU (issue 37): the CUDA backend against the CPU reference (f32,
// exact path: the CPU backend has no rounding of the GPU's for hybrid models) on the tiny-qwen35
// preset widened to shapes the GPU kernels run — hidden 256; 4 query heads of 128 over 2 KV heads
// with Q's per-head output gate, QK norms and the section rope over the first 32 dimensions in
// sections 6/5/3/2 (two pairs of the fourth section do not turn); Gated DeltaNet layers of 2 key /
// 4 value heads of 64 with a 4-tap convolution; layers delta, delta, delta, attention, delta; F32
// and Q8_0 weights:
//   - a prefill of 64 rows (the matvec path) and 16 graph-captured decode steps;
//   - a prefill of 2 x 150 rows (the cuBLAS path, the flash-attention prefill, the state carried
//     from the first chunk to the second) then decode at 300;
//   - 6 sequences at different lengths decoding together (a graph of 8 rows, 2 of them padding),
//     then one step of their 6 decode rows beside a 100-token prompt continuing slot 1 (a chunked
//     run and token-by-token runs in one launch);
//   - a second turn from a snapshot: a chat's state and KV copied to host memory and back into
//     another slot continue exactly (to the bit) as the chat that kept them, and stay within the
//     bound of the CPU reference;
//   - a step that does not continue its slot's state is refused, and the state slots are their
//     own ledger category.
// The prompts of 64 rows and more (the prefill of 64, both halves of 2 x 150, the prompts of 90,
// 119 and 148 of the batched case, the mixed step's 100, the snapshot's first turn of 80) take the
// chunked delta rule (kernels::kDeltaNetChunkedMinRows, asserted below), the rest token by token.
// Each row's centred logits within a bound of the reference's spread, and their mean within a
// third of it; greedy tokens equal except where the reference's top two are within the bound. The
// bounds (bound_for): f32 weights on the matvec path differ from the reference by summation order
// and the f16 KV only (1e-2); the GEMM path rounds its operands to f16 (5e-2); Q8_0 reads int8
// activations, which on these random synthetic weights move logits by about a tenth of their
// spread (the CPU's int8 path against its f32 one, measured: mean 0.10, worst 0.40 of the spread
// over 300 rows; the CPU has no emulation of the GPU's rounding for hybrid models); the GPU's
// int8 path measured twice that, so 0.75 there (bound_for): a wrong kernel moves them by several
// spreads.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <span>

#include "backends/backend.h"
#include "backends/kernel_config_env.h"
#include "delta_net.cuh"
#include "gpu_test_support.h"
#include "granule/error.h"
#include "granule/gguf.h"
#include "granule/model_config.h"
#include "granule/telemetry.h"
#include "granule/testkit/synthetic_model.h"
#include "memory/kv_space.h"
#include "memory/memory_manager.h"
#include "oracle_sections.h"
#include "runtime/runtime.h"
#include "support/model_runtime.h"
#include "support/temp_model.h"

namespace granule {
namespace {

// The prefill cases below are chunked from 64 rows on (the header's list).
static_assert(kernels::kDeltaNetChunkedMinRows <= 64);

RuntimeOptions options(bool gpu) {
  RuntimeOptions o;
  o.device = gpu ? DeviceKind::Cuda : DeviceKind::Cpu;
  o.backend.vram_budget_bytes = uint64_t{1} << 40;
  o.backend.cpu_exact_numerics = !gpu;
  o.backend.cpu_threads = 2;
  o.context_length = 512;
  o.slots = 8;
  o.kv_pool_granules = 0;
  return o;
}

using Rig = test::ModelRuntime;
using test::random_tokens;

double bound_for(TensorType type, bool gemm_path) {
  // Measured on an H100 (2026-12-06) against this exact reference: Q8_0 on the matvec path
  // (prefill 64, graph decode) max 0.55 / 0.60, mean 0.21 / 0.23 of the spread; on the GEMM
  // path max 0.03; greedy tokens equal in every row. The CPU's own int8 path gives half that
  // (mean 0.10, max 0.34): the GPU's int8 rounding moves these logits twice as far, not yet
  // explained. A wrong kernel moves them by several spreads.
  if (type != TensorType::F32) return 0.75;
  return gemm_path ? 5e-2 : 1e-2;
}

// Rows of `gpu` against `ref` (n_vocab logits each): centred error over the reference's spread
// within `bound`; the greedy token equal unless the reference's margin is within the bound (such
// near-ties: 4 in 64 rows, a fifth of the rows under int8 noise, bound 0.3).

void expect_close(const std::vector<float>& ref, const std::vector<float>& gpu, int64_t n_vocab,
                  double bound, const std::string& what) {
  ASSERT_EQ(ref.size(), gpu.size()) << what;
  const auto rows = static_cast<int64_t>(ref.size()) / n_vocab;
  double worst = 0, total = 0;
  int past = 0, mismatches = 0, near_ties = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* f = ref.data() + r * n_vocab;
    const float* g = gpu.data() + r * n_vocab;
    const double spread = gpu_test::spread_of(f, n_vocab).std;
    const double err = gpu_test::centred_error(g, f, n_vocab, spread);
    worst = std::max(worst, err);
    total += err;
    if (!(err <= bound)) ++past;
    const gpu_test::TopTwo top = gpu_test::top_two({f, static_cast<size_t>(n_vocab)});
    if (gpu_test::top_two({g, static_cast<size_t>(n_vocab)}).best != top.best) {
      if (top.margin <= 2 * bound * spread)
        ++near_ties;
      else
        ++mismatches;
    }
  }
  const double mean = rows > 0 ? total / static_cast<double>(rows) : 0;
  std::cout << "[qwen35-gpu] " << what << ": rows " << rows << ", |err|/spread max " << worst
            << " mean " << mean << " (bound " << bound << "), rows past it " << past
            << ", greedy mismatches " << mismatches << ", near-ties " << near_ties << "\n";
  EXPECT_EQ(past, 0) << what;
  EXPECT_LE(mean, bound / 3) << what;
  EXPECT_EQ(mismatches, 0) << what;
  const int64_t ties_allowed = bound >= 0.1 ? rows / 5 + 4 : (rows + 63) / 64 * 4;
  EXPECT_LE(near_ties, ties_allowed) << what;
}

class Qwen35Gpu : public ::testing::TestWithParam<TensorType> {};

std::string type_name(TensorType t) { return tensor_type_name(static_cast<uint32_t>(t)); }

TEST_P(Qwen35Gpu, MatchesTheCpuReference) {
  GRANULE_REQUIRE_GPU();
  const TensorType type = GetParam();
  test::TempModel model(gpu_test::qwen35_spec(type), "qwen35-gpu");
  Rig ref(model.path, options(false)), gpu(model.path, options(true));
  const ModelConfig& c = gpu.config;
  ASSERT_TRUE(c.is_hybrid() && c.attn_output_gate);
  ASSERT_TRUE(c.layer_recurrent(0) && !c.layer_recurrent(3));
  ASSERT_LT(c.rope_dims_of(3), c.head_dim);
  ASSERT_TRUE(gpu.backend->is_gpu());
  // The matvec path's bound for the prefill of 64 and its decode steps; the GEMM path's for the
  // rest: its rows, the decode rows whose state and KV came from it, the batched decode (the
  // three longer prompts took that path) and the step beside a prompt of 100.
  const std::string name = "qwen35 " + type_name(type);
  gpu_test::ModelSections sections({&ref, &gpu}, [&](gpu_test::Section s,
                                                     const gpu_test::SectionRows& rows) {
    const bool matvec = s == gpu_test::Section::Prefill64 || s == gpu_test::Section::GraphDecode;
    const std::string note = s == gpu_test::Section::DecodeAt300 ? " (state and KV from it)" : "";
    expect_close(rows[0], rows[1], c.n_vocab, bound_for(type, !matvec),
                 name + " " + gpu_test::section_name(s) + note);
  });
  sections.prefill_64_then_decode();
  sections.prefill_150(true);
  sections.decode_six_together(29, true);
}

// A second turn from a snapshot: slot 0's chat (80 tokens) goes to host memory (KV and state) and
// comes back into slot 5, whose own state and KV it overwrites; its next turn (a prefill of 20 and
// 4 decode steps) gives the logits of a twin engine whose chat kept slot 0, to the bit.
TEST_P(Qwen35Gpu, ASnapshotContinuesTheChatExactly) {
  GRANULE_REQUIRE_GPU();
  const TensorType type = GetParam();
  test::TempModel model(gpu_test::qwen35_spec(type), "qwen35-gpu-snapshot");
  Rig gpu(model.path, options(true)), twin(model.path, options(true)),
      ref(model.path, options(false));
  const int64_t vocab = gpu.config.n_vocab;
  const uint64_t state_bytes = gpu.backend->recurrent_state_bytes();
  ASSERT_EQ(state_bytes, static_cast<uint64_t>(gpu.config.recurrent_state_bytes()));
  EXPECT_EQ(gpu.runtime.memory->bytes(MemoryCategory::RecurrentState),
            state_bytes * static_cast<uint64_t>(gpu.kv->geometry().slots));
  const std::vector<int32_t> turn1 = random_tokens(80, vocab, 21);
  for (Rig* rig : {&gpu, &twin, &ref}) rig->step({{0, turn1, 0, false}});
  gpu.step({{5, random_tokens(33, vocab, 22), 0, false}});  // slot 5 holds another chat

  std::vector<uint8_t> host(gpu.kv->live_bytes(80) + state_bytes);
  ASSERT_TRUE(gpu.backend->copy_kv_to_host(0, 80, host.data()));
  ASSERT_TRUE(gpu.backend->copy_state_to_host(0, host.data() + host.size() - state_bytes));
  ASSERT_TRUE(gpu.kv->map_through(5, 80));
  ASSERT_TRUE(gpu.backend->copy_kv_from_host(5, host.data(), 80));
  ASSERT_TRUE(gpu.backend->copy_state_from_host(5, host.data() + host.size() - state_bytes, 80));

  const std::vector<int32_t> turn2 = random_tokens(24, vocab, 23);
  std::vector<float> restored, kept, reference;
  auto run = [&](Rig& rig, int32_t slot, std::vector<float>& out) {
    std::vector<float> l = rig.step({{slot, std::span<const int32_t>(turn2.data(), 20), 80, true}});
    out.insert(out.end(), l.begin(), l.end());
    for (int i = 20; i < 24; ++i) {
      l = rig.step(
          {{slot, std::span<const int32_t>(&turn2[static_cast<size_t>(i)], 1), 80 + i, false}});
      out.insert(out.end(), l.begin(), l.end());
    }
  };
  run(gpu, 5, restored);
  run(twin, 0, kept);
  run(ref, 0, reference);
  ASSERT_EQ(restored.size(), kept.size());
  size_t differ = 0;
  for (size_t i = 0; i < kept.size(); ++i)
    if (std::memcmp(&restored[i], &kept[i], sizeof(float)) != 0) ++differ;
  EXPECT_EQ(differ, 0u) << "the restored chat's logits differ from the chat that kept its state";
  expect_close(reference, restored, vocab, bound_for(type, true),  // turn 1 took the GEMM path
               "qwen35 " + type_name(type) + " second turn from a snapshot");
  EXPECT_GT(gpu.graphs().replays, 0u);
}

// A step that neither starts over nor continues its slot's state is refused before anything runs;
// the slot then continues as before.
TEST_P(Qwen35Gpu, AStepThatDoesNotContinueTheStateIsRefused) {
  GRANULE_REQUIRE_GPU();
  test::TempModel model(gpu_test::qwen35_spec(GetParam()), "qwen35-gpu-refused");
  Rig gpu(model.path, options(true)), twin(model.path, options(true));
  const int64_t vocab = gpu.config.n_vocab;
  const std::vector<int32_t> prompt = random_tokens(10, vocab, 31);
  for (Rig* rig : {&gpu, &twin}) rig->step({{0, prompt, 0, false}});
  const std::vector<int32_t> one = {7};
  ASSERT_TRUE(gpu.kv->map_through(0, 13));
  auto forward_at = [&](int64_t start) {
    const std::vector<BatchSequence> batch = {{0, one, start, false}};
    std::vector<float> logits;
    gpu.backend->forward(batch, logits);
  };
  EXPECT_THROW(forward_at(12), UsageError);  // past the 10 tokens the state covers
  EXPECT_THROW(forward_at(9), UsageError);   // inside them: the state cannot go back
  EXPECT_EQ(gpu.step({{0, one, 10, false}}), twin.step({{0, one, 10, false}}));
}

// The batch-1 fusion (kernels/README.md) on the hybrid layers: a one-row decode step reads each
// RMSNorm's input as the product before handed it over (the embedding gather the first, the last
// down projection the output norm's) and the SwiGLU product quantises its result, so against the
// same steps on GGUF-block weights (split_weights off: no fusion) it runs three kernels fewer per
// layer (the attention and FFN norms, the down projection's quantisation), one fewer at the head
// (the output norm) and one fewer per Gated DeltaNet layer (its four input projections, back to
// back in the split layout, one product; GGUF blocks keep them apart: two launches of 3 + 1).
// On both paths the gated norm and the attention's output gate write the int8 blocks the output
// projection reads, so neither runs a quantisation kernel before ssm_out/attn_output (a fused
// Q4_0 step: 8 launches a DeltaNet layer, 7 an attention layer, as the printed count shows).
// Its logits, eager and graph-captured, stay within the matvec path's bound of the CPU reference
// (Q8_0 as above; Q4_0, the benchmark's type, on its own kernels). With ssm_beta and ssm_alpha in
// F32 (no split rows: no hand-over) a DeltaNet layer norms its own input instead and its four
// products stay two launches (Q4_0 and F32), one kernel more per such layer than the uniform
// file's fusion and one fewer than its own unfused step.
struct FusionCase {
  TensorType type;
  bool f32_gates;  // ssm_beta, ssm_alpha in F32
};

class Qwen35Fusion : public ::testing::TestWithParam<FusionCase> {};

TEST_P(Qwen35Fusion, BatchOneDecodeTakesTheFusedKernels) {
  GRANULE_REQUIRE_GPU();
  const TensorType type = GetParam().type;
  const bool f32_gates = GetParam().f32_gates;
  SyntheticModelSpec spec = gpu_test::qwen35_spec(type);
  if (f32_gates)
    spec.tensor_types = {{"ssm_beta.weight", TensorType::F32},
                         {"ssm_alpha.weight", TensorType::F32}};
  test::TempModel model(spec, "qwen35-gpu-fusion");
  RuntimeOptions eager = options(true);
  eager.backend.cuda_graphs = false;  // the step's launches counted one by one
  RuntimeOptions unsplit = eager;
  kernels::KernelConfig kc = kernel_config_from_environment();
  kc.split_weights = false;
  unsplit.backend.kernel_config = kc;
  Rig fused(model.path, eager), plain(model.path, unsplit), graphs(model.path, options(true)),
      ref(model.path, options(false));
  const int64_t vocab = fused.config.n_vocab;
  const std::vector<int32_t> prompt = random_tokens(24, vocab, 41);
  for (Rig* rig : {&fused, &plain, &graphs, &ref}) rig->step({{0, prompt, 0, false}});
  const std::vector<int32_t> next = random_tokens(8, vocab, 42);
  std::vector<float> r, f, p, g;
  auto append = [](std::vector<float>& to, const std::vector<float>& from) {
    to.insert(to.end(), from.begin(), from.end());
  };
  int32_t fused_segments = 0, plain_segments = 0;
  for (int i = 0; i < 8; ++i) {
    const std::vector<BatchSequence> batch = {
        {0, std::span<const int32_t>(&next[static_cast<size_t>(i)], 1), 24 + i, false}};
    append(r, ref.step(batch));
    append(f, fused.step(batch));
    fused_segments = fused.graphs().segments_per_step;
    append(p, plain.step(batch));
    plain_segments = plain.graphs().segments_per_step;
    append(g, graphs.step(batch));
  }
  const auto layers = static_cast<int32_t>(fused.config.n_layer);
  int32_t recurrent = 0;
  for (int32_t i = 0; i < layers; ++i) recurrent += fused.config.layer_recurrent(i) ? 1 : 0;
  std::cout << "[qwen35-gpu] " << type_name(type) << " one-row decode step: " << fused_segments
            << " host operations fused, " << plain_segments << " on GGUF blocks\n";
  EXPECT_EQ(plain_segments - fused_segments, 3 * layers + 1 + (f32_gates ? -recurrent : recurrent));
  // Q4_0 with F32 gates measured on an H100 (2026-12-06): fused and unfused (GGUF blocks) alike
  // max 0.57, mean 0.31 of the spread from the f32 reference: the unfused kernels move these
  // logits as far as the fused ones, so the bound is the type's (a wrong kernel moves them by
  // several spreads) with room for that mean.
  const double bound = f32_gates ? 1.0 : bound_for(type, false);
  const std::string name = "qwen35 " + type_name(type) + (f32_gates ? " (F32 gates)" : "");
  expect_close(r, f, vocab, bound, name + " fused decode (eager)");
  expect_close(r, g, vocab, bound, name + " fused decode (graphs)");
  expect_close(r, p, vocab, bound, name + " unfused decode (GGUF blocks)");
  EXPECT_GT(graphs.graphs().replays, 0u);
}

INSTANTIATE_TEST_SUITE_P(Types, Qwen35Fusion,
                         ::testing::Values(FusionCase{TensorType::Q8_0, false},
                                           FusionCase{TensorType::Q4_0, false},
                                           FusionCase{TensorType::Q4_0, true}),
                         [](const ::testing::TestParamInfo<FusionCase>& i) {
                           return type_name(i.param.type) + (i.param.f32_gates ? "_F32Gates" : "");
                         });

INSTANTIATE_TEST_SUITE_P(Types, Qwen35Gpu, ::testing::Values(TensorType::F32, TensorType::Q8_0),
                         [](const ::testing::TestParamInfo<TensorType>& i) {
                           return type_name(i.param);
                         });

}  // namespace
}  // namespace granule
