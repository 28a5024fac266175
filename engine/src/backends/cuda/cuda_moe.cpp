// CudaMoe: the routers and experts of a mixture-of-experts model on the GPU, the expert
// residency (VRAM, or mapped host memory with a device cache) and one MoE layer's kernels.
#include "backends/cuda/cuda_moe.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "backends/cpu/thread_pool.h"
#include "backends/cuda/cuda_check.h"
#include "granule/error.h"
#include "granule/log.h"
#include "granule/quant.h"
#include "granule/tensor_type.h"
#include "memory/weight_layout.h"
#include "model/weight_split.h"
#include "moe_unpack.cuh"
#include "quant_blocks.cuh"
#include "quantize_activations.cuh"

namespace granule::cuda {
namespace {

namespace k = granule::kernels;

// Runs of at most this many rows take the per-pair expert kernels (decode: the warp-per-row
// launch_moe_*_decode for quantised experts, the block-per-4-rows dp4a ones for F32/F16/BF16);
// more are grouped by expert first (one weight read per tile of pairs). Up to kMmaMinRows - 1
// rows most experts get one pair (top-8 of 128), so grouping buys little and costs a launch. All
// give the same bits per pair.
constexpr int kPerPairMaxRows = 7;
// Grouped runs of at least this many rows take the tensor-core expert products
// (launch_moe_*_mma) for the types they cover, fewer the grouped dp4a ones. Not yet measured
// (issue 36): at 8 rows of top-8 routing most experts get one pair, and both families are then
// bound by reading the weights; the tensor-core one builds its int8 fragments from wider loads
// and does a fifth of the dp4a one's instructions per weight byte and pair, so it should be
// the faster from there on. The two differ in f32 summation order only (the same bound against
// the CPU oracle); within each family a pair's result does not depend on the run.
constexpr int kMmaMinRows = 8;

// The tensor-core products' tile: 32 pairs where experts get about 8 or more pairs on average
// (prefill: 512 rows of top-8 over 128 experts give 32), so one read of an expert's rows serves
// them all; else 8 (decode batches: one or two pairs per expert), whose kernels hold fewer
// registers and keep more warps' loads in flight.
int mma_tile_pairs(int pairs, int64_t n_expert) {
  return static_cast<int64_t>(pairs) >= 8 * n_expert ? 32 : 8;
}

// The tiled products' tile (moe_gemm.cu): a block stages an expert's 64 rows once for all of a
// tile's pairs: 32 from about 6 pairs per expert on average, else 8 (decode batches: one to four
// per expert). Tiles of 64 (two warps build each fragment) lost to 32 at every run length on an
// H100 (moe_products_bench, gpt-oss-20b shape, 512 rows: 882 + 416 against 783 + 390 us a layer).
int gemm_tile_pairs(int pairs, int64_t n_expert) {
  return static_cast<int64_t>(pairs) / n_expert >= 6 ? 32 : 8;
}

uint64_t align_up(uint64_t bytes) { return WeightLayout::align_up(bytes); }

std::vector<float> to_f32(const TensorInfo* t) {
  std::vector<float> out(static_cast<size_t>(t->elements()));
  dequantize_row(static_cast<TensorType>(t->ggml_type), t->data, out.data(), t->elements());
  return out;
}

// The host's layout of expert rows (weight_split.h) and the kernels' (moe_unpack.cuh) agree.
constexpr bool layouts_agree() {
  for (uint32_t type = 0; type < 64; ++type)
    if (expert_rows_split(type) != k::moe_unpack::split_rows(type)) return false;
  return true;
}
static_assert(layouts_agree(), "expert_rows_split and moe_unpack::split_rows name other types");

// One expert's slab of a 3-D expert tensor in the file.
uint64_t file_slab_bytes(const TensorInfo* t, int64_t n_expert) {
  return t->size_bytes / static_cast<uint64_t>(n_expert);
}

// GGUF's row bytes (the routers and the shared expert's gate row, read by dequantize8).
int64_t tensor_row_bytes(const TensorInfo* t) {
  return static_cast<int64_t>(row_bytes(static_cast<TensorType>(t->ggml_type), t->dims[0]));
}
// An expert matrix's row bytes as the expert kernels read it (the split layout for some types).
int64_t matrix_row_bytes(const TensorInfo* t) { return expert_row_bytes(t->ggml_type, t->dims[0]); }
// Bytes of a 2-D matrix (or one expert's slab of a 3-D one) as the expert kernels read it.
uint64_t matrix_bytes(const TensorInfo* t) {
  return static_cast<uint64_t>(matrix_row_bytes(t)) * static_cast<uint64_t>(t->dims[1]);
}

// The kernels' view of expert matrix `t`: its pointer table (one pointer per expert; the routed
// experts' is set by write_tables()), type, row bytes as they read it, and bias.
k::MoeMatrix moe_matrix(const TensorInfo* t, const void* const* table, const float* bias) {
  return {.table = table, .type = t->ggml_type, .row_bytes = matrix_row_bytes(t), .bias = bias};
}

// Writes matrix `t` (one expert's slab of a 3-D one), from its GGUF blocks at `from`, as the
// expert kernels read it (write_expert_rows) to `dst`, its rows shared out over the pool's threads.
void write_matrix_rows(const TensorInfo* t, const uint8_t* from, uint8_t* dst,
                       cpu::ThreadPool& pool) {
  const int64_t cols = t->dims[0], gguf_row = tensor_row_bytes(t), row = matrix_row_bytes(t);
  // Rows of whole blocks (refusal() checked), so write_expert_rows does not throw.
  pool.parallel_for(t->dims[1], [&](int64_t begin, int64_t end, int32_t) {
    write_expert_rows(t->ggml_type, from + begin * gguf_row, end - begin, cols, dst + begin * row);
  });
}

// Copies matrix `t` (GGUF blocks at `from`) to `to` on the device as the expert kernels read it:
// the split types' rows re-laid in `staging` on the way, the others as they are.
void upload_matrix(const TensorInfo* t, const uint8_t* from, uint8_t* to,
                   std::vector<uint8_t>& staging, cpu::ThreadPool& pool, const char* what) {
  if (expert_rows_split(t->ggml_type)) {
    staging.resize(matrix_bytes(t));
    write_matrix_rows(t, from, staging.data(), pool);
    from = staging.data();
  }
  check_cuda(cudaMemcpy(to, from, matrix_bytes(t), cudaMemcpyHostToDevice), what);
}

// The longest this waits for the stream between steps. A step takes milliseconds to seconds;
// past this the device is taken to be hung, and the caller gets a DeviceError rather than a
// process that never returns (issue 36: a streaming test hung on an H100).
constexpr double kStreamWaitSeconds = 120.0;

// Waits until the work queued on `stream` so far has run, polling an event (cudaEventQuery
// with short sleeps) instead of blocking in cudaStreamSynchronize, so that the wait is bounded.
void wait_for_stream(cudaStream_t stream, const char* what) {
  CudaEvent done;
  check_cuda(cudaEventRecord(done.get(), stream), what);
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(10);
  for (;;) {
    const cudaError_t status = cudaEventQuery(done.get());
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) check_cuda(status, what);
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
        kStreamWaitSeconds)
      throw DeviceError(std::string("the GPU did not finish ") + what + " within " +
                        std::to_string(static_cast<int>(kStreamWaitSeconds)) +
                        " s; the device looks hung");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace

CudaMoe::HostImage::~HostImage() {
  if (host) {
    const cudaError_t status = cudaFreeHost(host);
    if (status != cudaSuccess)
      logger("engine.cuda")->error("cudaFreeHost: {}", cudaGetErrorString(status));
  }
}

std::string CudaMoe::refusal(const ModelConfig& c, const WeightTable& w) {
  const ExpertConfig& m = c.moe;
  if (m.n_expert > k::kMoeMaxExperts)
    return "the CUDA backend runs up to " + std::to_string(k::kMoeMaxExperts) + " experts, not " +
           std::to_string(m.n_expert);
  if (m.n_expert_used < 1 || m.n_expert_used > k::kMoeMaxUsed || m.n_expert_used > m.n_expert)
    return "the CUDA backend runs 1 to " + std::to_string(k::kMoeMaxUsed) +
           " experts per token, not " + std::to_string(m.n_expert_used);
  if (m.n_ff_exp % k::kQ8Block != 0)
    return "the CUDA backend needs an expert feed-forward size that is a multiple of 32";
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string at = "layer " + std::to_string(i) + ": ";
    if (l.gate_shexp || l.up_shexp || l.down_shexp) {
      if (!l.gate_shexp || !l.up_shexp || !l.down_shexp || l.gate_shexp->dims.size() != 2 ||
          l.up_shexp->dims.size() != 2 || l.down_shexp->dims.size() != 2)
        return at + "a shared expert needs 2-D gate, up and down matrices";
      for (const TensorInfo* t : {l.gate_shexp, l.up_shexp, l.down_shexp, l.shexp_gate}) {
        if (!t) continue;
        if (!k::moe_supports(t->ggml_type))
          return "the CUDA backend cannot run tensor " + t->name + " of type " +
                 tensor_type_name(t->ggml_type);
        if (t->dims[0] % k::block_elems(t->ggml_type) != 0)
          return "tensor " + t->name + ": rows not a whole number of blocks";
      }
      if (l.gate_shexp->ggml_type != l.up_shexp->ggml_type)
        return at + "the CUDA backend needs shared-expert gate and up matrices of one type";
      if (l.gate_shexp->dims[1] % k::kQ8Block != 0)
        return at +
               "the CUDA backend needs a shared-expert feed-forward size that is a multiple "
               "of 32";
    }
    if (!l.router || !l.gate_exps || !l.up_exps || !l.down_exps)
      return at + "a mixture-of-experts layer without its router or expert tensors";
    for (const TensorInfo* t : {l.router, l.gate_exps, l.up_exps, l.down_exps}) {
      if (!k::moe_supports(t->ggml_type))
        return "the CUDA backend cannot run tensor " + t->name + " of type " +
               tensor_type_name(t->ggml_type);
      if (t->dims[0] % k::block_elems(t->ggml_type) != 0)
        return "tensor " + t->name + ": rows not a whole number of blocks";
    }
    if (l.gate_exps->ggml_type != l.up_exps->ggml_type)
      return at + "the CUDA backend needs expert gate and up matrices of one type (" +
             tensor_type_name(l.gate_exps->ggml_type) + " and " +
             tensor_type_name(l.up_exps->ggml_type) + ")";
  }
  return {};
}

CudaMoe::CudaMoe(const ModelConfig& c, const WeightTable& w, MemoryManager& memory, int max_rows,
                 uint64_t expert_budget, cudaStream_t stream, int host_experts,
                 int32_t host_threads)
    : memory_(memory),
      n_layer_(c.n_layer),
      n_expert_(c.moe.n_expert),
      n_used_(c.moe.n_expert_used),
      n_embd_(c.n_embd),
      n_ff_(c.moe.n_ff_exp),
      max_rows_(max_rows) {
  if (const std::string why = refusal(c, w); !why.empty()) throw DeviceError(why);
  const uint64_t used_before = memory_.used_bytes();
  routing_.n_expert = static_cast<int>(n_expert_);
  routing_.n_used = static_cast<int>(n_used_);
  routing_.gating = static_cast<k::MoeGating>(static_cast<int>(c.moe.gating));
  routing_.normalize = c.moe.normalize_weights;
  routing_.scale = c.moe.weights_scale;
  activation_ = static_cast<k::MoeActivation>(static_cast<int>(c.activation));
  static_assert(static_cast<int>(ExpertGating::SoftmaxOfTopK) ==
                static_cast<int>(k::MoeGating::SoftmaxOfTopK));
  static_assert(static_cast<int>(FfnActivation::SwigluClamped) ==
                static_cast<int>(k::MoeActivation::SwigluClamped));
  static_assert(static_cast<int>(FfnActivation::GeluTanh) ==
                static_cast<int>(k::MoeActivation::Geglu));

  layers_.resize(static_cast<size_t>(n_layer_));
  upload_routers(w);
  // Re-laying the split types' rows (write_expert_rows) runs at ~1.5 GB/s a thread: gpt-oss-20b's
  // ~10 GB of MXFP4 experts would add seconds to the load on one.
  cpu::ThreadPool pool(
      static_cast<int32_t>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u)));
  upload_shared(w, pool);

  // Workspace for runs of max_rows rows.
  const size_t rows = static_cast<size_t>(max_rows_);
  const size_t pairs = rows * static_cast<size_t>(n_used_);
  const size_t ff = static_cast<size_t>(n_ff_), embd = static_cast<size_t>(n_embd_);
  auto ws = [&](size_t bytes) { return DeviceBuffer(memory_, MemoryCategory::Workspace, bytes); };
  logits_ = ws(rows * static_cast<size_t>(n_expert_) * sizeof(float));
  ids_ = ws(pairs * sizeof(int32_t));
  weights_ = ws(pairs * sizeof(float));
  h_ = ws(pairs * ff * sizeof(float));
  hq_qs_ = ws(pairs * ff);
  hq_ds_ = ws(pairs * ff / k::kQ8Block * sizeof(float2));
  y_ = ws(pairs * embd * sizeof(float));
  order_ = ws(pairs * sizeof(int32_t));
  tiles_ = ws(
      static_cast<size_t>(k::moe_max_tiles(static_cast<int>(pairs), static_cast<int>(n_expert_))) *
      sizeof(k::MoeTile));
  n_tiles_ = ws(sizeof(int32_t));
  if (!gemma4_layers_.empty()) {
    const size_t each = rows * embd;
    gemma4_scratch_ = ws(4 * each * sizeof(float));
    float* at = gemma4_scratch_.as<float>();
    gemma4_workspace_ = {.router_in = at,
                         .expert_in = at + each,
                         .dense_out = at + 2 * each,
                         .experts_out = at + 3 * each};
  }
  if (n_ff_shared_ > 0) {
    const size_t sh = rows * static_cast<size_t>(n_ff_shared_);
    shared_ids_ = ws(rows * sizeof(int32_t));
    check_cuda(cudaMemsetAsync(shared_ids_.get(), 0, shared_ids_.bytes(), stream),
               "cudaMemsetAsync");
    shared_ones_ = ws(rows * sizeof(float));
    const std::vector<float> ones(rows, 1.0f);
    check_cuda(
        cudaMemcpy(shared_ones_.get(), ones.data(), shared_ones_.bytes(), cudaMemcpyHostToDevice),
        "uploading the shared expert's weights");
    shared_weights_ = ws(rows * sizeof(float));
    shared_logits_ = ws(rows * sizeof(float));
    shared_h_ = ws(sh * sizeof(float));
    shared_hq_qs_ = ws(sh);
    shared_hq_ds_ = ws(sh / k::kQ8Block * sizeof(float2));
  }
  route_counter_ = ws(static_cast<size_t>(k::moe_route_counters(max_rows_)) * sizeof(uint32_t));
  check_cuda(cudaMemsetAsync(route_counter_.get(), 0, route_counter_.bytes(), stream),
             "cudaMemsetAsync");
  const size_t n_counts = static_cast<size_t>(n_layer_ * n_expert_);
  counts_ = ws(n_counts * sizeof(int32_t));
  check_cuda(cudaMemsetAsync(counts_.get(), 0, counts_.bytes(), stream), "cudaMemsetAsync");
  counts_host_.assign(n_counts, 0);
  counts_pinned_ = PinnedBuffer(counts_.bytes());
  tables_ = ws(n_counts * 3 * sizeof(void*));
  tables_host_ = PinnedBuffer(tables_.bytes());

  // The routers, biases and workspace come out of the experts' budget.
  const uint64_t taken = memory_.used_bytes() - used_before;
  const uint64_t charged = memory_.bytes(MemoryCategory::WeightsResident);
  upload_experts(c, w, expert_budget > taken ? expert_budget - taken : 0, pool, host_experts,
                 host_threads);
  // The tiled products read the weights with cp.async, from VRAM: streamed experts are staged
  // there first (stage()). Asked here, before any stream capture (shared-memory sizes).
  for (Layer& d : layers_) {
    d.gemm_gate_up = d.mma_gate_up && k::moe_gemm_prepare(d.gate.type);
    d.gemm_down = d.mma_down && k::moe_gemm_prepare(d.down.type);
    d.shared.gemm_gate_up = d.shared.mma_gate_up && k::moe_gemm_prepare(d.shared.gate.type);
    d.shared.gemm_down = d.shared.mma_down && k::moe_gemm_prepare(d.shared.down.type);
  }
  write_tables(stream);
  wait_for_stream(stream, "uploading the expert tables");
  // The weights, routers and the shared experts' ones went up by cudaMemcpy from pageable memory
  // on the legacy stream, which returns once the bytes are staged: their DMA may still run, and
  // nothing orders it before the kernels of `stream` (a non-blocking one). Waited for here.
  wait_for_stream(cudaStreamLegacy, "uploading the experts");
  logger("engine.cuda")
      ->info(
          "CUDA experts: {} layers x {} experts (top {}), {}; {} MiB of expert weights on the "
          "device",
          n_layer_, n_expert_, n_used_,
          all_resident_ ? std::string("all resident")
                        : std::to_string(slots_) + " device slots, the rest in pinned host memory",
          (memory_.bytes(MemoryCategory::WeightsResident) - charged) >> 20);
}

