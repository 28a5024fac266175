// The MoE block of decode runs, before and after issue 36's decode kernels (decode_chains), then
// the grouped expert products alone (kernels/moe.cu's dp4a family against kernels/moe_mma.cu's
// tensor-core one) at the shapes of the issue-36 models, on random expert bytes (the timing does
// not depend on the values) with uniform top-k routing: per run of R rows, the group kernel,
// gate/up and down of one layer, each timed with events over 20 replays after a warm-up, and the
// bytes of the experts the run touches over the time of gate/up + down (an HBM roofline is ~3.3
// TB/s on an H100); the tiled kernels (moe_gemm.cu) below each row at tiles of 8 and 32
// pairs, in the mma columns (`moe_bench products 32 512`: that table alone).
// What decides CudaMoe's kMmaMinRows, mma_tile_pairs and gemm_tile_pairs; the product build never
// compiles it. On the device, after building granule_kernels (build-gpu):
//   nvcc -O3 -std=c++17 -arch=sm_90 --expt-relaxed-constexpr -I kernels -I engine/include \
//     dev/cuda/moe_products_bench.cu build-gpu/kernels/libgranule_kernels.a -o /tmp/moe_bench
//   /tmp/moe_bench
// or, without building the library, from the five kernel files it links (each compiled with the
// same flags and -c, in parallel; about 3 minutes of CPU for all five on the development machine):
//   kernels/{moe,moe_mma,moe_gemm,moe_decode,quantize_activations}.cu
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "granule/block_formats.h"
#include "granule/split_layout.h"
#include "moe.cuh"
#include "moe_unpack.cuh"
#include "quant_blocks.cuh"
#include "quantize_activations.cuh"

namespace k = granule::kernels;

#define CHECK(x)                                                                              \
  do {                                                                                        \
    const cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

struct Shape {
  const char* name;
  int n_expert, n_used, n_embd, n_ff;
  uint32_t gate_up_type, down_type;
};

template <class T>
T* device_alloc(size_t n) {
  T* p = nullptr;
  CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return p;
}

// One matrix of every expert (random bytes; NaN scales cost the GPU nothing), rows as far apart
// as CudaMoe lays them, and its pointer table.
struct Matrix {
  k::MoeMatrix view{};
  uint8_t* bytes = nullptr;
  const void** table = nullptr;
  size_t slab = 0;
  Matrix(uint32_t type, int n_expert, int rows, int cols, std::mt19937& rng) {
    // As CudaMoe lays experts out: the split layout's row stride for moe_unpack::split_rows types.
    const int64_t row_bytes = k::moe_unpack::split_rows(type)
                                  ? k::split::row_stride(type, cols)
                                  : cols / k::block_elems(type) * k::block_bytes(type);
    slab = (static_cast<size_t>(rows) * row_bytes + 16 + 255) / 256 * 256;
    std::vector<uint8_t> host(slab * n_expert);
    for (auto& b : host) b = static_cast<uint8_t>(rng());
    bytes = device_alloc<uint8_t>(host.size());
    CHECK(cudaMemcpy(bytes, host.data(), host.size(), cudaMemcpyHostToDevice));
    std::vector<const void*> t(n_expert);
    for (int e = 0; e < n_expert; ++e) t[e] = bytes + e * slab;
    table = device_alloc<const void*>(n_expert);
    CHECK(cudaMemcpy(table, t.data(), n_expert * sizeof(void*), cudaMemcpyHostToDevice));
    view.table = table;
    view.type = type;
    view.row_bytes = row_bytes;
  }
};

template <class F>
float time_ms(F&& f) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) CHECK(f());
  CHECK(cudaEventRecord(a));
  constexpr int kReps = 20;
  for (int i = 0; i < kReps; ++i) CHECK(f());
  CHECK(cudaEventRecord(b));
  CHECK(cudaEventSynchronize(b));
  float ms = 0.0f;
  CHECK(cudaEventElapsedTime(&ms, a, b));
  return ms / kReps;
}

