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
  choose_host_layers(in, p);
  return p;
}

void choose_host_layers(const PlacementInput& in, PlacementPlan& p) {
  const size_t n = p.layer_streamed.size();
  p.layer_on_host.assign(n, false);
  p.host_layers = 0;
  p.host_bytes_per_pass = 0;
  p.streaming_seconds_per_pass = 0;
  p.split_seconds_per_pass = 0;
  const double pcie = in.h2d_bytes_per_second, host = in.host_bytes_per_second;
  if (pcie <= 0 || host <= 0 || p.streamed_layers == 0) return;
  std::vector<size_t> streamed;
  for (size_t i = 0; i < n; ++i)
    if (p.layer_streamed[i]) streamed.push_back(i);
  const auto s = static_cast<int64_t>(streamed.size());
  p.streaming_seconds_per_pass = static_cast<double>(p.streamed_bytes_per_pass) / pcie;
  // Host layer j of the streamed (0-based) when the running share floor((j + 1) h / s) grows:
  // evenly spread, the first streamed layer copied (its copy overlaps the resident layers).
  auto split = [&](int64_t h, std::vector<bool>* out) {
    uint64_t host_bytes = 0, copied_bytes = 0;
    int64_t runs = 0;  // runs of consecutive host layers: one host node each
    bool previous_on_host = false;
    size_t previous = 0;
    for (int64_t j = 0; j < s; ++j) {
      const bool on_host = (j + 1) * h / s > j * h / s;
      const size_t layer = streamed[static_cast<size_t>(j)];
      if (on_host && !(previous_on_host && j > 0 && previous + 1 == layer)) ++runs;
      previous_on_host = on_host;
      previous = layer;
      (on_host ? host_bytes : copied_bytes) += in.weights.layer_bytes[layer];
      if (out) (*out)[layer] = on_host;
    }
    return std::max(
        static_cast<double>(host_bytes) / host + static_cast<double>(runs) * in.host_node_seconds,
        static_cast<double>(copied_bytes) / pcie);
  };
  int64_t best = 0;
  double best_seconds = split(0, nullptr);
  for (int64_t h = 1; h <= s; ++h) {
    const double seconds = split(h, nullptr);
    if (seconds < best_seconds) {
      best = h;
      best_seconds = seconds;
    }
  }
  if (best == 0) return;
  split(best, &p.layer_on_host);
  p.host_layers = static_cast<int32_t>(best);
  for (size_t i = 0; i < n; ++i)
    if (p.layer_on_host[i]) p.host_bytes_per_pass += in.weights.layer_bytes[i];
  p.split_seconds_per_pass = best_seconds;
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