void CudaMoe::upload_routers(const WeightTable& w) {
  // Routers in one buffer (GGUF blocks, each 256-byte aligned), biases as f32 in another.
  uint64_t router_bytes = 0;
  std::vector<uint64_t> router_at;
  size_t floats = 0;
  auto vector_room = [&](const TensorInfo* t) {
    if (!t) return;
    floats += align_up(static_cast<uint64_t>(t->elements()) * sizeof(float)) / sizeof(float);
  };
  // Gemma 4's experts sit beside the dense FFN with their own norms (cuda_gemma4.cpp).
  const bool gemma4 = !w.layers.empty() && w.layers[0].ffn_pre_norm_2;
  for (const LayerWeights& l : w.layers) {
    router_at.push_back(router_bytes);
    router_bytes += align_up(l.router->size_bytes + WeightLayout::kTensorSlackBytes);
    vector_room(l.router_bias);
    vector_room(l.gate_exps_bias);
    vector_room(l.up_exps_bias);
    vector_room(l.down_exps_bias);
    vector_room(l.down_exps_scale);
    if (gemma4)
      for (const TensorInfo* t :
           {l.router_in_scale, l.ffn_pre_norm_2, l.ffn_post_norm_1, l.ffn_post_norm_2})
        vector_room(t);
  }
  routers_ = DeviceBuffer(memory_, MemoryCategory::WeightsResident, router_bytes);
  std::vector<float> vectors(floats, 0.0f);
  size_t next = 0;
  std::vector<std::array<int64_t, 4>> vector_at;
  // `factor`: each value times it (f32), for the router's norm weight.
  auto add_vector = [&](const TensorInfo* t, float factor = 1.0f) -> int64_t {
    if (!t) return -1;
    std::vector<float> v = to_f32(t);
    if (factor != 1.0f)
      for (float& x : v) x = factor * x;
    std::copy(v.begin(), v.end(), vectors.begin() + static_cast<std::ptrdiff_t>(next));
    const auto at = static_cast<int64_t>(next);
    next += align_up(v.size() * sizeof(float)) / sizeof(float);
    return at;
  };
  std::vector<std::array<int64_t, 5>> gemma4_at;
  // The router's input: rms_norm(x) / sqrt(n_embd) · ffn_gate_inp.scale, as one norm weight
  // (the CPU oracle's emulation takes the same product).
  const float inverse_sqrt = 1.0f / std::sqrt(static_cast<float>(n_embd_));
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    check_cuda(cudaMemcpy(routers_.as<uint8_t>() + router_at[i], l.router->data,
                          l.router->size_bytes, cudaMemcpyHostToDevice),
               "uploading routers");
    vector_at.push_back({add_vector(l.router_bias), add_vector(l.gate_exps_bias),
                         add_vector(l.up_exps_bias), add_vector(l.down_exps_bias)});
    if (gemma4)
      gemma4_at.push_back({add_vector(l.router_in_scale, inverse_sqrt),
                           add_vector(l.ffn_pre_norm_2), add_vector(l.ffn_post_norm_1),
                           add_vector(l.ffn_post_norm_2), add_vector(l.down_exps_scale)});
    else
      gemma4_at.push_back({-1, -1, -1, -1, add_vector(l.down_exps_scale)});
  }
  if (floats > 0) {
    vectors_ = DeviceBuffer(memory_, MemoryCategory::WeightsResident, floats * sizeof(float));
    check_cuda(
        cudaMemcpy(vectors_.get(), vectors.data(), floats * sizeof(float), cudaMemcpyHostToDevice),
        "uploading expert biases");
  }
  auto vec = [&](int64_t at) -> const float* {
    return at < 0 ? nullptr : vectors_.as<const float>() + at;
  };
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    Layer& d = layers_[i];
    d.router = routers_.as<uint8_t>() + router_at[i];
    d.router_type = l.router->ggml_type;
    d.router_row_bytes = tensor_row_bytes(l.router);
    d.router_bias = vec(vector_at[i][0]);
    d.expert_scale = vec(gemma4_at[i][4]);
    if (gemma4)
      gemma4_layers_.push_back({.router_norm = vec(gemma4_at[i][0]),
                                .pre_norm = vec(gemma4_at[i][1]),
                                .post_norm_1 = vec(gemma4_at[i][2]),
                                .post_norm_2 = vec(gemma4_at[i][3])});
    d.gate = moe_matrix(l.gate_exps, nullptr, vec(vector_at[i][1]));
    d.up = moe_matrix(l.up_exps, nullptr, vec(vector_at[i][2]));
    d.down = moe_matrix(l.down_exps, nullptr, vec(vector_at[i][3]));
    // Asked here, before any stream capture (the first call queries the device).
    d.mma_gate_up = k::moe_mma_supports(d.gate.type);
    d.mma_down = k::moe_mma_supports(d.down.type);
    const TensorInfo* mats[3] = {l.gate_exps, l.up_exps, l.down_exps};
    for (int m = 0; m < 3; ++m) {
      d.tensor[m] = mats[m];
      d.file_slab[m] = file_slab_bytes(mats[m], n_expert_);
      d.slab[m] = matrix_bytes(mats[m]);
    }
    const uint64_t gate = d.slab[0], up = d.slab[1], down = d.slab[2];
    d.offsets[0] = 0;
    d.offsets[1] = align_up(gate + WeightLayout::kTensorSlackBytes);
    d.offsets[2] = d.offsets[1] + align_up(up + WeightLayout::kTensorSlackBytes);
    stride_.push_back(d.offsets[2] + align_up(down + WeightLayout::kTensorSlackBytes));
    expert_bytes_.push_back(gate + up + down);
  }
}

