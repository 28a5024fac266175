// The placement plan: which layers' weights stay in device memory and which are streamed
// from pinned host memory, for a budget. Arithmetic only (no device), so the fit preview,
// `granule-cli fit` and the CUDA backend make the same plan: embeddings, norms and the
// output head stay resident; layers stay resident from the first while they fit beside the
// workspace, the KV reserve and the staging ring; the trailing layers stream, so their first
// copies overlap the resident layers' compute.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace granule {

// Bytes each part of a model takes on the device, in the layout the CUDA backend uploads
// (split rows where the kernels read them, every matrix padded and aligned): what
// WeightLayout::sizes() (weight_layout.h) gives.
struct DeviceWeightSizes {
  uint64_t fixed_bytes = 0;           // embeddings, output head, norms, rope table
  std::vector<uint64_t> layer_bytes;  // each layer's seven matrices, packed
  uint64_t total() const;
};

struct PlacementInput {
  uint64_t budget_bytes = 0;
  DeviceWeightSizes weights;
  uint64_t workspace_bytes = 0;   // activations, logits, attention scratch
  uint64_t kv_reserve_bytes = 0;  // KV left free for the chats before layers are placed
  int32_t staging_slots = 2;      // the ring's size when anything streams
  // At most this many layers resident (pressure demotes below what fits); -1: no cap.
  int32_t max_resident_layers = -1;
};

struct PlacementPlan {
  std::vector<bool> layer_streamed;  // per layer
  int32_t resident_layers = 0;
  int32_t streamed_layers = 0;
  uint64_t resident_weight_bytes = 0;    // fixed + resident layers
  uint64_t streamed_bytes_per_pass = 0;  // the streamed layers' bytes
  uint64_t staging_slot_bytes = 0;       // the largest layer (0 when nothing streams)
  int32_t staging_slots = 0;
  uint64_t staging_bytes = 0;
  // What the budget must hold at least: fixed weights, a full ring, workspace, KV reserve.
  uint64_t minimum_budget_bytes = 0;
  bool loads = false;              // budget >= minimum_budget_bytes
  uint64_t kv_headroom_bytes = 0;  // budget left for KV after the plan (>= the reserve)

  uint64_t device_bytes() const { return resident_weight_bytes + staging_bytes; }
};

PlacementPlan plan_placement(const PlacementInput& input);

// The KV the plan keeps free at load: one prefill chunk of one chat, min(context, 512)
// tokens. More chats or longer ones grow into the rest of the budget and, past it, move
// layers to streaming (the engine's pressure path).
int64_t default_kv_reserve_tokens(int64_t context_per_chat);

// Whether the prefill overlap's second f16 scratch (`extra_bytes` more workspace) is taken:
// only when the plan keeps as many layers resident with it as without it (a layer moved to
// streaming costs every pass a copy far longer than the dequantisation the overlap hides).
bool overlap_scratch_fits(PlacementInput input, uint64_t extra_bytes);

// "the VRAM budget of 1.0 GiB is below the 1.3 GiB this model needs at least: 0.6 GiB of
// embeddings and head, 0.2 GiB of staging for two streamed layers, ..."
std::string describe_shortfall(const PlacementInput& input, const PlacementPlan& plan);

}  // namespace granule
