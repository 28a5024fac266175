// plan_placement: the resident prefix of layers that fits, the trailing layers streamed.
#include "memory/placement.h"

#include <algorithm>
#include <cstdio>

namespace granule {
namespace {

std::string gib(uint64_t bytes) {
  char text[32];
  if (bytes >= (1ull << 30))
    std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  else
    std::snprintf(text, sizeof text, "%.0f MiB", static_cast<double>(bytes) / (1ull << 20));
  return text;
}

}  // namespace

uint64_t DeviceWeightSizes::total() const {
  uint64_t sum = fixed_bytes;
  for (uint64_t b : layer_bytes) sum += b;
  return sum;
}

bool overlap_scratch_fits(PlacementInput in, uint64_t extra_bytes) {
  const PlacementPlan without = plan_placement(in);
  if (!without.loads) return false;
  in.workspace_bytes += extra_bytes;
  const PlacementPlan with = plan_placement(in);
  return with.loads && with.resident_layers >= without.resident_layers;
}

int64_t default_kv_reserve_tokens(int64_t context_per_chat) {
  constexpr int64_t kReserveTokens = 512;
  return std::clamp<int64_t>(context_per_chat, 0, kReserveTokens);
}

PlacementPlan plan_placement(const PlacementInput& in) {
  PlacementPlan p;
  const auto& layers = in.weights.layer_bytes;
  const auto n = static_cast<int32_t>(layers.size());
  const uint64_t largest = layers.empty() ? 0 : *std::max_element(layers.begin(), layers.end());
  const uint64_t base = in.weights.fixed_bytes + in.workspace_bytes + in.kv_reserve_bytes;
  const int32_t slots = std::max(1, in.staging_slots);
  const int32_t cap = in.max_resident_layers < 0 ? n : std::min(n, in.max_resident_layers);
  p.minimum_budget_bytes = base + (n > 0 ? static_cast<uint64_t>(std::min(slots, n)) * largest : 0);

  // The most resident layers (a prefix) whose bytes, with a ring for the rest sized to the
  // largest streamed layer, fit the budget.
  std::vector<uint64_t> prefix(static_cast<size_t>(n) + 1, 0),
      suffix_max(static_cast<size_t>(n) + 1, 0);
  for (int32_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + layers[static_cast<size_t>(i)];
  for (int32_t i = n - 1; i >= 0; --i)
    suffix_max[i] = std::max(suffix_max[i + 1], layers[static_cast<size_t>(i)]);
  int32_t resident = 0;
  for (int32_t r = cap; r >= 0; --r) {
    const uint64_t ring =
        static_cast<uint64_t>(std::min(slots, n - r)) * suffix_max[static_cast<size_t>(r)];
    if (base + prefix[static_cast<size_t>(r)] + ring <= in.budget_bytes) {
      resident = r;
      break;
    }
  }
  p.layer_streamed.assign(static_cast<size_t>(n), false);
  p.resident_layers = resident;
  p.streamed_layers = n - resident;
  p.resident_weight_bytes = in.weights.fixed_bytes;
  for (int32_t i = 0; i < n; ++i) {
    if (i < resident) {
      p.resident_weight_bytes += layers[static_cast<size_t>(i)];
    } else {
      p.layer_streamed[static_cast<size_t>(i)] = true;
      p.streamed_bytes_per_pass += layers[static_cast<size_t>(i)];
    }
  }
  if (p.streamed_layers > 0) {
    p.staging_slots = std::min(slots, p.streamed_layers);
    p.staging_slot_bytes = suffix_max[static_cast<size_t>(resident)];
    p.staging_bytes = static_cast<uint64_t>(p.staging_slots) * p.staging_slot_bytes;
  }
  p.loads = in.budget_bytes >= p.minimum_budget_bytes;
  const uint64_t held = p.device_bytes() + in.workspace_bytes;
  p.kv_headroom_bytes = in.budget_bytes > held ? in.budget_bytes - held : 0;
  return p;
}

std::string describe_shortfall(const PlacementInput& in, const PlacementPlan& p) {
  const int32_t ring = std::min<int32_t>(std::max(1, in.staging_slots),
                                         static_cast<int32_t>(in.weights.layer_bytes.size()));
  const uint64_t largest =
      in.weights.layer_bytes.empty()
          ? 0
          : *std::max_element(in.weights.layer_bytes.begin(), in.weights.layer_bytes.end());
  return "the VRAM budget of " + gib(in.budget_bytes) + " is below the " +
         gib(p.minimum_budget_bytes) + " this model needs with every layer streamed (" +
         gib(in.weights.fixed_bytes) + " of embeddings, head and norms, " +
         gib(static_cast<uint64_t>(ring) * largest) + " of staging for " + std::to_string(ring) +
         " layers, " + gib(in.workspace_bytes) + " of workspace, " + gib(in.kv_reserve_bytes) +
         " of KV); raise the budget or use a shorter context";
}

}  // namespace granule