void CudaMoe::upload_shared(const WeightTable& w, cpu::ThreadPool& pool) {
  // Each layer's gate, up, down and gate row, 256-byte aligned, in one buffer; a table of the
  // three matrices' addresses per layer (the kernels' pointer tables, of one expert).
  uint64_t bytes = 0;
  std::vector<std::array<uint64_t, 4>> at(w.layers.size());
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    if (!l.gate_shexp) continue;
    const TensorInfo* parts[4] = {l.gate_shexp, l.up_shexp, l.down_shexp, l.shexp_gate};
    for (int m = 0; m < 4; ++m) {
      at[i][static_cast<size_t>(m)] = bytes;
      if (parts[m])  // the gate row (m == 3) as stored: the router kernel reads it
        bytes += align_up((m < 3 ? matrix_bytes(parts[m]) : parts[m]->size_bytes) +
                          WeightLayout::kTensorSlackBytes);
    }
  }
  if (bytes == 0) return;
  shared_ = DeviceBuffer(memory_, MemoryCategory::WeightsResident, bytes);
  shared_tables_ =
      DeviceBuffer(memory_, MemoryCategory::WeightsResident, w.layers.size() * 3 * sizeof(void*));
  std::vector<const void*> tables(w.layers.size() * 3, nullptr);
  const auto* table = shared_tables_.as<const void*>();
  std::vector<uint8_t> staging;  // a re-laid matrix on its way to the device
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    if (!l.gate_shexp) continue;
    Layer::Shared& s = layers_[i].shared;
    const TensorInfo* parts[3] = {l.gate_shexp, l.up_shexp, l.down_shexp};
    for (int m = 0; m < 3; ++m) {
      uint8_t* to = shared_.as<uint8_t>() + at[i][static_cast<size_t>(m)];
      upload_matrix(parts[m], parts[m]->data, to, staging, pool, "uploading shared experts");
      tables[i * 3 + static_cast<size_t>(m)] = to;
      s.bytes += matrix_bytes(parts[m]);
    }
    s.n_ff = static_cast<int>(l.gate_shexp->dims[1]);
    s.gate = moe_matrix(l.gate_shexp, table + i * 3, nullptr);
    s.up = moe_matrix(l.up_shexp, table + i * 3 + 1, nullptr);
    s.down = moe_matrix(l.down_shexp, table + i * 3 + 2, nullptr);
    s.mma_gate_up = k::moe_mma_supports(s.gate.type);
    s.mma_down = k::moe_mma_supports(s.down.type);
    if (l.shexp_gate) {  // as stored: the router kernel reads it
      uint8_t* row = shared_.as<uint8_t>() + at[i][3];
      check_cuda(
          cudaMemcpy(row, l.shexp_gate->data, l.shexp_gate->size_bytes, cudaMemcpyHostToDevice),
          "uploading shared experts");
      s.bytes += l.shexp_gate->size_bytes;
      s.gate_row = row;
      s.gate_row_type = l.shexp_gate->ggml_type;
      s.gate_row_bytes = tensor_row_bytes(l.shexp_gate);
    }
    n_ff_shared_ = std::max<int64_t>(n_ff_shared_, s.n_ff);
  }
  check_cuda(cudaMemcpy(shared_tables_.get(), tables.data(), shared_tables_.bytes(),
                        cudaMemcpyHostToDevice),
             "uploading the shared experts' tables");
}

