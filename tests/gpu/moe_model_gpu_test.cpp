// Mixture-of-experts models on the GPU (issue 36): the CUDA backend against the CPU oracle (the
// CPU backend rounding as the expert kernels round: cpu_emulate_device_numerics) and the plain
// f32 CPU reference, on synthetic qwen3moe and Mixtral-style (`llama` with experts) files at the
// smallest shapes the GPU kernels run, for F32, Q8_0, Q4_0, Q4_K and MXFP4 experts:
//   - prefill of 64 rows (the matvec path; experts grouped by expert on the device), teacher-
//     forced decode steps replayed from CUDA graphs (one row: the per-pair expert kernels),
//     a prefill of 150 rows (the cuBLAS path for attention, grouped experts), and six sequences
//     decoding together (a graph of eight rows, two of them padding);
// each row within the bound model_gpu_test.cpp derives (1e-3 of the logits' spread plus twice
// the oracle's own distance from the f32 reference), greedy tokens equal away from near-ties;
// with int8-reading experts up to 1 row in 16 may be a rerouted token (oracle_compare.h).
// Expert streaming (F32, Q4_K and MXFP4 experts, the last re-laid out in host memory, VRAM and
// the device cache): a budget that leaves about half of the experts in mapped host memory gives
// logits identical to the bit to the all-resident run's, before and after the device cache is
// re-filled between steps by hand-made placements (the expert-plan policy is not wired yet), and
// the captured decode graph replays after each placement change with no re-capture; the
// backend's own re-plan promotes the experts the tokens route to. The routing counts (the
// backend's expert telemetry): every (token, expert) choice of a real row counted once, hits and
// misses by residency; the KV taking a chunk of the expert cache back changes no logit. CudaMoe
// alone: experts read from a pinned copy and from VRAM give the same bits.
// CudaMoe with qwen35moe's shared expert (gated and not) against the CPU's MoeFfn, and whole
// qwen35moe models (F32, Q8_0, Q4_K experts) against the oracle: prefills on both paths, decode
// from graphs, six sequences together and beside a prompt, a second turn from a state snapshot;
// a malformed shared expert is refused with a one-line error; gpt-oss attention is not
// (gptoss_gpu_test.cpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <thread>
#include <utility>

#include "backends/backend.h"
#include "backends/cpu/moe_ffn.h"
#include "backends/cpu/thread_pool.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_moe.h"
#include "backends/cuda/device_memory.h"
#include "delta_net.cuh"
#include "gpu_test_support.h"
#include "granule/error.h"
#include "granule/gguf.h"
#include "granule/model_config.h"
#include "granule/telemetry.h"
#include "granule/testkit/synthetic_model.h"
#include "matvec.cuh"
#include "memory/kv_space.h"
#include "memory/memory_manager.h"
#include "moe.cuh"
#include "moe_stage.cuh"
#include "oracle_sections.h"
#include "rms_norm.cuh"
#include "runtime/runtime.h"
#include "support/model_runtime.h"
#include "support/temp_model.h"