// The whole MoE block of small runs (decode), the launches CudaMoe::forward issued before issue
// 36's decode work (router, top-k, per-pair dp4a gate/up, quantize_q8, fused down + combine)
// against today's (fused route, warp-per-row gate/up with h's int8 blocks, down + combine with
// parallel pairs): 48 layers' chains captured in one graph with programmatic dependent launch, as
// a decode step runs them, each layer with its own F32 router (so routing differs per layer and
// the experts a layer reads are mostly not in L2), timed over 20 replays. Prints microseconds per
// layer and the routed experts' bytes per second; first, each of today's launches alone at 1 and 4
// rows for each L2 prefetch variant of the decode products.
void decode_chains(const Shape& s, std::mt19937& rng) {
  constexpr int kLayers = 48;
  Matrix gate(s.gate_up_type, s.n_expert, s.n_ff, s.n_embd, rng);
  Matrix up(s.gate_up_type, s.n_expert, s.n_ff, s.n_embd, rng);
  Matrix down(s.down_type, s.n_expert, s.n_embd, s.n_ff, rng);
  const size_t expert_bytes = gate.slab + up.slab + down.slab;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> router_host(static_cast<size_t>(kLayers) * s.n_expert * s.n_embd);
  for (float& v : router_host) v = 0.05f * normal(rng);
  float* routers = device_alloc<float>(router_host.size());
  CHECK(cudaMemcpy(routers, router_host.data(), router_host.size() * sizeof(float),
                   cudaMemcpyHostToDevice));
  constexpr int kMaxRows = 7;
  const int max_pairs = kMaxRows * s.n_used;
  std::vector<float> x_host(static_cast<size_t>(kMaxRows) * s.n_embd);
  for (float& v : x_host) v = normal(rng);
  float* x = device_alloc<float>(x_host.size());
  CHECK(cudaMemcpy(x, x_host.data(), x_host.size() * sizeof(float), cudaMemcpyHostToDevice));
  int8_t* xq = device_alloc<int8_t>(static_cast<size_t>(kMaxRows) * s.n_embd);
  float2* xd = device_alloc<float2>(static_cast<size_t>(kMaxRows) * s.n_embd / 32);
  CHECK(cudaMemset(xq, 1, static_cast<size_t>(kMaxRows) * s.n_embd));
  CHECK(cudaMemset(xd, 0, static_cast<size_t>(kMaxRows) * s.n_embd / 32 * sizeof(float2)));
  float* logits = device_alloc<float>(static_cast<size_t>(kMaxRows) * s.n_expert);
  int32_t* ids = device_alloc<int32_t>(max_pairs);
  float* weights = device_alloc<float>(max_pairs);
  int32_t* counts = device_alloc<int32_t>(static_cast<size_t>(kLayers) * s.n_expert);
  unsigned int* counter = device_alloc<unsigned int>(1);
  CHECK(cudaMemset(counter, 0, sizeof(unsigned int)));
  float* h = device_alloc<float>(static_cast<size_t>(max_pairs) * s.n_ff);
  int8_t* hq = device_alloc<int8_t>(static_cast<size_t>(max_pairs) * s.n_ff);
  float2* hd = device_alloc<float2>(static_cast<size_t>(max_pairs) * s.n_ff / 32);
  float* hidden = device_alloc<float>(static_cast<size_t>(kMaxRows) * s.n_embd);
  CHECK(cudaMemset(hidden, 0, static_cast<size_t>(kMaxRows) * s.n_embd * sizeof(float)));
  k::KernelConfig config;  // early launch on, as the decode graphs run
  k::MoeRouting routing{.n_expert = s.n_expert, .n_used = s.n_used, .normalize = true};
  const int64_t router_row_bytes = static_cast<int64_t>(s.n_embd) * sizeof(float);
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // stages: how many of today's three launches (route, gate/up, down) a layer runs; prefetch: the
  // decode products' l2_prefetch_stride (< 0: the product's).
  auto layer_chain = [&](bool fused, int rows, int layer, int stages = 3, int prefetch = -1) {
    const float* router = routers + static_cast<size_t>(layer) * s.n_expert * s.n_embd;
    int32_t* layer_counts = counts + static_cast<size_t>(layer) * s.n_expert;
    const int pairs = rows * s.n_used;
    k::MoeInput in;
    in.n_in = s.n_embd;
    in.pairs = pairs;
    in.n_used = s.n_used;
    in.n_expert = s.n_expert;
    in.x = x;
    in.xq = {xq, xd};
    in.ids = ids;
    k::MoeInput din = in;
    din.n_in = s.n_ff;
    din.x = h;
    din.xq = {hq, hd};
    if (fused) {
      CHECK(k::launch_moe_route(k::kF32, router, router_row_bytes, s.n_embd, x, rows, nullptr,
                                routing, logits, ids, weights, layer_counts, nullptr, counter,
                                config, stream));
      if (stages >= 2)
        CHECK(k::launch_moe_gate_up_decode(gate.view, up.view, k::MoeActivation::Swiglu, s.n_ff, in,
                                           h, {hq, hd}, config, stream, prefetch));
      if (stages >= 3)
        CHECK(k::launch_moe_down_combine_decode(down.view, s.n_embd, din, weights, hidden, config,
                                                stream, prefetch));
    } else {
      CHECK(k::launch_moe_router(k::kF32, router, router_row_bytes, s.n_expert, s.n_embd, x, rows,
                                 nullptr, logits, config, stream));
      CHECK(k::launch_moe_topk(logits, rows, routing, ids, weights, layer_counts, nullptr, config,
                               stream));
      CHECK(k::launch_moe_gate_up(gate.view, up.view, k::MoeActivation::Swiglu, s.n_ff, in, h,
                                  config, stream));
      CHECK(k::launch_quantize_q8(h, pairs, s.n_ff, {hq, hd}, config, stream));
      CHECK(k::launch_moe_down_combine(down.view, s.n_embd, din, weights, hidden, config, stream));
    }
  };
  std::printf(
      "\n%s, decode: the MoE block per layer (%d layers in one graph), %zu KiB per expert\n",
      s.name, kLayers, expert_bytes >> 10);
  // Microseconds per layer of a graph of kLayers layers' chains.
  auto graph_us = [&](auto&& chain) {
    cudaGraph_t graph;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    for (int layer = 0; layer < kLayers; ++layer) chain(layer);
    CHECK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    for (int i = 0; i < 3; ++i) CHECK(cudaGraphLaunch(exec, stream));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    constexpr int kReps = 20;
    CHECK(cudaEventRecord(a, stream));
    for (int i = 0; i < kReps; ++i) CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(b, stream));
    CHECK(cudaEventSynchronize(b));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    CHECK(cudaEventDestroy(a));
    CHECK(cudaEventDestroy(b));
    return ms * 1e3f / (kReps * kLayers);
  };
  // Today's launches one at a time: route alone, route + gate/up, all three, so each launch's
  // share of a layer (with the overlap PDL gives it) is a difference; for each L2 prefetch
  // variant of the decode products (the product's, none, by 32 and by 128 bytes).
  std::printf("| rows | prefetch | route us | gate/up us | down us | layer us | experts GB/s |\n");
  for (const int rows : {1, 4}) {
    const float route = graph_us([&](int layer) { layer_chain(true, rows, layer, 1); });
    for (const int prefetch : {-1, 0, 128}) {
      const float two = graph_us([&](int layer) { layer_chain(true, rows, layer, 2, prefetch); });
      const float three = graph_us([&](int layer) { layer_chain(true, rows, layer, 3, prefetch); });
      const double bytes = static_cast<double>(rows) * s.n_used * expert_bytes;
      std::printf("| %4d | %8s | %8.1f | %10.1f | %7.1f | %8.1f | %12.0f |\n", rows,
                  prefetch < 0 ? "product" : std::to_string(prefetch).c_str(), route, two - route,
                  three - two, three, bytes / ((three - route) * 1e3));
    }
  }
  std::printf("| rows | before us/layer | now us/layer | speed-up | before GB/s | now GB/s |\n");
  for (const int rows : {1, 2, 4, 7}) {
    float us[2];
    for (const bool fused : {false, true})
      us[fused ? 1 : 0] = graph_us([&](int layer) { layer_chain(fused, rows, layer); });
    // Bytes a layer reads: its router and rows·n_used experts (an upper bound: a row's experts
    // may repeat across rows).
    const double bytes = static_cast<double>(router_row_bytes) * s.n_expert +
                         static_cast<double>(rows) * s.n_used * expert_bytes;
    std::printf("| %4d | %15.1f | %12.1f | %7.2fx | %11.0f | %8.0f |\n", rows, us[0], us[1],
                us[0] / us[1], bytes / (us[0] * 1e3), bytes / (us[1] * 1e3));
  }
  CHECK(cudaStreamDestroy(stream));
}