const uint8_t* CudaMoe::host_matrix(int64_t layer, int64_t e, int m) const {
  const Layer& d = layers_[static_cast<size_t>(layer)];
  return static_cast<const uint8_t*>(host_.host) + image_offset(layer, e) + d.offsets[m];
}

const uint8_t* CudaMoe::file_matrix(int64_t layer, int64_t e, int m) const {
  const Layer& d = layers_[static_cast<size_t>(layer)];
  return d.tensor[m]->data + static_cast<uint64_t>(e) * d.file_slab[m];
}

const uint8_t* CudaMoe::host_matrix_device(int64_t layer, int64_t e, int m) const {
  const uint8_t* host = host_matrix(layer, e, m);
  return host_.device + (host - static_cast<const uint8_t*>(host_.host));
}

void CudaMoe::upload_experts(const ModelConfig& c, const WeightTable& w, uint64_t expert_budget,
                             cpu::ThreadPool& pool, int host_experts, int32_t host_threads) {
  uint64_t image = 0;
  for (int64_t l = 0; l < n_layer_; ++l) {
    layer_offset_.push_back(image);
    image += stride_[static_cast<size_t>(l)] * static_cast<uint64_t>(n_expert_);
  }
  slot_bytes_ = *std::max_element(stride_.begin(), stride_.end());
  const size_t n = static_cast<size_t>(n_layer_ * n_expert_);
  resident_.assign(n, 0);
  slot_of_.assign(n, -1);
  all_resident_ = image <= expert_budget;
  if (all_resident_) {
    // The packed image: every expert's gate, up and down at their offsets.
    experts_ = DeviceBuffer(memory_, MemoryCategory::WeightsResident, image);
    std::vector<uint8_t> staging;  // a re-laid matrix on its way to the device
    for (int64_t l = 0; l < n_layer_; ++l) {
      const Layer& d = layers_[static_cast<size_t>(l)];
      for (int64_t e = 0; e < n_expert_; ++e)
        for (int m = 0; m < 3; ++m)
          upload_matrix(d.tensor[m], file_matrix(l, e, m),
                        experts_.as<uint8_t>() + image_offset(l, e) + d.offsets[m], staging, pool,
                        "uploading experts");
    }
    std::fill(resident_.begin(), resident_.end(), uint8_t{1});
    return;
  }
  // Every expert in mapped pinned host memory, read there over PCIe when not cached.
  check_cuda(cudaHostAlloc(&host_.host, image, cudaHostAllocMapped | cudaHostAllocPortable),
             "cudaHostAlloc (experts in host memory)");
  host_.bytes = image;
  void* device = nullptr;
  check_cuda(cudaHostGetDevicePointer(&device, host_.host, 0), "cudaHostGetDevicePointer");
  host_.device = static_cast<const uint8_t*>(device);
  for (int64_t l = 0; l < n_layer_; ++l) {
    const Layer& d = layers_[static_cast<size_t>(l)];
    for (int64_t e = 0; e < n_expert_; ++e)
      for (int m = 0; m < 3; ++m)
        write_matrix_rows(d.tensor[m], file_matrix(l, e, m),
                          static_cast<uint8_t*>(host_.host) + image_offset(l, e) + d.offsets[m],
                          pool);
  }
  // The staging area and the host compute's device buffers come out of the cache's budget.
  const uint64_t staging = allocate_staging() + setup_host(c, w, host_experts, host_threads);
  slots_ = static_cast<int64_t>(
      std::min<uint64_t>((expert_budget - std::min(expert_budget, staging)) / slot_bytes_, n));
  slot_owner_.assign(static_cast<size_t>(slots_), -1);
  // The cache in chunks, so that release_cache() can give memory back a chunk at a time.
  slots_per_chunk_ = std::max<int64_t>(1, static_cast<int64_t>(kCacheChunkBytes / slot_bytes_));
  for (int64_t first_slot = 0; first_slot < slots_; first_slot += slots_per_chunk_)
    cache_chunks_.emplace_back(
        memory_, MemoryCategory::WeightsResident,
        static_cast<size_t>(std::min(slots_per_chunk_, slots_ - first_slot)) * slot_bytes_);
  // The cache filled by the default placement (the constructor waits for the legacy stream).
  const std::vector<uint8_t> first = default_placement();
  for (size_t i = 0, s = 0; i < n; ++i)
    if (first[i]) cache_expert(i, static_cast<int64_t>(s++), cudaStreamLegacy);
}

