// Engine::estimate: what opening a model would need, from the file alone — the weights, the
// KV per token in the element type of the backend the options pick (f32 on the CPU, f16 on
// CUDA), a workspace allowance — against the budget that backend would set.
#include "runtime/fit_estimate.h"

#include <algorithm>
#include <limits>
#include <map>

#include "backends/backend.h"
#include "backends/cpu/fast_matmul.h"
#include "backends/cpu/host_experts.h"
#include "backends/kernel_config_env.h"
#include "granule/engine.h"
#include "granule/error.h"
#include "granule/gguf.h"
#include "granule/tensor_type.h"
#include "memory/expert_placement.h"
#include "memory/host_expert_share.h"
#include "memory/host_row_split.h"
#include "memory/kv_space.h"
#include "memory/placement.h"
#include "memory/weight_layout.h"
#include "memory/workspace_layout.h"

namespace granule {
namespace {

// What a window part commits past its window (KvSpace::map): the granule its start falls in (2
// MiB on both backends) and the look-ahead's tokens.
uint64_t window_slack_bytes(uint64_t window_bytes_per_token) {
  return (2u << 20) + static_cast<uint64_t>(KvGeometry{}.lookahead_tokens) * window_bytes_per_token;
}

// The block type holding the most bytes among 2-D weights: what people call the model's
// quantisation ("Q4_1"), even though norms stay F32.
std::string dominant_block_type(const ModelFile& file) {
  std::map<uint32_t, uint64_t> bytes_by_type;
  for (const TensorInfo& tensor : file.tensors())
    if (tensor.dims.size() >= 2) bytes_by_type[tensor.ggml_type] += tensor.size_bytes;
  if (bytes_by_type.empty()) return "unknown";
  const auto top =
      std::max_element(bytes_by_type.begin(), bytes_by_type.end(),
                       [](const auto& a, const auto& b) { return a.second < b.second; });
  return tensor_type_name(top->first);
}

// Beside weights and KV: the logits of every slot (f32 per vocabulary entry) and a fixed
// allowance for activations and the backend's other scratch.
uint64_t workspace_allowance(const ModelConfig& config, int32_t slots) {
  constexpr uint64_t kScratchBytes = 64ull << 20;
  return static_cast<uint64_t>(std::max<int64_t>(config.n_vocab, 0)) * sizeof(float) *
             static_cast<uint64_t>(slots) +
         kScratchBytes;
}

// The backend the options pick, as far as the estimate needs it.
struct DeviceChoice {
  bool gpu = false;
  std::string name;
  int64_t kv_element_bytes = 0;
  uint64_t default_budget_bytes = 0;  // 0: unknown
  double h2d_bytes_per_second = 0;    // 0: not measured
};

DeviceChoice cpu_choice() { return {false, "CPU", kCpuKvElementBytes, host_memory_bytes(), 0}; }

// PCIe 4.0 x16 as it carries pinned copies in practice: the bound's assumption when no GPU
// was there to measure.
constexpr double kAssumedH2dBytesPerSecond = 25e9;

DeviceChoice choose_device(const EngineOptions& options) {
  if (options.device == DeviceKind::Cpu) return cpu_choice();
  const bool budget_given = options.vram_budget_bytes > 0;
#ifdef GRANULE_HAVE_CUDA
  try {
    const CudaDeviceInfo gpu = probe_cuda_device();
    return {true, "CUDA " + gpu.name, kCudaKvElementBytes, gpu.default_budget_bytes,
            gpu.h2d_bytes_per_second};
  } catch (const DeviceError&) {
    if (options.device == DeviceKind::Auto) return cpu_choice();
    if (!budget_given) throw;
  }
#else
  if (options.device == DeviceKind::Auto) return cpu_choice();
  if (!budget_given)
    throw UnsupportedError(
        "this build of Granule has no CUDA backend; choose the CPU device, or give a VRAM "
        "budget to estimate for a GPU");
#endif
  return {true, "CUDA", kCudaKvElementBytes, 0, 0};
}

}  // namespace

void estimate_mixture_of_experts(FitEstimate& e, const WeightTable& weights,
                                 int host_expert_setting) {
  const ModelConfig& c = e.config;
  const ExpertFootprint footprint = expert_footprint(c, weights);
  ExpertFitEstimate& x = e.experts;
  x = ExpertFitEstimate{};
  x.n_expert = c.moe.n_expert;
  x.n_expert_used = c.moe.n_expert_used;
  x.always_resident_bytes = footprint.always_resident_bytes;
  x.expert_bytes = footprint.expert_bytes;
  x.experts_bytes = footprint.experts_bytes;
  const auto n_layer = static_cast<int32_t>(weights.layers.size());
  e.weights_bytes = footprint.total();
  e.resident_layers = n_layer;  // attention and routers of every layer stay resident
  e.streamed_layers = 0;
  e.layer_streamed.assign(static_cast<size_t>(n_layer), false);
  e.streamed_bytes_per_pass = 0;
  e.staging_bytes = 0;

  ExpertPlacementInput in;
  in.n_layer = n_layer;
  in.n_expert = c.moe.n_expert;
  in.expert_bytes = footprint.expert_bytes;
  uint64_t fixed = e.weights_bytes;  // the CPU holds every weight
  uint64_t streaming_staging = 0;
  if (e.gpu) {
    e.kv_reserve_bytes =
        e.kv_bytes_per_token * static_cast<uint64_t>(default_kv_reserve_tokens(e.context_per_chat));
    fixed = footprint.always_resident_bytes;
    // The experts take what the rest leaves (CudaModel's keep: the KV reserve, the attention
    // scratch in the workspace, the recurrent state slots of a hybrid).
    const uint64_t needed =
        fixed + e.workspace_bytes + e.kv_reserve_bytes + e.recurrent_state_bytes();
    in.budget_bytes = e.budget_bytes > needed ? e.budget_bytes - needed : 0;
    // Where experts stream, the step's missed experts are staged in VRAM first (CudaMoe:
    // min(n_expert, rows x n_used) slots, n_expert at a prefill chunk's rows), out of the
    // cache's budget; a streaming load needs it (the minimum budget).
    streaming_staging = static_cast<uint64_t>(c.moe.n_expert) * footprint.expert_bytes;
    if (in.budget_bytes < footprint.experts_bytes) {
      e.staging_bytes = streaming_staging;
      in.budget_bytes -= std::min(in.budget_bytes, e.staging_bytes);
    }
  } else {
    in.budget_bytes = footprint.experts_bytes;
    in.expert_bytes = 0;  // every expert in host memory, where the CPU computes
    // The CPU backend's own choice (cpu::plan_copies): int8 copies of the experts the int8
    // kernels run, while they fit what the memory available leaves.
    const cpu::CopyPlan copies =
        cpu::plan_copies(weights, e.host_available_bytes, e.host_total_bytes);
    x.cpu_copy_budget_bytes = copies.expert_budget;
    x.cpu_int8_experts = !copies.experts.empty() && copies.experts_fit();
  }
  const ExpertPlacement plan = plan_expert_placement(in, nullptr);
  // Where experts stream, the host's CPU computes part of a decode run's missed experts from its
  // own int8 copies (CudaMoe::setup_host: where the int8 kernels run the experts and their copies
  // fit the memory available), batch 1's share by host_expert_share_at.
  const int batch1_share = host_expert_share_at(host_expert_setting, 1);
  if (e.gpu && plan.resident_count() < static_cast<int64_t>(n_layer) * c.moe.n_expert &&
      batch1_share > 0 &&
      cpu::HostExperts::streamed_fit(c, weights, e.host_available_bytes, e.host_total_bytes)
          .reason.empty())
    x.host_share = batch1_share;
  x.resident_experts = plan.resident_count();
  x.expert_budget_bytes = e.gpu ? in.budget_bytes : 0;
  uint64_t resident_expert_bytes = 0;
  const double k = static_cast<double>(c.moe.n_expert_used);
  for (int32_t l = 0; l < n_layer; ++l) {
    const int64_t resident = plan.resident_in_layer(l);
    const uint64_t bytes = footprint.layer_expert_bytes[static_cast<size_t>(l)];
    x.resident_per_layer.push_back(static_cast<int32_t>(resident));
    resident_expert_bytes += static_cast<uint64_t>(resident) * bytes;
    if (e.gpu) {
      const double in_host =
          1.0 - static_cast<double>(resident) / static_cast<double>(c.moe.n_expert);
      x.missed_bytes_per_token += k * in_host * static_cast<double>(bytes);
    }
  }
  x.pcie_bytes_per_token = x.missed_bytes_per_token * (1.0 - x.host_share / 256.0);
  if (x.pcie_bytes_per_token > 0 && e.h2d_bytes_per_second > 0)
    x.pcie_tokens_per_second = e.h2d_bytes_per_second / x.pcie_bytes_per_token;
  e.pcie_tokens_per_second = x.pcie_tokens_per_second;

  e.resident_weight_bytes = fixed + (e.gpu ? resident_expert_bytes : 0);
  // Recurrent layers (qwen35moe): a state slot per chat, allocated with the KV space.
  const uint64_t states = e.recurrent_state_bytes();
  e.minimum_budget_bytes =
      fixed + e.workspace_bytes + e.kv_reserve_bytes + states + streaming_staging;
  e.loads = e.budget_bytes >= e.minimum_budget_bytes;
  const uint64_t held = e.resident_weight_bytes + e.staging_bytes + e.workspace_bytes + states;
  e.kv_capacity_tokens = 0;
  e.max_context_per_chat = 0;
  if (e.budget_bytes > held && e.kv_bytes_per_token > 0) {
    const int32_t chats = std::max(e.chats, 1);
    if (e.kv_window_tokens <= 0) {
      e.kv_capacity_tokens = static_cast<int64_t>((e.budget_bytes - held) / e.kv_bytes_per_token);
      e.max_context_per_chat = std::min(e.kv_capacity_tokens / chats, c.context_length);
    } else {  // each chat's window layers' KV is bounded: the chats' shares of the rest
      const int64_t per_chat =
          e.kv_context_for((e.budget_bytes - held) / static_cast<uint64_t>(chats));
      e.kv_capacity_tokens = per_chat * chats;
      e.max_context_per_chat = std::min(per_chat, c.context_length);
    }
  }
  e.fits = e.loads && e.context_per_chat > 0 && e.max_context_per_chat >= e.context_per_chat;
}

FitEstimate Engine::estimate(const std::filesystem::path& model_path,
                             const EngineOptions& options) {
  if (options.max_sequences <= 0) throw UsageError("max_sequences must be at least 1");
  return estimate(*ModelFile::open(model_path), options);
}

FitEstimate Engine::estimate(const ModelFile& model_file, const EngineOptions& options) {
  if (options.max_sequences <= 0) throw UsageError("max_sequences must be at least 1");
  const ModelFile* file = &model_file;
  FitEstimate e;
  e.config = ModelConfig::from_gguf(*file);
  const WeightTable weights = WeightTable::from_gguf(*file, e.config);
  e.block_type = dominant_block_type(*file);
  e.file_bytes = file->file_size();
  for (const TensorInfo& tensor : file->tensors())
    e.parameters += static_cast<uint64_t>(tensor.elements());

  DeviceChoice device = choose_device(options);
#ifdef GRANULE_HAVE_CUDA
  // Auto runs on the CPU where the CUDA backend refuses the model (Engine::open's fallback).
  if (device.gpu && options.device == DeviceKind::Auto &&
      !cuda_model_refusal(e.config, weights).empty())
    device = cpu_choice();
#endif
  e.gpu = device.gpu;
  e.device = device.name;
  e.host_available_bytes = cpu::memory_available_bytes();
  e.host_total_bytes = cpu::physical_memory_bytes();
  e.kv_element_bytes = device.kv_element_bytes;
  e.weights_bytes = weights.total_bytes();
  e.kv_bytes_per_token = static_cast<uint64_t>(e.config.kv_bytes_per_token(e.kv_element_bytes));
  // KV by layer kind (memory/kv_space.h): the sliding layers' KV is bounded by the window.
  for (const KvPartGeometry& part : kv_parts(e.config, e.kv_element_bytes)) {
    if (part.window_tokens <= 0) continue;
    e.kv_window_bytes_per_token = static_cast<uint64_t>(part.bytes_per_token);
    e.kv_window_tokens = part.window_tokens;
  }
  e.chats = options.max_sequences;
  e.workspace_bytes = workspace_allowance(e.config, e.chats);
  e.recurrent_state_bytes_per_chat = static_cast<uint64_t>(e.config.recurrent_state_bytes());
  e.budget_bytes =
      options.vram_budget_bytes ? options.vram_budget_bytes : device.default_budget_bytes;

  const int64_t trained = e.config.context_length;
  e.context_per_chat = options.context_length <= 0 || options.context_length > trained
                           ? trained
                           : options.context_length;
  e.h2d_measured = e.gpu && device.h2d_bytes_per_second > 0;
  e.h2d_bytes_per_second = !e.gpu           ? 0
                           : e.h2d_measured ? device.h2d_bytes_per_second
                                            : kAssumedH2dBytesPerSecond;
  if (e.config.is_moe()) {
    estimate_mixture_of_experts(e, weights, options.host_expert_share);
    return e;
  }
  const auto n_layer = static_cast<int32_t>(weights.layers.size());
  // The CPU holds every weight; the recurrent state slots are allocated with the KV space.
  uint64_t held = e.weights_bytes + e.workspace_bytes + e.recurrent_state_bytes();
  e.resident_layers = n_layer;
  e.layer_streamed.assign(static_cast<size_t>(n_layer), false);
  e.resident_weight_bytes = e.weights_bytes;
  e.loads = e.budget_bytes >= held;
  e.minimum_budget_bytes = held;
  if (e.gpu) {
    // The CUDA backend's plan (CudaModel makes the same one at load) from the same weight
    // layout and workspace list, with the prefill overlap's scratch where the model takes it.
    const int64_t rows = options.prefill_chunk_tokens > 0 ? options.prefill_chunk_tokens : 512;
    const kernels::KernelConfig kernels = kernel_config_from_environment();
    const WeightLayout layout = weight_layout(e.config, weights, kernels.split_weights);
    const CudaWorkspace workspace =
        cuda_workspace(e.config, layout, rows, e.context_per_chat, e.chats);
    PlacementInput in;
    in.budget_bytes = e.budget_bytes;
    in.weights = layout.sizes();
    // The recurrent state slots (Qwen3.5) are held beside the workspace, as CudaModel's plan
    // counts them.
    const uint64_t states = e.recurrent_state_bytes();
    in.workspace_bytes = workspace.total() + states;
    in.kv_reserve_bytes =
        e.kv_bytes_per_token * static_cast<uint64_t>(default_kv_reserve_tokens(e.context_per_chat));
    // The plan and its minimum without the prefill overlap's second f16 scratch; the model
    // takes that scratch only where it keeps the same layers resident.
    const PlacementPlan plan = plan_placement(in);
    if (workspace.overlap_bytes > 0 && overlap_scratch_fits(in, workspace.overlap_bytes))
      in.workspace_bytes += workspace.overlap_bytes;
    e.workspace_bytes = in.workspace_bytes - states;
    e.loads = plan.loads;
    e.minimum_budget_bytes = plan.minimum_budget_bytes;
    e.resident_layers = plan.resident_layers;
    e.streamed_layers = plan.streamed_layers;
    e.layer_streamed = plan.layer_streamed;
    e.resident_weight_bytes = plan.resident_weight_bytes;
    e.streamed_bytes_per_pass = plan.streamed_bytes_per_pass;
    e.staging_bytes = plan.staging_bytes;
    e.kv_reserve_bytes = in.kv_reserve_bytes;
    e.host_pinned_bytes = layout.per_layer_table_bytes;
    if (plan.streamed_bytes_per_pass > 0)
      e.pcie_tokens_per_second =
          e.h2d_bytes_per_second / static_cast<double>(plan.streamed_bytes_per_pass);
    // Where the CUDA backend's HostRows would split the streamed layers (it also needs a
    // matrix the host's int8 kernels run).
    if (plan.streamed_layers > 0 && options.host_row_share != 0 &&
        host_rows_refusal(e.config, weights).empty()) {
      for (size_t i = 0; i < weights.layers.size() && !e.host_rows; ++i)
        for (int m = 0; m < kDenseMatrices && !e.host_rows; ++m) {
          const TensorInfo* t = dense_matrix(weights.layers[i], m);
          e.host_rows =
              cpu::Int8Weights::supports(static_cast<TensorType>(t->ggml_type), t->dims[0]);
        }
    }
    held = plan.device_bytes() + e.workspace_bytes + states;
  }
  if (e.budget_bytes > held && e.kv_bytes_per_token > 0) {
    const int32_t chats = std::max(e.chats, 1);
    if (e.kv_window_tokens <= 0) {
      e.kv_capacity_tokens = static_cast<int64_t>((e.budget_bytes - held) / e.kv_bytes_per_token);
      e.max_context_per_chat = std::min(e.kv_capacity_tokens / chats, trained);
    } else {  // each chat's window layers' KV is bounded: the chats' shares of the rest
      const int64_t per_chat =
          e.kv_context_for((e.budget_bytes - held) / static_cast<uint64_t>(chats));
      e.kv_capacity_tokens = per_chat * chats;
      e.max_context_per_chat = std::min(per_chat, trained);
    }
  }
  e.fits = e.loads && e.context_per_chat > 0 && e.max_context_per_chat >= e.context_per_chat;
  return e;
}

uint64_t FitEstimate::kv_bytes_per_chat(int64_t context) const {
  const auto tokens = static_cast<uint64_t>(std::max<int64_t>(context, 0));
  if (kv_window_tokens <= 0 || context <= kv_window_tokens) return tokens * kv_bytes_per_token;
  const uint64_t global = kv_bytes_per_token - kv_window_bytes_per_token;
  return tokens * global + static_cast<uint64_t>(kv_window_tokens) * kv_window_bytes_per_token +
         window_slack_bytes(kv_window_bytes_per_token);
}

int64_t FitEstimate::kv_context_for(uint64_t bytes) const {
  if (kv_bytes_per_token == 0) return 0;
  const uint64_t whole = bytes / kv_bytes_per_token;  // every layer's KV per token
  if (kv_window_tokens <= 0 || whole <= static_cast<uint64_t>(kv_window_tokens))
    return static_cast<int64_t>(whole);
  const uint64_t global = kv_bytes_per_token - kv_window_bytes_per_token;
  const uint64_t window = static_cast<uint64_t>(kv_window_tokens) * kv_window_bytes_per_token +
                          window_slack_bytes(kv_window_bytes_per_token);
  if (bytes < window) return kv_window_tokens;
  if (global == 0) return std::numeric_limits<int32_t>::max();  // only sliding layers
  return std::max<int64_t>(kv_window_tokens, static_cast<int64_t>((bytes - window) / global));
}

}  // namespace granule