// Routing of longer runs (batches, prefill): launch_moe_router + launch_moe_topk against the one
// launch_moe_route (a top-k per group of 8 rows by the group's last router block), one F32 router,
// each timed alone over 20 launches. Prints microseconds per layer.
void route_runs(const Shape& s, std::mt19937& rng) {
  constexpr int kMaxRows = 512;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> host(static_cast<size_t>(s.n_expert) * s.n_embd);
  for (float& v : host) v = 0.05f * normal(rng);
  float* router = device_alloc<float>(host.size());
  CHECK(cudaMemcpy(router, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  host.assign(static_cast<size_t>(kMaxRows) * s.n_embd, 0.0f);
  for (float& v : host) v = normal(rng);
  float* x = device_alloc<float>(host.size());
  CHECK(cudaMemcpy(x, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  float* logits = device_alloc<float>(static_cast<size_t>(kMaxRows) * s.n_expert);
  int32_t* ids = device_alloc<int32_t>(static_cast<size_t>(kMaxRows) * s.n_used);
  float* weights = device_alloc<float>(static_cast<size_t>(kMaxRows) * s.n_used);
  int32_t* counts = device_alloc<int32_t>(s.n_expert);
  unsigned int* counters = device_alloc<unsigned int>(k::moe_route_counters(kMaxRows));
  CHECK(cudaMemset(counters, 0, k::moe_route_counters(kMaxRows) * sizeof(unsigned int)));
  k::KernelConfig config;
  config.early_launch = false;
  const k::MoeRouting routing{.n_expert = s.n_expert, .n_used = s.n_used, .normalize = true};
  const int64_t row_bytes = static_cast<int64_t>(s.n_embd) * sizeof(float);
  std::printf("\n%s routing: | rows | router + top-k us | route us |\n", s.name);
  for (const int rows : {8, 32, 128, 512}) {
    const float two = time_ms([&] {
      const cudaError_t e = k::launch_moe_router(k::kF32, router, row_bytes, s.n_expert, s.n_embd,
                                                 x, rows, nullptr, logits, config, nullptr);
      if (e != cudaSuccess) return e;
      return k::launch_moe_topk(logits, rows, routing, ids, weights, counts, nullptr, config,
                                nullptr);
    });
    const float one = time_ms([&] {
      return k::launch_moe_route(k::kF32, router, row_bytes, s.n_embd, x, rows, nullptr, routing,
                                 logits, ids, weights, counts, nullptr, counters, config, nullptr);
    });
    std::printf("| %4d | %17.1f | %8.1f |\n", rows, two * 1e3, one * 1e3);
  }
}

// moe_bench: every table; moe_bench products [ROWS...]: only the grouped products' table (dp4a,
// tensor-core and tiled at each tile size), at the given run lengths (default 32 and 512, the
// 32-chat decode step and a pp512 chunk).
int main(int argc, char** argv) {
  const bool products_only = argc > 1 && std::string(argv[1]) == "products";
  std::vector<int> run_rows = {8, 16, 32, 64, 128, 512};
  if (products_only) {
    run_rows.clear();
    for (int i = 2; i < argc; ++i) run_rows.push_back(std::atoi(argv[i]));
    if (run_rows.empty()) run_rows = {32, 512};
    for (const int rows : run_rows)
      if (rows < 1 || rows > 512) {
        std::fprintf(stderr, "rows %d: 1 to 512\n", rows);
        return 1;
      }
  }
  const Shape shapes[] = {{"qwen3-30b-a3b (Q4_K / Q6_K)", 128, 8, 2048, 768, k::kQ4_K, k::kQ6_K},
                          {"qwen3-30b-a3b (Q4_K / Q4_K)", 128, 8, 2048, 768, k::kQ4_K, k::kQ4_K},
                          {"gpt-oss-20b (MXFP4)", 32, 4, 2880, 2880, k::kMXFP4, k::kMXFP4}};
  k::KernelConfig config;
  config.early_launch = false;
  std::mt19937 rng(1);
  if (!products_only) {
    for (const Shape& s : shapes) decode_chains(s, rng);
    for (const Shape& s : shapes) route_runs(s, rng);
  }
  for (const Shape& s : shapes) {
    if (!k::moe_gemm_prepare(s.gate_up_type) || !k::moe_gemm_prepare(s.down_type)) {
      std::printf("no tiled products for %s on this device\n", s.name);
      return 1;
    }
    Matrix gate(s.gate_up_type, s.n_expert, s.n_ff, s.n_embd, rng);
    Matrix up(s.gate_up_type, s.n_expert, s.n_ff, s.n_embd, rng);
    Matrix down(s.down_type, s.n_expert, s.n_embd, s.n_ff, rng);
    const size_t expert_bytes = gate.slab + up.slab + down.slab;
    std::printf("\n%s: %d experts, top %d, %zu KiB per expert\n", s.name, s.n_expert, s.n_used,
                expert_bytes >> 10);
    std::printf(
        "| rows | pairs | experts hit | tile | group us | dp4a gate/up us | dp4a down us "
        "| mma gate/up us | mma down us | dp4a GB/s | mma GB/s |\n");
    const int max_rows = 512, max_pairs = max_rows * s.n_used;
    int8_t* xq = device_alloc<int8_t>(static_cast<size_t>(max_rows) * s.n_embd);
    float2* xd = device_alloc<float2>(static_cast<size_t>(max_rows) * s.n_embd / 32);
    int8_t* hq = device_alloc<int8_t>(static_cast<size_t>(max_pairs) * s.n_ff);
    float2* hd = device_alloc<float2>(static_cast<size_t>(max_pairs) * s.n_ff / 32);
    float* h = device_alloc<float>(static_cast<size_t>(max_pairs) * s.n_ff);
    float* y = device_alloc<float>(static_cast<size_t>(max_pairs) * s.n_embd);
    CHECK(cudaMemset(xq, 1, static_cast<size_t>(max_rows) * s.n_embd));
    CHECK(cudaMemset(hq, 1, static_cast<size_t>(max_pairs) * s.n_ff));
    CHECK(cudaMemset(xd, 0, static_cast<size_t>(max_rows) * s.n_embd / 32 * sizeof(float2)));
    CHECK(cudaMemset(hd, 0, static_cast<size_t>(max_pairs) * s.n_ff / 32 * sizeof(float2)));
    int32_t* ids = device_alloc<int32_t>(max_pairs);
    int32_t* order = device_alloc<int32_t>(max_pairs);
    int32_t* n_tiles = device_alloc<int32_t>(1);
    k::MoeTile* tiles = device_alloc<k::MoeTile>(k::moe_max_tiles(max_pairs, s.n_expert, 8));
    for (const int rows : run_rows) {
      const int pairs = rows * s.n_used;
      std::vector<int32_t> chosen;
      std::vector<int> all(s.n_expert);
      std::iota(all.begin(), all.end(), 0);
      std::vector<bool> hit(s.n_expert, false);
      for (int r = 0; r < rows; ++r) {
        std::shuffle(all.begin(), all.end(), rng);
        for (int j = 0; j < s.n_used; ++j) {
          chosen.push_back(all[j]);
          hit[all[j]] = true;
        }
      }
      const int experts_hit = static_cast<int>(std::count(hit.begin(), hit.end(), true));
      CHECK(cudaMemcpy(ids, chosen.data(), pairs * sizeof(int32_t), cudaMemcpyHostToDevice));
      const int mma_tile = pairs >= 8 * s.n_expert ? 32 : 8;  // CudaMoe's mma_tile_pairs
      k::MoeInput in;
      in.n_in = s.n_embd;
      in.pairs = pairs;
      in.n_used = s.n_used;
      in.n_expert = s.n_expert;
      in.xq = {xq, xd};
      in.ids = ids;
      k::MoeInput din = in;
      din.n_in = s.n_ff;
      din.xq = {hq, hd};
      auto with_tile = [&](k::MoeInput i, int tile) {
        i.groups = {order, tiles, n_tiles, tile};
        return i;
      };
      const float group_ms = time_ms([&] {
        return k::launch_moe_group(ids, pairs, s.n_expert, with_tile(in, 8).groups, config,
                                   nullptr);
      });
      CHECK(k::launch_moe_group(ids, pairs, s.n_expert, with_tile(in, 8).groups, config, nullptr));
      const float dp4a_gu = time_ms([&] {
        return k::launch_moe_gate_up(gate.view, up.view, k::MoeActivation::Swiglu, s.n_ff,
                                     with_tile(in, 8), h, config, nullptr);
      });
      const float dp4a_d = time_ms([&] {
        return k::launch_moe_down(down.view, s.n_embd, with_tile(din, 8), y, config, nullptr);
      });
      CHECK(k::launch_moe_group(ids, pairs, s.n_expert, with_tile(in, mma_tile).groups, config,
                                nullptr));
      const float mma_gu = time_ms([&] {
        return k::launch_moe_gate_up_mma(gate.view, up.view, k::MoeActivation::Swiglu, s.n_ff,
                                         with_tile(in, mma_tile), h, config, nullptr);
      });
      const float mma_d = time_ms([&] {
        return k::launch_moe_down_mma(down.view, s.n_embd, with_tile(din, mma_tile), y, config,
                                      nullptr);
      });
      const double bytes = static_cast<double>(experts_hit) * expert_bytes;
      std::printf(
          "| %4d | %5d | %11d | %4d | %8.1f | %15.1f | %12.1f | %14.1f | %11.1f | %9.0f | "
          "%8.0f |\n",
          rows, pairs, experts_hit, mma_tile, group_ms * 1e3, dp4a_gu * 1e3, dp4a_d * 1e3,
          mma_gu * 1e3, mma_d * 1e3, bytes / ((dp4a_gu + dp4a_d) * 1e6),
          bytes / ((mma_gu + mma_d) * 1e6));
      // The tiled kernels (moe_gemm.cu) at each tile size.
      for (const int tile : k::kMoeGemmTilePairs) {
        CHECK(k::launch_moe_group(ids, pairs, s.n_expert, with_tile(in, tile).groups, config,
                                  nullptr));
        const float gemm_gu = time_ms([&] {
          return k::launch_moe_gate_up_gemm(gate.view, up.view, k::MoeActivation::Swiglu, s.n_ff,
                                            with_tile(in, tile), h, {hq, hd}, config, nullptr);
        });
        const float gemm_d = time_ms([&] {
          return k::launch_moe_down_gemm(down.view, s.n_embd, with_tile(din, tile), y, config,
                                         nullptr);
        });
        std::printf(
            "|      |       |   tiled:    | %4d |          | %15s | %12s | %14.1f | %11.1f "
            "| %9s | %8.0f |\n",
            tile, "", "", gemm_gu * 1e3, gemm_d * 1e3, "", bytes / ((gemm_gu + gemm_d) * 1e6));
      }
    }
  }
  return 0;
}