void CudaMoe::cache_expert(size_t i, int64_t slot, cudaStream_t stream) {
  const int64_t l = static_cast<int64_t>(i) / n_expert_, e = static_cast<int64_t>(i) % n_expert_;
  const Layer& d = layers_[static_cast<size_t>(l)];
  for (int m = 0; m < 3; ++m)
    check_cuda(cudaMemcpyAsync(slot_address(slot) + d.offsets[m], host_matrix(l, e, m), d.slab[m],
                               cudaMemcpyHostToDevice, stream),
               "copying an expert into the device cache");
  slot_owner_[static_cast<size_t>(slot)] = static_cast<int64_t>(i);
  slot_of_[i] = slot;
  resident_[i] = 1;
}

std::vector<uint8_t> CudaMoe::default_placement() const {
  const size_t n = static_cast<size_t>(n_layer_ * n_expert_);
  std::vector<uint8_t> out(n, 0);
  if (all_resident_) {
    std::fill(out.begin(), out.end(), uint8_t{1});
    return out;
  }
  // slots_ over the layers: each gets slots_ / n_layer, the first slots_ % n_layer one more.
  for (int64_t l = 0; l < n_layer_; ++l) {
    const int64_t take = slots_ / n_layer_ + (l < slots_ % n_layer_ ? 1 : 0);
    for (int64_t e = 0; e < std::min(take, n_expert_); ++e)
      out[static_cast<size_t>(l * n_expert_ + e)] = 1;
  }
  return out;
}