namespace granule {
namespace {

// A device copy of `host` whose bytes have landed. DeviceArray's cudaMemcpy from pageable memory
// returns once they are staged; its DMA (legacy stream) may still be running, and nothing orders
// it before the kernels of a CudaStream (non-blocking): a forward right after the upload could
// read the previous contents of a residual the allocator handed out again.
template <class T>
gpu_test::DeviceArray<T> landed(const std::vector<T>& host) {
  gpu_test::DeviceArray<T> d(host);
  if (cudaDeviceSynchronize() != cudaSuccess) throw std::runtime_error("upload failed");
  return d;
}

// Small MoE shapes the GPU kernels run: hidden 256, heads of 64 (qwen3moe: 128, one KV head),
// 8 experts, top 2; experts of 256 (qwen3moe) or the FFN width 512 (Mixtral).
SyntheticModelSpec moe_spec(const std::string& arch, TensorType experts) {
  SyntheticModelSpec s = SyntheticModelSpec::preset("small-256");
  s.name = "moe-" + arch;
  s.n_expert = 8;
  s.n_expert_used = 2;
  s.expert_type = experts;
  s.seed = 31 + static_cast<uint64_t>(experts);
  if (arch == "qwen3moe") {
    s.architecture = "qwen3moe";
    s.qk_norm = true;
    s.head_dim = 128;
    s.n_head_kv = 1;
    s.n_ff_exp = 256;
    s.rope_theta = 1e6f;
    s.rms_eps = 1e-6f;
  } else {
    s.rope_theta = 1e6f;  // `llama` with experts: Mixtral
  }
  return s;
}

RuntimeOptions options(bool gpu, bool oracle, uint64_t budget = uint64_t{1} << 40,
                       int64_t kv_reserve_tokens = 0, int host_experts = 0) {
  RuntimeOptions o;
  // Streamed experts crossing PCIe only (the same bits as all resident), unless a test asks for
  // the host's share (MoeHostExpertsGpu).
  o.backend.cuda_host_experts = host_experts;
  o.device = gpu ? DeviceKind::Cuda : DeviceKind::Cpu;
  o.backend.vram_budget_bytes = budget;
  o.backend.kv_reserve_tokens = kv_reserve_tokens;
  o.backend.cpu_emulate_device_numerics = oracle;
  o.backend.cpu_exact_numerics = !gpu;  // the CPU reference numerics
  o.backend.cpu_threads = 2;
  o.context_length = 512;
  o.slots = 8;
  o.kv_pool_granules = 0;
  return o;
}

struct Rig : test::ModelRuntime {
  Rig(const std::filesystem::path& path, const RuntimeOptions& o) : ModelRuntime(path, o) {}
  cuda::CudaBackend& cuda() { return dynamic_cast<cuda::CudaBackend&>(*backend); }
  cuda::CudaMoe& moe() { return *cuda().model().moe(); }
  ExpertTelemetry experts() {
    ExpertTelemetry t;
    backend->collect_expert_telemetry(t);
    return t;
  }
};

using test::random_tokens;

struct MoeCase {
  std::string arch;
  TensorType experts;
};

class MoeModelGpu : public ::testing::TestWithParam<MoeCase> {};

TEST_P(MoeModelGpu, MatchesTheCpuOracle) {
  GRANULE_REQUIRE_GPU();
  const MoeCase& p = GetParam();
  test::TempModel model(moe_spec(p.arch, p.experts), "moe-gpu");
  Rig ref(model.path, options(false, false)), oracle(model.path, options(false, true)),
      gpu(model.path, options(true, false));
  ASSERT_NE(gpu.cuda().model().moe(), nullptr);
  const bool int8 = kernels::moe_reads_q8(static_cast<uint32_t>(p.experts));
  EXPECT_TRUE(gpu.moe().all_resident());
  // Rows past the bound allowed with int8-reading experts, and on the cuBLAS path (attention's
  // f16 GEMM operands round as int8 blocks do).
  gpu_test::ModelSections sections(
      {&ref, &oracle, &gpu}, gpu_test::against_the_oracle(
                                 gpu.config.n_vocab, "MoE " + p.arch, [int8](gpu_test::Section s) {
                                   return int8 || s == gpu_test::Section::Prefill150;
                                 }));
  sections.prefill_64_then_decode();
  sections.prefill_150(false);
  // Prompts of 3 to 38 tokens: grouped experts, two padding rows.
  sections.decode_six_together(7, false);
}

INSTANTIATE_TEST_SUITE_P(
    Experts, MoeModelGpu,
    ::testing::Values(MoeCase{"qwen3moe", TensorType::F32}, MoeCase{"qwen3moe", TensorType::Q8_0},
                      MoeCase{"qwen3moe", TensorType::Q4_K}, MoeCase{"qwen3moe", TensorType::MXFP4},
                      MoeCase{"mixtral", TensorType::F32}, MoeCase{"mixtral", TensorType::Q4_0},
                      MoeCase{"mixtral", TensorType::Q4_K}),
    [](const ::testing::TestParamInfo<MoeCase>& info) {
      std::string name =
          info.param.arch + "_" + tensor_type_name(static_cast<uint32_t>(info.param.experts));
      std::transform(name.begin(), name.end(), name.begin(), ::tolower);
      return name;
    });

// A model whose experts outweigh the rest: 16 experts of 1024 per layer (F32: 3 MiB each, Q4_K:
// 432 KiB; half of them, 48 / 7 MiB, far above what else differs between two runs' ledgers).
SyntheticModelSpec streaming_spec(TensorType experts) {
  SyntheticModelSpec s = moe_spec("qwen3moe", experts);
  s.name = "moe-streaming";
  s.n_expert = 16;
  s.n_expert_used = 4;
  s.n_ff_exp = 1024;
  return s;
}

class MoeStreamingGpu : public ::testing::TestWithParam<TensorType> {};

// KV room kept free beside the experts (64 MiB of tokens), the same in every run of a file.
int64_t reserve_tokens_for(const std::filesystem::path& path) {
  auto file = ModelFile::open(path);
  return (int64_t{64} << 20) / ModelConfig::from_gguf(*file).kv_bytes_per_token(2);
}
// What the all-resident run of `resident` used, less half of its experts, plus the KV reserve it
// kept free: a budget that leaves about half of the experts in host memory.
uint64_t half_expert_budget(Rig& resident) {
  return resident.runtime.memory->used_bytes() - resident.moe().expert_image_bytes() / 2 +
         resident.cuda().model().kv_reserve_bytes();
}

// A rig with part of the experts in host memory: from half_expert_budget, raised by an eighth of
// the expert image at a time (up to twice the image) until the device cache holds at least a
// quarter but not all of the experts (what the workspace, the attention scratch and the staging
// area take beside the experts differs with the block type; a Q4_K file's whole expert image is
// ~13 MiB, below those differences). Null if none does. A single slot is too few: on an H100 the
// F32 file's first budget with any left one, and RePlanPromotesTheRoutedExperts's re-plan rightly
// kept its expert (no host expert beat it by the plan's margin).
std::unique_ptr<Rig> partial_expert_rig(const std::filesystem::path& path, int64_t reserve_tokens,
                                        Rig& resident, int host_experts = 0) {
  const uint64_t first = half_expert_budget(resident);
  const uint64_t image = resident.moe().expert_image_bytes();
  for (int k = 0; k <= 16; ++k) {
    const uint64_t budget = first + image / 8 * static_cast<uint64_t>(k);
    auto rig =
        std::make_unique<Rig>(path, options(true, false, budget, reserve_tokens, host_experts));
    cuda::CudaMoe& moe = rig->moe();
    std::cout << "[moe-streaming] budget " << (budget >> 20) << " MiB, expert image "
              << (image >> 20) << " MiB, " << moe.cache_slots() << " device slots for "
              << moe.n_layer() * moe.n_expert() << " experts\n";
    if (!moe.all_resident() && moe.cache_slots() >= moe.n_layer() * moe.n_expert() / 4 &&
        moe.cache_slots() < moe.n_layer() * moe.n_expert())
      return rig;
  }
  return nullptr;
}

// About half of the experts in host memory: the same logits to the bit as all resident, before
// and after placement changes between steps, the decode graph replayed without a re-capture.
TEST_P(MoeStreamingGpu, SameLogitsAsAllResident) {
  GRANULE_REQUIRE_GPU();
  gpu_test::step("writing the model file");
  test::TempModel model(streaming_spec(GetParam()), "moe-stream");
  const int64_t reserve_tokens = reserve_tokens_for(model.path);
  gpu_test::step("loading the all-resident model");
  Rig resident(model.path, options(true, false, uint64_t{1} << 40, reserve_tokens));
  ASSERT_TRUE(resident.moe().all_resident());
  gpu_test::step("loading the streaming model");
  const std::unique_ptr<Rig> partial = partial_expert_rig(model.path, reserve_tokens, resident);
  ASSERT_TRUE(partial) << "no budget left part of the experts in the device cache";
  Rig& streaming = *partial;
  cuda::CudaMoe& moe = streaming.moe();
  const int64_t total = moe.n_layer() * moe.n_expert();

  const int64_t vocab = resident.config.n_vocab;
  const std::vector<int32_t> prompt = random_tokens(40, vocab, 7);
  gpu_test::step("prefill of 40 rows, streaming and resident");
  EXPECT_EQ(streaming.step({{0, prompt, 0, true}}), resident.step({{0, prompt, 0, true}}))
      << "prefill: streamed experts changed the logits";
  // Placements: the default, then alternating halves of each layer's experts, then the last
  // experts of each layer, changed between decode steps.
  std::vector<std::vector<uint8_t>> placements;
  placements.push_back(moe.default_placement());
  for (int variant = 0; variant < 2; ++variant) {
    std::vector<uint8_t> p(static_cast<size_t>(total), 0);
    int64_t left = moe.cache_slots();
    for (int64_t i = 0; i < total && left > 0; ++i) {
      const int64_t e = variant == 0 ? i : total - 1 - i;
      if (variant == 0 && e % 2 == 1) continue;
      p[static_cast<size_t>(e)] = 1;
      --left;
    }
    placements.push_back(p);
  }
  const std::vector<int32_t> next = random_tokens(12, vocab, 8);
  uint64_t captures_after_first = 0;
  static_cast<void>(streaming.experts());  // the prefill's counts
  ExpertTelemetry stats;
  for (int i = 0; i < 12; ++i) {
    const std::span<const int32_t> token(&next[static_cast<size_t>(i)], 1);
    gpu_test::step("a decode step, streaming and resident");
    EXPECT_EQ(streaming.step({{0, token, 40 + i, false}}),
              resident.step({{0, token, 40 + i, false}}))
        << "decode step " << i;
    if (i == 0) captures_after_first = streaming.graphs().captures;
    if (i % 4 == 3) {
      // Between steps: count what was routed (the backend's telemetry interval), then move
      // experts by hand (the backend's own re-plan may move them too: the logits never change).
      gpu_test::step("collecting the expert telemetry, then apply()");
      stats.add_interval(streaming.experts());
      const std::vector<uint8_t>& p = placements[static_cast<size_t>((i / 4 + 1) % 3)];
      moe.apply(p, streaming.cuda().model().stream());
      EXPECT_EQ(moe.resident(), p);
    }
  }
  const GraphTelemetry g = streaming.graphs();
  EXPECT_EQ(g.captures, captures_after_first) << "a placement change re-captured the graph";
  EXPECT_EQ(g.recaptures, 0u);
  EXPECT_GE(g.replays, 11u);
  // 12 decode rows, 4 experts each, in every layer; hits and misses by residency.
  uint64_t routed = 0;
  for (uint32_t c : stats.routed) routed += c;
  EXPECT_EQ(routed, uint64_t{12} * 4 * static_cast<uint64_t>(moe.n_layer()));
  EXPECT_EQ(stats.hits + stats.misses, routed);
  EXPECT_EQ(stats.tokens, 12u);
  uint64_t streamed = 0;
  for (uint32_t c : stats.streamed) streamed += c;
  EXPECT_EQ(streamed, stats.misses);
  EXPECT_EQ(stats.bytes_streamed, stats.misses * moe.expert_bytes(0));
  EXPECT_EQ(stats.n_layer, moe.n_layer());
  EXPECT_EQ(stats.expert_bytes, moe.expert_bytes(0));
  std::cout << "[moe-streaming] hits " << stats.hits << ", misses " << stats.misses << ", "
            << (stats.bytes_streamed >> 10) << " KiB read over PCIe\n";

  // More experts than slots, or a wrong size: refused, nothing moved.
  const std::vector<uint8_t> before = moe.resident();
  EXPECT_THROW(moe.apply(std::vector<uint8_t>(static_cast<size_t>(total), 1),
                         streaming.cuda().model().stream()),
               UsageError);
  EXPECT_THROW(moe.apply(std::vector<uint8_t>(3, 0), streaming.cuda().model().stream()),
               UsageError);
  EXPECT_EQ(moe.resident(), before);
  // The KV takes memory back from the expert cache (CudaBackend::make_room): a chunk of slots
  // goes, its experts are read from host memory, the graph replays without a re-capture.
  {
    gpu_test::step("release_cache(): a chunk of the cache given back, one decode step");
    const int64_t slots_before = moe.cache_slots();
    const uint64_t captures_before = streaming.graphs().captures;
    EXPECT_GT(moe.release_cache(1, streaming.cuda().model().stream()), 0u);
    EXPECT_LT(moe.cache_slots(), slots_before);
    int64_t cached = 0;
    for (uint8_t r : moe.resident()) cached += r;
    EXPECT_LE(cached, moe.cache_slots());
    const int32_t token = 3;
    EXPECT_EQ(streaming.step({{0, std::span<const int32_t>(&token, 1), 52, false}}),
              resident.step({{0, std::span<const int32_t>(&token, 1), 52, false}}));
    EXPECT_EQ(streaming.graphs().captures, captures_before);
  }
  // Every expert in host memory: still the same logits.
  gpu_test::step("every expert in host memory: one decode step");
  moe.apply(std::vector<uint8_t>(static_cast<size_t>(total), 0), streaming.cuda().model().stream());
  const int32_t last = 5;
  EXPECT_EQ(streaming.step({{0, std::span<const int32_t>(&last, 1), 52, false}}),
            resident.step({{0, std::span<const int32_t>(&last, 1), 52, false}}));
  // Still nothing cached: two more chats' prompts, then the three decoding together (a graph
  // bucket with a padding row): every expert any row chose is staged, the same logits.
  gpu_test::step("every expert in host memory: two more prompts, three chats decoding");
  const std::vector<int32_t> p1 = random_tokens(9, vocab, 9), p2 = random_tokens(17, vocab, 10);
  EXPECT_EQ(streaming.step({{1, p1, 0, false}}), resident.step({{1, p1, 0, false}}));
  EXPECT_EQ(streaming.step({{2, p2, 0, false}}), resident.step({{2, p2, 0, false}}));
  for (int i = 0; i < 3; ++i) {
    const std::vector<BatchSequence> batch = {
        {0, std::span<const int32_t>(&next[static_cast<size_t>(i)], 1), 53 + i, false},
        {1, std::span<const int32_t>(&next[static_cast<size_t>(i + 1)], 1), 9 + i, false},
        {2, std::span<const int32_t>(&next[static_cast<size_t>(i + 2)], 1), 17 + i, false}};
    EXPECT_EQ(streaming.step(batch), resident.step(batch)) << "three chats, step " << i;
  }
}

// The host computing streamed experts (cuda_moe_host.cpp), with every missed expert of a decode
// run left to it (share 256) and half of them (128): the logits of a 40-row prefill, 12 decode
// steps and three chats decoding together (a padding row) stay within the oracle rule of the
// all-resident run's (the host rounds the experts' inputs to int8 as the CPU's fast path does,
// not as the device does: rounding-level differences, and a rare rerouted row); the decode graph
// is replayed, never re-captured; the host computed choices (at 256 every decode miss, so nothing
// of a decode step crossed PCIe); a rig asked for none holds nothing for it.
class MoeHostExpertsGpu : public ::testing::TestWithParam<TensorType> {};

TEST_P(MoeHostExpertsGpu, CloseToAllResidentWithTheHostComputingMissedExperts) {
  GRANULE_REQUIRE_GPU();
  gpu_test::step("writing the model file");
  test::TempModel model(streaming_spec(GetParam()), "moe-host");
  const int64_t reserve_tokens = reserve_tokens_for(model.path);
  gpu_test::step("loading the CPU reference and the all-resident model");
  Rig ref(model.path, options(false, false));
  Rig resident(model.path, options(true, false, uint64_t{1} << 40, reserve_tokens));
  ASSERT_TRUE(resident.moe().all_resident());
  EXPECT_FALSE(resident.moe().host_experts()) << "all resident: nothing to compute on the host";
  const int64_t vocab = resident.config.n_vocab;
  const std::vector<int32_t> prompt = random_tokens(40, vocab, 7);
  const std::vector<int32_t> next = random_tokens(16, vocab, 8);
  const std::vector<int32_t> p1 = random_tokens(9, vocab, 9), p2 = random_tokens(17, vocab, 10);
  for (const int share : {256, 128}) {
    const std::string name = "host share " + std::to_string(share);
    gpu_test::step(("loading the streaming model, " + name).c_str());
    const std::unique_ptr<Rig> partial =
        partial_expert_rig(model.path, reserve_tokens, resident, share);
    ASSERT_TRUE(partial) << "no budget left part of the experts in the device cache";
    Rig& streaming = *partial;
    cuda::CudaMoe& moe = streaming.moe();
    ASSERT_TRUE(moe.host_experts()) << name;
    EXPECT_EQ(moe.host_share(), share);
    std::vector<float> r, o, g;  // rows of the reference, the resident run, the host's run
    auto run = [&](const std::vector<BatchSequence>& batch) {
      const std::vector<float> a = ref.step(batch), b = resident.step(batch),
                               c = streaming.step(batch);
      r.insert(r.end(), a.begin(), a.end());
      o.insert(o.end(), b.begin(), b.end());
      g.insert(g.end(), c.begin(), c.end());
    };
    gpu_test::step("prefill of 40 rows");
    run({{0, prompt, 0, true}});
    static_cast<void>(streaming.experts());  // the prefill's counts
    uint64_t captures_after_first = 0;
    gpu_test::step("12 decode steps");
    for (int i = 0; i < 12; ++i) {
      run({{0, std::span<const int32_t>(&next[static_cast<size_t>(i)], 1), 40 + i, false}});
      if (i == 0) captures_after_first = streaming.graphs().captures;
    }
    const ExpertTelemetry decode = streaming.experts();
    EXPECT_GT(decode.misses, 0u) << name;
    EXPECT_GT(decode.host_computed, 0u) << name;
    EXPECT_GT(decode.bytes_host, 0u) << name;
    if (share == 256) {
      EXPECT_EQ(decode.host_computed, decode.misses) << "every decode miss on the host";
      EXPECT_EQ(decode.bytes_streamed, 0u) << "nothing of a decode step crossed PCIe";
    } else {
      EXPECT_LT(decode.host_computed, decode.misses) << "half of the candidates staged";
      EXPECT_GT(decode.bytes_streamed, 0u);
    }
    const GraphTelemetry graphs = streaming.graphs();
    EXPECT_EQ(graphs.captures, captures_after_first) << name;
    EXPECT_EQ(graphs.recaptures, 0u) << name;
    EXPECT_GE(graphs.replays, 11u) << name;
    gpu_test::step("two more prompts, three chats decoding together");
    run({{1, p1, 0, false}});
    run({{2, p2, 0, false}});
    for (int i = 0; i < 3; ++i)
      run({{0, std::span<const int32_t>(&next[static_cast<size_t>(12 + i)], 1), 52 + i, false},
           {1, std::span<const int32_t>(&next[static_cast<size_t>(i)], 1), 9 + i, false},
           {2, std::span<const int32_t>(&next[static_cast<size_t>(i + 1)], 1), 17 + i, false}});
    gpu_test::expect_close_to_oracle(r, o, g, vocab, "MoE " + name, true);
  }
  gpu_test::step("a streaming rig asked for no host share");
  const std::unique_ptr<Rig> none = partial_expert_rig(model.path, reserve_tokens, resident, 0);
  ASSERT_TRUE(none);
  EXPECT_FALSE(none->moe().host_experts());
  EXPECT_EQ(none->moe().host_share(), 0);
  gpu_test::step("a streaming rig with the default rule");
  const std::unique_ptr<Rig> rule = partial_expert_rig(model.path, reserve_tokens, resident, -1);
  ASSERT_TRUE(rule);
  const cuda::CudaMoe& m = rule->moe();
  ASSERT_TRUE(m.host_experts());
  EXPECT_EQ(m.host_share(), 256);
  EXPECT_EQ(m.host_share_at(1), cuda::CudaMoe::kHostAutoSmallShare);
  EXPECT_EQ(m.host_share_at(cuda::CudaMoe::kHostAutoMinRows - 1),
            cuda::CudaMoe::kHostAutoSmallShare);
  EXPECT_EQ(m.host_share_at(cuda::CudaMoe::kHostAutoMinRows), 256);
  EXPECT_EQ(m.host_share_at(cuda::CudaMoe::kHostMaxRows), 256);
  EXPECT_EQ(m.host_share_at(cuda::CudaMoe::kHostMaxRows + 1), 0) << "prefill runs stage";
}

INSTANTIATE_TEST_SUITE_P(Experts, MoeHostExpertsGpu,
                         ::testing::Values(TensorType::Q4_K, TensorType::MXFP4, TensorType::Q4_0),
                         [](const ::testing::TestParamInfo<TensorType>& info) {
                           std::string name = tensor_type_name(static_cast<uint32_t>(info.param));
                           std::transform(name.begin(), name.end(), name.begin(), ::tolower);
                           return name;
                         });

// The backend's own re-plan (at most every 0.5 s, from launch()): once the routing counts of a
// prompt and a few decode steps are in, the experts they route to are promoted into the device
// cache, and the decode steps after it are served from VRAM at least as often as before. The
// inputs are seeded and the GPU's results deterministic, so the outcome is too.
TEST_P(MoeStreamingGpu, RePlanPromotesTheRoutedExperts) {
  GRANULE_REQUIRE_GPU();
  gpu_test::step("writing the model file");
  test::TempModel model(streaming_spec(GetParam()), "moe-replan");
  const int64_t reserve_tokens = reserve_tokens_for(model.path);
  std::unique_ptr<Rig> partial;
  {
    Rig resident(model.path, options(true, false, uint64_t{1} << 40, reserve_tokens));
    gpu_test::step("loading the streaming model");
    partial = partial_expert_rig(model.path, reserve_tokens, resident);
  }
  ASSERT_TRUE(partial) << "no budget left part of the experts in the device cache";
  Rig& rig = *partial;
  cuda::CudaMoe& moe = rig.moe();
  ASSERT_FALSE(moe.all_resident());
  const int64_t vocab = rig.config.n_vocab;
  const std::vector<int32_t> prompt = random_tokens(48, vocab, 21);
  const std::vector<int32_t> next = random_tokens(1, vocab, 22);
  int64_t position = 0;
  auto decode = [&](int steps) {
    for (int i = 0; i < steps; ++i)
      rig.step({{0, std::span<const int32_t>(next.data(), 1), position++, false}});
  };
  gpu_test::step("prefill and decode before the re-plan");
  rig.step({{0, prompt, 0, false}});
  position = 48;
  decode(8);
  const ExpertTelemetry before = rig.experts();
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  gpu_test::step("the decode step whose launch re-plans");
  decode(1);  // its launch re-plans from the counts so far
  static_cast<void>(rig.experts());
  decode(8);
  const ExpertTelemetry after = rig.experts();
  auto hit_rate = [](const ExpertTelemetry& t) {
    return static_cast<double>(t.hits) /
           static_cast<double>(std::max<uint64_t>(1, t.hits + t.misses));
  };
  std::cout << "[moe-replan] hit rate before " << hit_rate(before) << " (" << before.misses
            << " misses), after " << hit_rate(after) << " (" << after.misses << " misses), "
            << moe.promotions() << " promoted, " << moe.demotions() << " demoted, "
            << moe.cache_slots() << " slots\n";
  if (before.misses > 0) EXPECT_GT(moe.promotions(), 0u);
  EXPECT_EQ(moe.promotions(), moe.demotions());  // the cache was full and stays full
  int64_t resident = 0;
  for (uint8_t r : moe.resident()) resident += r;
  EXPECT_EQ(resident, moe.cache_slots());
  EXPECT_GE(hit_rate(after), hit_rate(before));
  EXPECT_EQ(rig.graphs().recaptures, 0u);
}

INSTANTIATE_TEST_SUITE_P(Experts, MoeStreamingGpu,
                         ::testing::Values(TensorType::F32, TensorType::Q4_K, TensorType::MXFP4),
                         [](const ::testing::TestParamInfo<TensorType>& info) {
                           std::string name = tensor_type_name(static_cast<uint32_t>(info.param));
                           std::transform(name.begin(), name.end(), name.begin(), ::tolower);
                           return name;
                         });

// Mapped pinned host memory (filled with 7s) and its device address.
struct Mapped {
  void* host = nullptr;
  explicit Mapped(size_t bytes) {
    if (cudaHostAlloc(&host, bytes, cudaHostAllocMapped) != cudaSuccess) {
      host = nullptr;
    } else {
      std::memset(host, 7, bytes);
    }
  }
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;
  ~Mapped() { cudaFreeHost(host); }
  template <class T>
  T* device() const {
    void* d = nullptr;
    return cudaHostGetDevicePointer(&d, host, 0) == cudaSuccess ? static_cast<T*>(d) : nullptr;
  }
};

// The staging launch alone (kernels/moe_stage.cuh) on a made-up layer of 8 experts, the odd ones
// in mapped pinned host memory: of the pairs' choices, each distinct missed expert is copied once
// (its bytes exactly, into slots in expert order), the step table points there and at the layer
// table's entries for the rest, and the counter grows by expert_bytes per copy; with fewer slots
// than misses the last misses keep their host pointers.
TEST(MoeStageKernel, CopiesEachChosenMissedExpertOnce) {
  GRANULE_REQUIRE_GPU();
  constexpr int kExperts = 8;
  constexpr uint64_t kStride = 768, kCopy = 720, kExpertBytes = 600;
  const uint64_t offsets[3] = {0, 256, 512};
  std::vector<uint8_t> image(kExperts * kStride);
  std::mt19937 rng(3);
  for (uint8_t& b : image) b = static_cast<uint8_t>(rng());
  void* host = nullptr;
  ASSERT_EQ(cudaHostAlloc(&host, image.size(), cudaHostAllocMapped), cudaSuccess);
  std::memcpy(host, image.data(), image.size());
  void* host_device = nullptr;
  ASSERT_EQ(cudaHostGetDevicePointer(&host_device, host, 0), cudaSuccess);
  const auto* mapped = static_cast<const uint8_t*>(host_device);
  gpu_test::DeviceArray<uint8_t> vram(image);  // the even experts read here
  std::vector<const void*> table(3 * kExperts);
  for (int m = 0; m < 3; ++m)
    for (int e = 0; e < kExperts; ++e)
      table[static_cast<size_t>(m * kExperts + e)] =
          (e % 2 ? mapped : static_cast<const uint8_t*>(vram.get())) + e * kStride + offsets[m];
  std::vector<uint64_t> table_bits(table.size());
  std::memcpy(table_bits.data(), table.data(), table.size() * sizeof(void*));
  gpu_test::DeviceArray<uint64_t> table_d(table_bits), step_d(table.size());
  // Rows of 2 choices; 1 twice, 3 and 5 missed, 0, 2, 6 resident.
  const std::vector<int32_t> ids = {1, 3, 1, 2, 5, 0, 6, 3};
  gpu_test::DeviceArray<int32_t> ids_d(ids);
  gpu_test::DeviceArray<uint8_t> staging(kExperts * kStride);
  gpu_test::DeviceArray<unsigned long long> copied(std::vector<unsigned long long>{0});
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  kernels::MoeStage st;
  st.table = reinterpret_cast<const void* const*>(table_d.get());
  st.step = reinterpret_cast<const void**>(step_d.get());
  st.host_begin = mapped;
  st.host_end = mapped + image.size();
  st.staging = staging.get();
  st.slot_bytes = kStride;
  for (int m = 0; m < 3; ++m) st.offsets[m] = offsets[m];
  st.copy_bytes = kCopy;
  st.expert_bytes = kExpertBytes;
  st.copied = copied.get();
  const kernels::KernelConfig kc = gpu_test::kernel_config();
  cuda::CudaStream stream;
  for (const int capacity : {kExperts, 2}) {
    st.capacity = capacity;
    ASSERT_EQ(kernels::launch_moe_stage(ids_d.get(), static_cast<int>(ids.size()), kExperts, st, kc,
                                        stream.get()),
              cudaSuccess);
    stream.synchronize();
    const std::vector<uint64_t> step = step_d.download();
    const std::vector<uint8_t> staged = staging.download();
    const int staged_of[kExperts] = {-1, 0, -1, 1, -1, capacity > 2 ? 2 : -1, -1, -1};
    for (int e = 0; e < kExperts; ++e) {
      const int slot = staged_of[e];
      for (int m = 0; m < 3; ++m) {
        const size_t i = static_cast<size_t>(m * kExperts + e);
        const uint64_t want = slot < 0 ? table_bits[i]
                                       : reinterpret_cast<uint64_t>(staging.get()) +
                                             static_cast<uint64_t>(slot) * kStride + offsets[m];
        EXPECT_EQ(step[i], want) << "expert " << e << ", matrix " << m << ", capacity " << capacity;
      }
      if (slot >= 0)
        EXPECT_TRUE(std::equal(image.begin() + static_cast<std::ptrdiff_t>(e * kStride),
                               image.begin() + static_cast<std::ptrdiff_t>(e * kStride + kCopy),
                               staged.begin() + static_cast<std::ptrdiff_t>(slot * kStride)))
            << "expert " << e << "'s bytes in slot " << slot;
    }
  }
  EXPECT_EQ(copied.download()[0], (3 + 2) * kExpertBytes);
  // The host's share: every candidate (missed, chosen by at most one pair: expert 5 only; 1 and
  // 3 were chosen twice) to the host: 5 points at the zero slot, its pair weighs 0 on the
  // device and the mask names it; 1 and 3 are staged as before.
  {
    gpu_test::DeviceArray<uint8_t> zero(std::vector<uint8_t>(kStride, 0));
    // The host's inputs in mapped pinned memory: mask, ids, weights and 8 input values.
    Mapped mask(kExperts), host_ids(ids.size() * 4), host_weights(ids.size() * 4), host_x(8 * 4);
    ASSERT_TRUE(mask.host && host_ids.host && host_weights.host && host_x.host);
    const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8};
    gpu_test::DeviceArray<float> x_d(x);
    auto mask_now = [&] {
      const auto* m = static_cast<const uint8_t*>(mask.host);
      return std::vector<uint8_t>(m, m + kExperts);
    };
    const std::vector<float> weights = {0.5f, 0.25f, 1.5f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
    gpu_test::DeviceArray<float> weights_d(weights), gpu_weights(weights.size());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    st.capacity = kExperts;
    st.host_share = 256;
    st.host_max_pairs = 1;
    st.zero = zero.get();
    st.weights = weights_d.get();
    st.gpu_weights = gpu_weights.get();
    st.host_mask = mask.device<uint8_t>();
    st.host_ids = host_ids.device<int32_t>();
    st.host_weights = host_weights.device<float>();
    st.x = x_d.get();
    st.host_x = host_x.device<float>();
    st.x_floats = 8;
    ASSERT_EQ(kernels::launch_moe_stage(ids_d.get(), static_cast<int>(ids.size()), kExperts, st, kc,
                                        stream.get()),
              cudaSuccess);
    stream.synchronize();
    const std::vector<uint64_t> step = step_d.download();
    const int staged_of[kExperts] = {-1, 0, -1, 1, -1, -2, -1, -1};
    for (int e = 0; e < kExperts; ++e)
      for (int m = 0; m < 3; ++m) {
        const size_t i = static_cast<size_t>(m * kExperts + e);
        const int slot = staged_of[e];
        const uint64_t want =
            slot == -2  ? reinterpret_cast<uint64_t>(zero.get()) + offsets[m]
            : slot < 0 ? table_bits[i]
                       : reinterpret_cast<uint64_t>(staging.get()) +
                             static_cast<uint64_t>(slot) * kStride + offsets[m];
        EXPECT_EQ(step[i], want) << "host share: expert " << e << ", matrix " << m;
      }
    EXPECT_EQ(mask_now(), (std::vector<uint8_t>{0, 0, 0, 0, 0, 1, 0, 0}));
    const auto* written_ids = static_cast<const int32_t*>(host_ids.host);
    const auto* written_weights = static_cast<const float*>(host_weights.host);
    EXPECT_EQ(std::vector<int32_t>(written_ids, written_ids + ids.size()), ids);
    EXPECT_EQ(std::vector<float>(written_weights, written_weights + ids.size()), weights)
        << "the host gets the router's weights, not the device's";
    const auto* written_x = static_cast<const float*>(host_x.host);
    EXPECT_EQ(std::vector<float>(written_x, written_x + 8), x);
    std::vector<float> want_weights = weights;
    want_weights[4] = 0.0f;  // the pair that chose expert 5
    EXPECT_EQ(gpu_weights.download(), want_weights);
    EXPECT_EQ(copied.download()[0], (3 + 2 + 2) * kExpertBytes);
    // Half of the candidates: every missed expert is one (at most 2 pairs) - 1, 3, 5 ranked 0, 1,
    // 2 in expert order - and rank r is the host's where (r + 1) * 128 / 256 > r * 128 / 256:
    // rank 1 only, expert 3.
    // In the split launches (plan, then copy): 1 and 5 staged in slots 0 and 1, with their bytes.
    st.host_share = 128;
    st.host_max_pairs = 2;
    gpu_test::DeviceArray<int32_t> plan(1 + kExperts);
    gpu_test::DeviceArray<uint8_t> cleared(std::vector<uint8_t>(kExperts * kStride, 0));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    st.staging = cleared.get();
    EXPECT_EQ(kernels::launch_moe_stage_plan(ids_d.get(), static_cast<int>(ids.size()), kExperts,
                                             st, kc, stream.get()),
              cudaErrorInvalidValue)
        << "the split launches need a plan buffer";
    st.plan = plan.get();
    ASSERT_EQ(kernels::launch_moe_stage_plan(ids_d.get(), static_cast<int>(ids.size()), kExperts,
                                             st, kc, stream.get()),
              cudaSuccess);
    ASSERT_EQ(kernels::launch_moe_stage_copy(st, kc, stream.get()), cudaSuccess);
    stream.synchronize();
    EXPECT_EQ(mask_now(), (std::vector<uint8_t>{0, 0, 0, 1, 0, 0, 0, 0}));
    EXPECT_EQ(copied.download()[0], (3 + 2 + 2 + 2) * kExpertBytes);
    EXPECT_EQ(plan.download()[0], 2);
    const std::vector<uint8_t> split = cleared.download();
    for (const auto& [e, slot] : {std::pair{1, 0}, std::pair{5, 1}})
      EXPECT_TRUE(std::equal(image.begin() + static_cast<std::ptrdiff_t>(e * kStride),
                             image.begin() + static_cast<std::ptrdiff_t>(e * kStride + kCopy),
                             split.begin() + static_cast<std::ptrdiff_t>(slot * kStride)))
          << "split launches: expert " << e << "'s bytes in slot " << slot;
    st.staging = staging.get();
    st.plan = nullptr;
    st.host_share = 0;
  }
  // Bad arguments: a clear status, nothing launched.
  st.copy_bytes = kStride + 16;
  EXPECT_EQ(kernels::launch_moe_stage(ids_d.get(), 8, kExperts, st, kc, stream.get()),
            cudaErrorInvalidValue);
  st.copy_bytes = kCopy;
  st.host_share = 64;  // a share without its buffers
  st.zero = nullptr;
  EXPECT_EQ(kernels::launch_moe_stage(ids_d.get(), 8, kExperts, st, kc, stream.get()),
            cudaErrorInvalidValue);
  ASSERT_EQ(cudaFreeHost(host), cudaSuccess);
}

// CudaMoe on its own over the streaming file: all experts in VRAM, and half of them in host
// memory (a mapped pinned copy, the step's missed experts staged into VRAM) give the same bits
// for runs of 1, 5 (the decode launches), 24 and 128 rows (grouped: the tiled products on staged
// experts, tiles of 32 and 64 pairs), before and after a placement change and with no expert
// cached (every chosen one staged), and the same bits again on a second launch; the bytes
// counted as streamed are those staged (each distinct missed expert once); for Q4_K experts (as
// stored) and MXFP4 and Q4_0 ones (re-laid out in both places).
class MoeResidencyGpu : public ::testing::TestWithParam<TensorType> {};

TEST_P(MoeResidencyGpu, PinnedCopyAndVramAgree) {
  GRANULE_REQUIRE_GPU();
  gpu_test::step("writing the model file");
  test::TempModel model(streaming_spec(GetParam()), "moe-residency");
  auto file = ModelFile::open(model.path);
  const ModelConfig config = ModelConfig::from_gguf(*file);
  const WeightTable weights = WeightTable::from_gguf(*file, config);
  MemoryManager memory(uint64_t{1} << 40);
  cuda::CudaStream stream;
  const kernels::KernelConfig kc = gpu_test::kernel_config();
  constexpr int kMaxRows = 128;
  gpu_test::step("constructing the all-resident CudaMoe");
  cuda::CudaMoe vram(config, weights, memory, kMaxRows, uint64_t{1} << 40, stream.get());
  ASSERT_TRUE(vram.all_resident());
  EXPECT_EQ(vram.staging_slots(), 0);
  // Half of the experts, beside the staging area (every expert of a layer: 128 rows of top-4
  // choose up to all 16).
  const uint64_t staging = static_cast<uint64_t>(config.moe.n_expert) * vram.slot_bytes();
  const uint64_t half = vram.expert_image_bytes() / 2 + staging;
  gpu_test::step("constructing the streaming CudaMoe (pinned copy)");
  const uint64_t staged_before = memory.bytes(MemoryCategory::WeightsStaging);
  cuda::CudaMoe streaming(config, weights, memory, kMaxRows, half, stream.get());
  ASSERT_FALSE(streaming.all_resident());
  ASSERT_GT(streaming.cache_slots(), 0);
  EXPECT_EQ(streaming.staging_slots(), config.moe.n_expert);
  EXPECT_EQ(memory.bytes(MemoryCategory::WeightsStaging) - staged_before, staging);
  // The cache and the staging area hold the budget.
  EXPECT_LE(static_cast<uint64_t>(streaming.cache_slots()) * streaming.slot_bytes() + staging,
            half);

  const int64_t n = config.n_embd;
  std::mt19937 rng(5);
  const std::vector<float> x =
      gpu_test::random_floats(static_cast<size_t>(kMaxRows * n), rng, 1.0f);
  const std::vector<float> ones(static_cast<size_t>(n), 1.0f);
  const std::vector<float> residual =
      gpu_test::random_floats(static_cast<size_t>(kMaxRows * n), rng, 1.0f);
  gpu_test::DeviceArray<float> x_d(x), ones_d(ones), normed(x.size());
  gpu_test::DeviceArray<int8_t> qs(x.size());
  gpu_test::DeviceArray<float2> ds(x.size() / 32);
  std::vector<int32_t> slot_ids(kMaxRows);
  for (int r = 0; r < kMaxRows; ++r) slot_ids[static_cast<size_t>(r)] = r;
  gpu_test::DeviceArray<int32_t> slots(slot_ids);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the uploads landed (landed())
  kernels::RmsNormOutputs out;
  out.f32 = normed.get();
  out.q8 = {qs.get(), ds.get()};
  ASSERT_EQ(kernels::launch_rms_norm(x_d.get(), ones_d.get(), kMaxRows, static_cast<int>(n),
                                     config.rms_eps, out, kc, stream.get()),
            cudaSuccess);
  // One layer's forward, then its counts: the bytes staged must be each distinct chosen expert
  // that was not cached, once.
  auto run = [&](cuda::CudaMoe& moe, int rows, int layer) {
    gpu_test::DeviceArray<float> hidden = landed(residual);
    moe.forward(layer, rows, normed.get(), {qs.get(), ds.get()}, slots.get(), hidden.get(), kc,
                stream.get(), nullptr);
    cuda::MoeStats stats;
    moe.collect(stats, stream.get());
    uint64_t missed = 0;
    for (int64_t e = 0; e < moe.n_expert(); ++e) {
      const auto i = static_cast<size_t>(layer * moe.n_expert() + e);
      if (moe.last_counts()[i] > 0 && !moe.resident()[i]) ++missed;
    }
    EXPECT_EQ(stats.bytes_streamed, missed * moe.expert_bytes(layer))
        << "rows " << rows << ", layer " << layer;
    return hidden.download();
  };
  const int64_t total = streaming.n_layer() * streaming.n_expert();
  for (int round = 0; round < 3; ++round) {
    for (const int rows : {1, 5, 24, 128})
      for (int layer = 0; layer < config.n_layer; ++layer) {
        // step() keeps the pointer: string literals only.
        gpu_test::step(rows == 1    ? "the all-resident experts, 1 row"
                       : rows == 5  ? "the all-resident experts, 5 rows"
                       : rows == 24 ? "the all-resident experts, 24 rows"
                                    : "the all-resident experts, 128 rows");
        const std::vector<float> want = run(vram, rows, layer);
        gpu_test::step(rows == 1   ? "streamed experts staged, 1 row (decode)"
                       : rows == 5 ? "streamed experts staged, 5 rows (decode)"
                       : rows == 24
                           ? "streamed experts staged, 24 rows (grouped, tiled)"
                           : "streamed experts staged, 128 rows (grouped, tiled, tiles of 32)");
        const std::vector<float> got = run(streaming, rows, layer);
        EXPECT_EQ(got, want) << "rows " << rows << ", layer " << layer << ", round " << round;
        EXPECT_EQ(run(streaming, rows, layer), got)
            << "a second launch: rows " << rows << ", layer " << layer << ", round " << round;
      }
    // Round 1: the cache on the other experts (the last cache_slots() of them); round 2: none
    // cached, every chosen expert staged.
    gpu_test::step("apply(): moving the device cache");
    std::vector<uint8_t> p(static_cast<size_t>(total), 0);
    if (round == 0)
      for (int64_t i = 0; i < streaming.cache_slots(); ++i)
        p[static_cast<size_t>(total - 1 - i)] = 1;
    streaming.apply(p, stream.get());
  }
}

INSTANTIATE_TEST_SUITE_P(Experts, MoeResidencyGpu,
                         ::testing::Values(TensorType::Q4_K, TensorType::MXFP4, TensorType::Q4_0),
                         [](const ::testing::TestParamInfo<TensorType>& info) {
                           std::string name = tensor_type_name(static_cast<uint32_t>(info.param));
                           std::transform(name.begin(), name.end(), name.begin(), ::tolower);
                           return name;
                         });

// qwen35moe at shapes the GPU kernels run (hidden 256, experts of 256 over 8, top 2, a shared
// expert of 512 with its sigmoid gate), experts and shared expert of `type`.
SyntheticModelSpec shared_expert_spec(TensorType type) {
  SyntheticModelSpec s = SyntheticModelSpec::preset("tiny-qwen35moe");
  gpu_test::qwen35_kernel_widths(s);
  s.n_ff_exp = 256;
  s.n_ff_shexp = 512;
  s.expert_type = type;
  for (const char* m : {"ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"})
    s.tensor_types.push_back({m, type});  // the rest of the file as the preset has it
  return s;
}

// The whole-model tests' file: qwen35_gpu_test.cpp's shapes (gpu_test::qwen35_model_heads) with the
// routed experts and the shared expert of `experts`, the mixers, the embedding and the head of
// `layers`.
SyntheticModelSpec qwen35moe_model_spec(TensorType layers = TensorType::F32,
                                        TensorType experts = TensorType::Q8_0) {
  SyntheticModelSpec s = shared_expert_spec(experts);
  s.name = "qwen35moe-gpu";
  gpu_test::qwen35_model_heads(s);
  s.weight_type = s.embedding_type = s.output_type = layers;
  // Routers of logits ~2 wide, as trained ones are decisive: at 1, the Q8_0 file's int8 mixers
  // rerouted a decode row on a top-2 near-tie and its KV carried it to the next (H100).
  s.router_scale = 2.0f;
  return s;
}

// Needs no GPU: qwen35moe's shared expert is not refused by CudaMoe, and the files the GPU tests
// read load, and the whole model is not refused on CUDA.
TEST(MoeSharedExpert, NotRefused) {
  const std::pair<TensorType, TensorType> files[] = {{TensorType::F32, TensorType::F32},
                                                     {TensorType::Q8_0, TensorType::Q8_0},
                                                     {TensorType::F32, TensorType::Q4_K}};
  for (const auto& [layers, experts] : files) {
    test::TempModel model(qwen35moe_model_spec(layers, experts), "qwen35moe-refusal");
    auto file = ModelFile::open(model.path);
    const ModelConfig config = ModelConfig::from_gguf(*file);
    const WeightTable weights = WeightTable::from_gguf(*file, config);
    EXPECT_EQ(cuda::CudaMoe::refusal(config, weights), "");
    EXPECT_EQ(cuda_model_refusal(config, weights), "");
  }
  for (const TensorType type : {TensorType::Q8_0, TensorType::Q4_K}) {
    test::TempModel model(shared_expert_spec(type), "moe-shared-refusal");
    auto file = ModelFile::open(model.path);
    const ModelConfig config = ModelConfig::from_gguf(*file);
    const WeightTable weights = WeightTable::from_gguf(*file, config);
    ASSERT_NE(weights.layers[0].gate_shexp, nullptr);
    ASSERT_NE(weights.layers[0].shexp_gate, nullptr);
    EXPECT_EQ(weights.layers[0].gate_shexp->ggml_type, static_cast<uint32_t>(type));
    EXPECT_EQ(cuda::CudaMoe::refusal(config, weights), "");
  }
}

// The FFN input of MoeSharedExpertGpu's runs: max_rows random rows through a unit-weight RMSNorm
// (f32 and int8 blocks, as the model's norm writes them), each row its own KV slot, and a random
// residual; uploads landed before the norm runs on `stream`.
struct SharedExpertRows {
  std::vector<float> residual;
  gpu_test::DeviceArray<float> normed;
  gpu_test::DeviceArray<int8_t> qs;
  gpu_test::DeviceArray<float2> ds;
  gpu_test::DeviceArray<int32_t> slots;
  SharedExpertRows(const ModelConfig& config, int max_rows, const kernels::KernelConfig& kc,
                   cuda::CudaStream& stream)
      : normed(static_cast<size_t>(max_rows * config.n_embd)),
        qs(normed.size()),
        ds(normed.size() / 32),
        slots(landed(own_slots(max_rows))) {
    const int64_t n = config.n_embd;
    std::mt19937 rng(11);
    const std::vector<float> x = gpu_test::random_floats(normed.size(), rng, 1.0f);
    residual = gpu_test::random_floats(normed.size(), rng, 1.0f);
    const gpu_test::DeviceArray<float> x_d = landed(x);
    const gpu_test::DeviceArray<float> ones_d =
        landed(std::vector<float>(static_cast<size_t>(n), 1.0f));
    kernels::RmsNormOutputs out;
    out.f32 = normed.get();
    out.q8 = {qs.get(), ds.get()};
    if (kernels::launch_rms_norm(x_d.get(), ones_d.get(), max_rows, static_cast<int>(n),
                                 config.rms_eps, out, kc, stream.get()) != cudaSuccess)
      throw std::runtime_error("launch_rms_norm failed");
    stream.synchronize();
  }
  static std::vector<int32_t> own_slots(int rows) {
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) ids[static_cast<size_t>(r)] = r;
    return ids;
  }
  // moe.forward of `rows` rows of `layer` into `hidden` (the residual's device copy), waited for.
  void forward(cuda::CudaMoe& moe, int layer, int rows, gpu_test::DeviceArray<float>& hidden,
               const kernels::KernelConfig& kc, cuda::CudaStream& stream) const {
    moe.forward(layer, rows, normed.get(), {qs.get(), ds.get()}, slots.get(), hidden.get(), kc,
                stream.get(), nullptr);
    stream.synchronize();
  }
};

// Each case of the shared-expert GPU tests: the qwen35moe file with Q8_0 (split layout) and Q4_K
// experts, its shared expert sigmoid-gated and with the gate taken away (weight 1); `f` gets the
// file's config and weights, a CudaMoe over them for up to 150 rows and 150 rows of input, and
// returns false to end the test.
template <class F>
void for_each_shared_expert_case(const char* file_name, F&& f) {
  constexpr int kMaxRows = 150;
  for (const TensorType type : {TensorType::Q8_0, TensorType::Q4_K}) {
    gpu_test::step("writing the qwen35moe file");
    test::TempModel model(shared_expert_spec(type), file_name);
    auto file = ModelFile::open(model.path);
    const ModelConfig config = ModelConfig::from_gguf(*file);
    for (const bool gated : {true, false}) {
      SCOPED_TRACE(std::string(tensor_type_name(static_cast<uint32_t>(type))) +
                   (gated ? ", gated" : ", ungated"));
      WeightTable weights = WeightTable::from_gguf(*file, config);
      if (!gated)
        for (LayerWeights& l : weights.layers) l.shexp_gate = nullptr;
      ASSERT_EQ(cuda::CudaMoe::refusal(config, weights), "");
      MemoryManager memory(uint64_t{1} << 40);
      cuda::CudaStream stream;
      const kernels::KernelConfig kc = gpu_test::kernel_config();
      gpu_test::step("constructing CudaMoe with shared experts");
      cuda::CudaMoe moe(config, weights, memory, kMaxRows, uint64_t{1} << 40, stream.get());
      const SharedExpertRows in(config, kMaxRows, kc, stream);
      if (!f(config, weights, moe, in, kc, stream)) return;
    }
  }
}

// The tiled expert products against the tensor-core ones on the shared experts, in CudaMoe with
// its own buffers (the shared expert's h, hq, weights and the order/tiles the routed run used
// just before): the kernels give the same bits per pair (moe_mma_kernels_test's
// SharedExpertShapes), so the whole MoE block must too, row for row. Runs of 16, 24 (one tile of
// 32, partial), 64 and 150 rows (tiles of 32, the last partial), every layer, each three
// times, Q8_0 (split layout) and Q4_K, gated and not: a stale buffer or a race between the launches
// of a step shows as a difference on some run.
TEST(MoeSharedExpertGpu, TiledAndTensorCoreProductsAgree) {
  GRANULE_REQUIRE_GPU();
  if (!kernels::moe_mma_supports(static_cast<uint32_t>(TensorType::Q8_0)))
    GTEST_SKIP() << "this device or build has no int8 mma.sync";
  for_each_shared_expert_case(
      "moe-shared-tiled",
      [](const ModelConfig& config, const WeightTable&, cuda::CudaMoe& moe,
         const SharedExpertRows& in, const kernels::KernelConfig& kc, cuda::CudaStream& stream) {
        EXPECT_TRUE(moe.tiled_shared()) << "the tiled products are the shared experts' default";
        if (!moe.tiled_shared()) return false;
        for (int round = 0; round < 3; ++round)
          for (const int rows : {16, 24, 64, 150})
            for (int layer = 0; layer < config.n_layer; ++layer) {
              SCOPED_TRACE("round " + std::to_string(round) + ", rows " + std::to_string(rows) +
                           ", layer " + std::to_string(layer));
              auto run = [&](bool tiled) {
                moe.set_tiled_shared(tiled);
                gpu_test::DeviceArray<float> hidden = landed(in.residual);
                in.forward(moe, layer, rows, hidden, kc, stream);
                return hidden.download();
              };
              // The tensor-core products twice, around the tiled ones: a difference between the
              // two tensor-core runs is a race, not the kernels.
              gpu_test::step("the shared expert on the tensor-core products");
              const std::vector<float> want = run(false);
              gpu_test::step("the shared expert on the tiled products");
              const std::vector<float> got = run(true);
              gpu_test::step("the shared expert on the tensor-core products again");
              const std::vector<float> again = run(false);
              auto differences = [&](const std::vector<float>& a, const char* what) {
                size_t differ = 0, first = a.size();
                for (size_t i = 0; i < a.size(); ++i)
                  if (std::memcmp(&a[i], &want[i], sizeof(float)) != 0 && differ++ == 0) first = i;
                if (differ > 0)
                  ADD_FAILURE() << what << ": " << differ << " values differ, the first at row "
                                << first / static_cast<size_t>(config.n_embd) << " column "
                                << first % static_cast<size_t>(config.n_embd) << ": " << a[first]
                                << " vs " << want[first];
                return differ;
              };
              const size_t race = differences(again, "the tensor-core products run again");
              const size_t tiled = differences(got, "the tiled products");
              if (race + tiled > 0) return false;
            }
        return true;
      });
}

// CudaMoe with qwen35moe's shared expert (resident, sigmoid-gated, and with its gate taken away:
// weight 1) against the CPU reference's MoeFfn rounding as the kernels round, for runs of 1 and 5
// rows (the decode launches), 24 (grouped) and 150 (grouped, tiles of 32 and 64 pairs), every
// layer: each row within 2e-3 of its output's largest element, up to 1 row in 16 rerouted. The
// shared expert's share of the output is larger than the bound, so leaving it out would fail.
TEST(MoeSharedExpertGpu, MatchesTheCpuOracle) {
  GRANULE_REQUIRE_GPU();
  for_each_shared_expert_case(
      "moe-shared",
      [](const ModelConfig& config, const WeightTable& weights, cuda::CudaMoe& moe,
         const SharedExpertRows& in, const kernels::KernelConfig& kc, cuda::CudaStream& stream) {
        const int64_t n = config.n_embd;
        const std::vector<float>& residual = in.residual;
        const std::vector<float> xn = in.normed.download();
        cpu::ThreadPool pool(2);
        cpu::MoeFfnOptions oracle;
        oracle.emulate_device = true;
        for (const int rows : {1, 5, 24, 150})
          for (int layer = 0; layer < config.n_layer; ++layer) {
            SCOPED_TRACE("rows " + std::to_string(rows) + ", layer " + std::to_string(layer));
            gpu_test::step("CudaMoe with a shared expert");
            gpu_test::DeviceArray<float> hidden = landed(residual);
            in.forward(moe, layer, rows, hidden, kc, stream);
            const std::vector<float> gpu = hidden.download();
            gpu_test::step("the CPU oracle");
            const LayerWeights& lw = weights.layers[static_cast<size_t>(layer)];
            cpu::MoeFfn ffn(config, lw);
            std::vector<float> ref(static_cast<size_t>(rows * n));
            ffn.run(xn.data(), rows, ref.data(), pool, oracle, nullptr);
            LayerWeights routed_only = lw;
            routed_only.gate_shexp = routed_only.up_shexp = routed_only.down_shexp = nullptr;
            routed_only.shexp_gate = nullptr;
            cpu::MoeFfn ffn_routed(config, routed_only);
            std::vector<float> ref_routed(static_cast<size_t>(rows * n));
            ffn_routed.run(xn.data(), rows, ref_routed.data(), pool, oracle, nullptr);
            int bad_rows = 0;
            double shared_share = 0.0, largest_bound = 0.0;
            for (int r = 0; r < rows; ++r) {
              double largest = 0.0;
              for (int64_t i = 0; i < n; ++i)
                largest = std::max(
                    largest, static_cast<double>(std::fabs(ref[static_cast<size_t>(r * n + i)])));
              const double bound = 2e-3 * largest + 1e-5;
              largest_bound = std::max(largest_bound, bound);
              bool bad = false;
              for (int64_t i = 0; i < n; ++i) {
                const size_t at = static_cast<size_t>(r * n + i);
                const double want = static_cast<double>(residual[at]) + ref[at];
                if (std::fabs(gpu[at] - want) > bound) bad = true;
                shared_share = std::max(shared_share,
                                        static_cast<double>(std::fabs(ref[at] - ref_routed[at])));
              }
              bad_rows += bad ? 1 : 0;
            }
            EXPECT_LE(bad_rows, rows / 16) << "rows beyond the bound (rerouted tokens at most)";
            EXPECT_GT(shared_share, 10.0 * largest_bound) << "the shared expert adds too little";
            if (bad_rows > rows / 16) {
              // Which part is missing or extra: rows equal (within the bound) to the residual plus
              // the routed experts only, plus the shared expert only, or the residual alone.
              auto rows_like = [&](double routed, double shared) {
                int like = 0;
                for (int r = 0; r < rows; ++r) {
                  bool near = true;
                  for (int64_t i = 0; i < n && near; ++i) {
                    const size_t at = static_cast<size_t>(r * n + i);
                    const double want = residual[at] + routed * ref_routed[at] +
                                        shared * (static_cast<double>(ref[at]) - ref_routed[at]);
                    near = std::fabs(gpu[at] - want) <= largest_bound;
                  }
                  like += near ? 1 : 0;
                }
                return like;
              };
              ADD_FAILURE() << "of " << rows << " rows, " << rows_like(1.0, 0.0)
                            << " hold the routed experts only, " << rows_like(0.0, 1.0)
                            << " the shared expert only, " << rows_like(0.0, 0.0)
                            << " the residual alone, " << rows_like(1.0, 2.0)
                            << " the shared expert twice";
            }
          }
        return true;
      });
}

// A whole qwen35moe model (Gated DeltaNet layers 0-2 and 4, gated attention at 3, each with 8
// routed experts of 256, top 2, and the sigmoid-gated shared expert of 512) on the CUDA backend
// against the CPU oracle (the hybrid mixers and the experts rounding as the GPU does:
// cpu_oracle_test.cpp's HybridMoe cases), as MoeModelGpu and qwen35_gpu_test.cpp run their models:
//   - a prefill of 64 rows with every row's logits (the matvec path; the chunked delta rule from
//     kernels::kDeltaNetChunkedMinRows rows) and 16 decode steps replayed from graphs;
//   - a prefill of 2 x 150 rows (the cuBLAS path, the state carried from the first chunk to the
//     second) and 4 decode steps at 300;
//   - 6 sequences of 3 to 148 tokens decoding together for 6 steps (a graph of 8 rows, 2 of them
//     padding), then their next rows in one step beside 100 more prompt tokens of slot 1;
// each comparison by oracle_compare.h's rule. Rows may be past the bound (a rerouted token) where
// something upstream of a router reads int8 activations (quantised mixers or experts) or f16 GEMM
// operands. Files: everything F32 (the oracle differs from the f32 reference by the f16 KV only:
// the tightest bound), everything Q8_0, and F32 layers with Q4_K experts and shared expert.
struct Qwen35MoeCase {
  std::string name;
  TensorType layers, experts;
};

class Qwen35MoeModelGpu : public ::testing::TestWithParam<Qwen35MoeCase> {};

TEST_P(Qwen35MoeModelGpu, MatchesTheCpuOracle) {
  GRANULE_REQUIRE_GPU();
  static_assert(kernels::kDeltaNetChunkedMinRows <= 64);
  const Qwen35MoeCase& p = GetParam();
  gpu_test::step("writing the qwen35moe file");
  test::TempModel model(qwen35moe_model_spec(p.layers, p.experts), "qwen35moe-gpu");
  gpu_test::step("loading the CPU reference, the CPU oracle and the CUDA backend");
  Rig ref(model.path, options(false, false)), oracle(model.path, options(false, true)),
      gpu(model.path, options(true, false));
  const ModelConfig& c = gpu.config;
  ASSERT_TRUE(c.is_hybrid() && c.is_moe() && c.architecture == "qwen35moe");
  ASSERT_TRUE(c.layer_recurrent(0) && !c.layer_recurrent(3));
  ASSERT_TRUE(gpu.backend->is_gpu());
  ASSERT_NE(gpu.cuda().model().moe(), nullptr);
  EXPECT_TRUE(gpu.moe().all_resident());
  EXPECT_NE(oracle.backend->name().find("CUDA rounding"), std::string::npos);
  const int64_t vocab = c.n_vocab;
  // Whether a summation-order difference can flip an int8 rounding upstream of a router.
  const bool int8 = kernels::moe_reads_q8(static_cast<uint32_t>(p.experts)) ||
                    kernels::matvec_reads_q8(static_cast<uint32_t>(p.layers), true) ||
                    kernels::matvec_reads_q8(static_cast<uint32_t>(p.layers), false);
  const std::string name = "MoE qwen35moe " + p.name;
  // Past the matvec path every comparison may hold a rerouted token: the cuBLAS path's f16 GEMM
  // operands, and the rows whose state and KV came from it (the decode at 300, the batched
  // decode whose three longer prompts took that path, and the step beside a prompt of 100).
  gpu_test::ModelSections sections({&ref, &oracle, &gpu}, [&](gpu_test::Section s,
                                                              const gpu_test::SectionRows& rows) {
    const bool matvec = s == gpu_test::Section::Prefill64 || s == gpu_test::Section::GraphDecode;
    const std::string note = s == gpu_test::Section::DecodeAt300 ? " (state and KV from it)" : "";
    gpu_test::expect_close_to_oracle(rows[0], rows[1], rows[2], vocab,
                                     name + " " + gpu_test::section_name(s) + note,
                                     int8 || !matvec);
  });
  gpu_test::step("prefill of 64 rows, then 16 decode steps from graphs");
  sections.prefill_64_then_decode();
  gpu_test::step("prefill of 2 x 150 rows (cuBLAS), then 4 decode steps");
  sections.prefill_150(true);
  gpu_test::step("6 sequences decoding together, then beside a prompt of 100");
  sections.decode_six_together(29, true);
}

// A second turn from a snapshot: slot 0's chat (80 tokens) goes to host memory (KV and recurrent
// state) and comes back into slot 5, whose own chat it overwrites; its next turn (a prefill of 20
// and 4 decode steps) gives the logits of a twin backend whose chat kept slot 0, to the bit.
TEST_P(Qwen35MoeModelGpu, ASnapshotContinuesTheChatExactly) {
  GRANULE_REQUIRE_GPU();
  const Qwen35MoeCase& p = GetParam();
  test::TempModel model(qwen35moe_model_spec(p.layers, p.experts), "qwen35moe-gpu-snapshot");
  Rig gpu(model.path, options(true, false)), twin(model.path, options(true, false));
  const int64_t vocab = gpu.config.n_vocab;
  const uint64_t state_bytes = gpu.backend->recurrent_state_bytes();
  ASSERT_GT(state_bytes, 0u);
  const std::vector<int32_t> turn1 = random_tokens(80, vocab, 21);
  for (Rig* rig : {&gpu, &twin}) rig->step({{0, turn1, 0, false}});
  gpu.step({{5, random_tokens(33, vocab, 22), 0, false}});  // slot 5 holds another chat
  std::vector<uint8_t> host(gpu.kv->live_bytes(80) + state_bytes);
  ASSERT_TRUE(gpu.backend->copy_kv_to_host(0, 80, host.data()));
  ASSERT_TRUE(gpu.backend->copy_state_to_host(0, host.data() + host.size() - state_bytes));
  ASSERT_TRUE(gpu.kv->map_through(5, 80));
  ASSERT_TRUE(gpu.backend->copy_kv_from_host(5, host.data(), 80));
  ASSERT_TRUE(gpu.backend->copy_state_from_host(5, host.data() + host.size() - state_bytes, 80));
  const std::vector<int32_t> turn2 = random_tokens(24, vocab, 23);
  auto run = [&](Rig& rig, int32_t slot) {
    std::vector<float> out =
        rig.step({{slot, std::span<const int32_t>(turn2.data(), 20), 80, true}});
    for (int i = 20; i < 24; ++i) {
      const std::vector<float> l = rig.step(
          {{slot, std::span<const int32_t>(&turn2[static_cast<size_t>(i)], 1), 80 + i, false}});
      out.insert(out.end(), l.begin(), l.end());
    }
    return out;
  };
  const std::vector<float> restored = run(gpu, 5), kept = run(twin, 0);
  ASSERT_EQ(restored.size(), kept.size());
  size_t differ = 0;
  for (size_t i = 0; i < kept.size(); ++i)
    if (std::memcmp(&restored[i], &kept[i], sizeof(float)) != 0) ++differ;
  EXPECT_EQ(differ, 0u) << "the restored chat's logits differ from the chat that kept its state";
  EXPECT_GT(gpu.graphs().replays, 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Files, Qwen35MoeModelGpu,
    ::testing::Values(Qwen35MoeCase{"f32", TensorType::F32, TensorType::F32},
                      Qwen35MoeCase{"q8_0", TensorType::Q8_0, TensorType::Q8_0},
                      Qwen35MoeCase{"f32_q4_k_experts", TensorType::F32, TensorType::Q4_K}),
    [](const ::testing::TestParamInfo<Qwen35MoeCase>& info) { return info.param.name; });

// What the CUDA backend does not run is refused in one line (Device Auto then takes the CPU): a
// malformed shared expert; gpt-oss attention runs. Needs no GPU.
TEST(MoeModelRefusal, SharedExpertsButNotGptOssAttention) {
  {
    SyntheticModelSpec s = moe_spec("qwen3moe", TensorType::F32);
    test::TempModel model(s, "moe-refusal");
    auto file = ModelFile::open(model.path);
    ModelConfig config = ModelConfig::from_gguf(*file);
    const WeightTable weights = WeightTable::from_gguf(*file, config);
    EXPECT_EQ(cuda_model_refusal(config, weights), "");
    config.attn_sinks = true;  // gpt-oss's attention runs (gptoss_gpu_test.cpp)
    EXPECT_EQ(cuda_model_refusal(config, weights), "");
  }
  {
    // A malformed shared expert (qwen3moe files carry none: a 3-D expert tensor stands in for
    // its gate, and up and down are missing).
    test::TempModel model(moe_spec("qwen3moe", TensorType::F32), "moe-refusal-shexp");
    auto file = ModelFile::open(model.path);
    const ModelConfig config = ModelConfig::from_gguf(*file);
    WeightTable weights = WeightTable::from_gguf(*file, config);
    weights.layers[1].gate_shexp = weights.layers[1].gate_exps;
    EXPECT_NE(cuda_model_refusal(config, weights).find("a shared expert needs"), std::string::npos);
  }
}

}  // namespace
}  // namespace granule