void CudaMoe::write_tables(cudaStream_t stream) {
  // The pinned mirror is rewritten only once its last copy ran (apply() synchronises first).
  auto* host = tables_host_.as<const void*>();
  auto* device = tables_.as<const void*>();
  for (int64_t l = 0; l < n_layer_; ++l) {
    Layer& d = layers_[static_cast<size_t>(l)];
    for (int m = 0; m < 3; ++m) {
      const size_t row = static_cast<size_t>((l * 3 + m) * n_expert_);
      for (int64_t e = 0; e < n_expert_; ++e) {
        const size_t i = static_cast<size_t>(l * n_expert_ + e);
        const uint8_t* base;
        if (all_resident_)
          base = experts_.as<uint8_t>() + image_offset(l, e);
        else if (slot_of_[i] >= 0)
          base = slot_address(slot_of_[i]);
        else
          base = host_matrix_device(l, e, m) - d.offsets[m];
        host[row + static_cast<size_t>(e)] = base + d.offsets[m];
      }
      k::MoeMatrix& mat = m == 0 ? d.gate : m == 1 ? d.up : d.down;
      mat.table = device + row;
    }
  }
  check_cuda(cudaMemcpyAsync(tables_.get(), tables_host_.as<uint8_t>(), tables_.bytes(),
                             cudaMemcpyHostToDevice, stream),
             "uploading the expert tables");
}

int CudaMoe::apply(const std::vector<uint8_t>& resident, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(n_layer_ * n_expert_);
  if (resident.size() != n)
    throw UsageError("expert placement of " + std::to_string(resident.size()) +
                     " entries for a model of " + std::to_string(n) + " experts");
  if (all_resident_) {
    if (std::any_of(resident.begin(), resident.end(), [](uint8_t r) { return r == 0; }))
      throw UsageError("every expert is resident: a placement cannot move any to host memory");
    return 0;
  }
  const auto wanted = static_cast<int64_t>(
      std::count_if(resident.begin(), resident.end(), [](uint8_t r) { return r != 0; }));
  if (wanted > slots_)
    throw UsageError("expert placement of " + std::to_string(wanted) + " resident experts for " +
                     std::to_string(slots_) + " device slots");
  // The table mirror's last copy has run once the stream is idle.
  wait_for_stream(stream, "the steps before an expert placement change");
  for (size_t i = 0; i < n; ++i)
    if (!resident[i] && slot_of_[i] >= 0) {
      slot_owner_[static_cast<size_t>(slot_of_[i])] = -1;
      slot_of_[i] = -1;
      resident_[i] = 0;
      ++demotions_;
    }
  int copied = 0;
  size_t free_slot = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!resident[i] || slot_of_[i] >= 0) continue;
    while (slot_owner_[free_slot] >= 0) ++free_slot;  // one exists: wanted <= slots_
    // Queued behind every step already on the stream, so no kernel still reads the slot's
    // previous expert when it is overwritten.
    cache_expert(i, static_cast<int64_t>(free_slot), stream);
    ++copied;
  }
  promotions_ += static_cast<uint64_t>(copied);
  write_tables(stream);
  return copied;
}

void CudaMoe::collect(MoeStats& out, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(n_layer_ * n_expert_);
  if (out.routed.size() != n) {
    out.n_layer = static_cast<int32_t>(n_layer_);
    out.n_expert = static_cast<int32_t>(n_expert_);
    out.routed.assign(n, 0);
    out.streamed.assign(n, 0);
  }
  // Into pinned memory (a copy into pageable memory would block the host until the stream
  // reaches it, unbounded), then a bounded wait.
  check_cuda(cudaMemcpyAsync(counts_pinned_.as<int32_t>(), counts_.get(), counts_.bytes(),
                             cudaMemcpyDeviceToHost, stream),
             "downloading routing counts");
  check_cuda(cudaMemsetAsync(counts_.get(), 0, counts_.bytes(), stream), "cudaMemsetAsync");
  queue_staged_bytes(stream);
  wait_for_stream(stream, "the steps before reading the routing counts");
  out.bytes_streamed += staged_bytes();
  std::memcpy(counts_host_.data(), counts_pinned_.as<int32_t>(), counts_.bytes());
  out.resident = resident_;
  uint64_t choices = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<uint32_t>(counts_host_[i]);
    out.routed[i] += c;
    choices += c;
    if (resident_[i]) {
      out.hits += c;
    } else {
      out.streamed[i] += c;
      out.misses += c;
    }
  }
  out.tokens += choices / static_cast<uint64_t>(n_used_ * n_layer_);
  collect_host(out);
}

uint64_t CudaMoe::expert_image_bytes() const {
  return layer_offset_.empty()
             ? 0
             : layer_offset_.back() + stride_.back() * static_cast<uint64_t>(n_expert_);
}

uint64_t CudaMoe::max_expert_bytes() const {
  return *std::max_element(expert_bytes_.begin(), expert_bytes_.end());
}

uint64_t CudaMoe::row_read_bytes() const {
  uint64_t bytes = 0;
  for (int64_t l = 0; l < n_layer_; ++l) {
    const Layer& d = layers_[static_cast<size_t>(l)];
    bytes += static_cast<uint64_t>(d.router_row_bytes * n_expert_) +
             static_cast<uint64_t>(n_used_) * expert_bytes_[static_cast<size_t>(l)] +
             d.shared.bytes;
  }
  return bytes;
}

uint64_t CudaMoe::device_weight_bytes() const {
  uint64_t cache = 0;
  for (const DeviceBuffer& chunk : cache_chunks_) cache += chunk.bytes();
  return routers_.bytes() + vectors_.bytes() + shared_.bytes() + shared_tables_.bytes() +
         experts_.bytes() + cache;
}

uint8_t* CudaMoe::slot_address(int64_t slot) {
  DeviceBuffer& chunk = cache_chunks_[static_cast<size_t>(slot / slots_per_chunk_)];
  return chunk.as<uint8_t>() + static_cast<uint64_t>(slot % slots_per_chunk_) * slot_bytes_;
}

uint64_t CudaMoe::release_cache(uint64_t bytes, cudaStream_t stream) {
  if (all_resident_ || cache_chunks_.empty() || bytes == 0) return 0;
  // No step still reads a slot of the chunks about to go once the stream is idle.
  wait_for_stream(stream, "the steps before the expert cache shrinks");
  uint64_t freed = 0;
  while (freed < bytes && !cache_chunks_.empty()) {
    const int64_t first_slot = static_cast<int64_t>(cache_chunks_.size() - 1) * slots_per_chunk_;
    for (int64_t s = first_slot; s < slots_; ++s) {
      const int64_t owner = slot_owner_[static_cast<size_t>(s)];
      if (owner < 0) continue;
      slot_of_[static_cast<size_t>(owner)] = -1;
      resident_[static_cast<size_t>(owner)] = 0;
      ++demotions_;
    }
    freed += cache_chunks_.back().bytes();
    cache_chunks_.pop_back();
    slots_ = first_slot;
    slot_owner_.resize(static_cast<size_t>(slots_));
  }
  write_tables(stream);
  wait_for_stream(stream, "uploading the expert tables");
  logger("engine.cuda")
      ->info("expert cache: {} MiB given back for the KV, {} device slots left", freed >> 20,
             slots_);
  return freed;
}

void CudaMoe::forward(int layer, int n_rows, const float* x_f32, k::ActivationQ8 xq,
                      const int32_t* slots, float* hidden, const k::KernelConfig& config,
                      cudaStream_t stream, uint64_t* launches, const float* router_x) {
  if (n_rows <= 0) return;
  if (n_rows > max_rows_) throw UsageError("CUDA experts: a run exceeds the workspace");
  const Layer& d = layers_[static_cast<size_t>(layer)];
  const LaunchCheck check{launches};
  const int n_embd = static_cast<int>(n_embd_);
  // Router logits, gating and top-k: one launch (the top-k of each group of 8 rows by the
  // group's last router block).
  auto route = [&](uint32_t type, const void* router, int64_t row_bytes, const float* bias,
                   const k::MoeRouting& routing, float* logits, int32_t* ids, float* weights,
                   int32_t* counts, const int32_t* row_slots, const float* x) {
    check(k::launch_moe_route(type, router, row_bytes, n_embd, x, n_rows, bias, routing, logits,
                              ids, weights, counts, row_slots, route_counter_.as<unsigned int>(),
                              config, stream),
          "moe_route");
  };
  k::MoeRouting routing = routing_;
  routing.expert_scale = d.expert_scale;
  route(d.router_type, d.router, d.router_row_bytes, d.router_bias, routing, logits_.as<float>(),
        ids_.as<int32_t>(), weights_.as<float>(), counts_.as<int32_t>() + layer * n_expert_, slots,
        router_x ? router_x : x_f32);
  ExpertRun routed;
  routed.gate = d.gate;
  routed.up = d.up;
  routed.down = d.down;
  routed.mma_gate_up = d.mma_gate_up;
  routed.mma_down = d.mma_down;
  routed.gemm_gate_up = d.gemm_gate_up;
  routed.gemm_down = d.gemm_down;
  routed.n_ff = static_cast<int>(n_ff_);
  routed.n_expert = static_cast<int>(n_expert_);
  routed.n_used = static_cast<int>(n_used_);
  routed.activation = activation_;
  routed.ids = ids_.as<int32_t>();
  routed.weights = weights_.as<float>();
  routed.h = h_.as<float>();
  routed.hq = {hq_qs_.as<int8_t>(), hq_ds_.as<float2>()};
  // Streamed experts into VRAM, and the host's share of them forked off (cuda_moe_host.cpp).
  stage(layer, n_rows, x_f32, routed, config, stream, launches);
  run_experts(routed, n_rows, x_f32, xq, hidden, config, stream, launches);
  if (host_runs(n_rows)) host_join(n_rows, hidden, config, stream, launches);
  if (d.shared.n_ff == 0) return;

  // The shared expert: expert 0 of a one-expert table for every row, weighted by 1 or by
  // sigmoid(gate · x) (its gate as a one-expert sigmoid router: the same f32 dot as the CPU's,
  // within its rounding), added into the residual after the routed experts.
  ExpertRun shared;
  shared.gate = d.shared.gate;
  shared.up = d.shared.up;
  shared.down = d.shared.down;
  shared.mma_gate_up = d.shared.mma_gate_up;
  shared.mma_down = d.shared.mma_down;
  shared.gemm_gate_up = tiled_shared_ && d.shared.gemm_gate_up;
  shared.gemm_down = tiled_shared_ && d.shared.gemm_down;
  shared.n_ff = d.shared.n_ff;
  shared.n_expert = 1;
  shared.n_used = 1;
  shared.activation = k::MoeActivation::Swiglu;
  shared.ids = shared_ids_.as<int32_t>();
  shared.weights = shared_ones_.as<float>();
  shared.h = shared_h_.as<float>();
  shared.hq = {shared_hq_qs_.as<int8_t>(), shared_hq_ds_.as<float2>()};
  if (d.shared.gate_row) {
    const k::MoeRouting gate{.n_expert = 1,
                             .n_used = 1,
                             .gating = k::MoeGating::Sigmoid,
                             .normalize = false,
                             .scale = 1.0f};
    route(d.shared.gate_row_type, d.shared.gate_row, d.shared.gate_row_bytes, nullptr, gate,
          shared_logits_.as<float>(), shared_ids_.as<int32_t>(), shared_weights_.as<float>(),
          nullptr, nullptr, x_f32);
    shared.weights = shared_weights_.as<float>();
  }
  run_experts(shared, n_rows, x_f32, xq, hidden, config, stream, launches);
}

void CudaMoe::run_experts(const ExpertRun& e, int n_rows, const float* x_f32, k::ActivationQ8 xq,
                          float* hidden, const k::KernelConfig& config, cudaStream_t stream,
                          uint64_t* launches) {
  const LaunchCheck check{launches};
  const int n_embd = static_cast<int>(n_embd_), n_ff = e.n_ff;
  const int pairs = n_rows * e.n_used;
  k::MoeInput in;
  in.n_in = n_embd;
  in.pairs = pairs;
  in.n_used = e.n_used;
  in.n_expert = e.n_expert;
  in.x = x_f32;
  in.xq = xq;
  in.ids = e.ids;
  const bool q8_gate_up = k::moe_reads_q8(e.gate.type), q8_down = k::moe_reads_q8(e.down.type);
  k::MoeInput down = in;
  down.n_in = n_ff;
  down.x = e.h;
  down.xq = e.hq;
  if (n_rows <= kPerPairMaxRows) {
    // Small runs: per pair, quantised experts on the warp-per-row kernels, whose gate/up also
    // writes h's int8 blocks for down.
    if (q8_gate_up && n_ff % k::kQ8Block == 0) {  // (a quantised down needs n_ff in blocks)
      check(k::launch_moe_gate_up_decode(e.gate, e.up, e.activation, n_ff, in, e.h,
                                         q8_down ? e.hq : k::ActivationQ8{}, config, stream),
            "moe_gate_up_decode");
    } else {
      check(k::launch_moe_gate_up(e.gate, e.up, e.activation, n_ff, in, e.h, config, stream),
            "moe_gate_up");
      if (q8_down)
        check(k::launch_quantize_q8(e.h, pairs, n_ff, e.hq, config, stream), "quantize_q8");
    }
    if (q8_down)
      check(k::launch_moe_down_combine_decode(e.down, n_embd, down, e.weights, hidden, config,
                                              stream),
            "moe_down_combine_decode");
    else
      check(k::launch_moe_down_combine(e.down, n_embd, down, e.weights, hidden, config, stream),
            "moe_down_combine");
    return;
  }
  const bool mma_gate_up = n_rows >= kMmaMinRows && e.mma_gate_up;
  const bool mma_down = n_rows >= kMmaMinRows && e.mma_down;
  const bool gemm_gate_up = mma_gate_up && e.gemm_gate_up, gemm_down = mma_down && e.gemm_down;
  // One grouping serves both products: the tiled kernels' tile where both take them, else one
  // that every kernel of the pair reads.
  const int tile_pairs = gemm_gate_up && gemm_down ? gemm_tile_pairs(pairs, e.n_expert)
                         : mma_gate_up || mma_down ? mma_tile_pairs(pairs, e.n_expert)
                                                   : k::kMoeTilePairs;
  in.groups = {order_.as<int32_t>(), tiles_.as<k::MoeTile>(), n_tiles_.as<int32_t>(), tile_pairs};
  down.groups = in.groups;
  check(k::launch_moe_group(e.ids, pairs, e.n_expert, in.groups, config, stream), "moe_group");
  if (gemm_gate_up)  // h's int8 blocks for down in the same launch
    check(k::launch_moe_gate_up_gemm(e.gate, e.up, e.activation, n_ff, in, e.h,
                                     q8_down ? e.hq : k::ActivationQ8{}, config, stream),
          "moe_gate_up_gemm");
  else if (mma_gate_up)
    check(k::launch_moe_gate_up_mma(e.gate, e.up, e.activation, n_ff, in, e.h, config, stream),
          "moe_gate_up_mma");
  else
    check(k::launch_moe_gate_up(e.gate, e.up, e.activation, n_ff, in, e.h, config, stream),
          "moe_gate_up");
  if (q8_down && !gemm_gate_up)
    check(k::launch_quantize_q8(e.h, pairs, n_ff, e.hq, config, stream), "quantize_q8");
  if (gemm_down)
    check(k::launch_moe_down_gemm(e.down, n_embd, down, y_.as<float>(), config, stream),
          "moe_down_gemm");
  else if (mma_down)
    check(k::launch_moe_down_mma(e.down, n_embd, down, y_.as<float>(), config, stream),
          "moe_down_mma");
  else
    check(k::launch_moe_down(e.down, n_embd, down, y_.as<float>(), config, stream), "moe_down");
  check(k::launch_moe_combine(y_.as<float>(), e.weights, n_rows, e.n_used, n_embd, hidden, config,
                              stream),
        "moe_combine");
}

}  // namespace granule::cuda
