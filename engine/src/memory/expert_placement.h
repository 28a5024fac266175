// The expert placement plan of a mixture-of-experts model: which (layer, expert) pairs stay in
// device memory for a budget, chosen by decayed routing counts with hysteresis, and the decay
// of those counts between steps. Arithmetic only (no device), so the fit preview, `granule-cli
// fit` and the CUDA backend's between-step re-plan make the same choice. Embeddings,
// attention, norms, routers and shared experts are resident before this plan runs: its
// budget is what they leave.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "granule/model_config.h"

namespace granule {

// A mixture-of-experts model's weights as the expert plan splits them, in the file's bytes.
struct ExpertFootprint {
  // Resident whatever the plan: embeddings, output head and norm, and per layer attention,
  // norms, the router and the shared expert.
  uint64_t always_resident_bytes = 0;
  std::vector<uint64_t> layer_expert_bytes;  // one expert of each layer: gate + up + down + biases
  uint64_t expert_bytes = 0;                 // the largest of them (what a plan sizes by)
  uint64_t experts_bytes = 0;                // every expert of every layer
  uint64_t total() const { return always_resident_bytes + experts_bytes; }
};
// For a dense model every byte is always resident and there are no experts.
ExpertFootprint expert_footprint(const ModelConfig& config, const WeightTable& weights);

struct ExpertPlacementInput {
  int64_t n_layer = 0, n_expert = 0;
  uint64_t expert_bytes = 0;  // one expert's gate+up+down (+biases) in one layer
  uint64_t budget_bytes = 0;  // device bytes the plan may give experts
  // [layer * n_expert + e], decayed (decay_routing_counts); empty or all zero: uniform.
  std::vector<uint64_t> routing_counts;
  // At most this many experts promoted by one re-plan (each a host-to-device copy between
  // steps); -1: no cap. Experts that must leave (a smaller budget) always leave.
  int64_t max_promotions = -1;
};

struct ExpertPlacement {
  int64_t n_layer = 0, n_expert = 0;
  std::vector<uint8_t> resident;  // [layer * n_expert + e]: 1 in device memory, 0 in host memory

  int64_t resident_count() const;
  int64_t resident_in_layer(int64_t layer) const;
  bool is_resident(int64_t layer, int64_t expert) const {
    return resident[static_cast<size_t>(layer * n_expert + expert)] != 0;
  }
};

// How many experts `budget_bytes` holds, at most every expert (all of them when
// expert_bytes is 0).
int64_t experts_that_fit(const ExpertPlacementInput& in);

// The plan for `in`. Without counts (or with all of them zero) it spreads the experts evenly
// over the layers (each layer holds floor or ceil of fit / n_layer, the extra ones on evenly
// spaced layers, experts 0, 1, ... of each). With counts it keeps the hottest; ties go to the
// lower expert index, then to the layers in that evenly spread order. With `current` (the
// plan in force, same shape) it is sticky: a host expert replaces a resident one only when
// its count beats the coldest resident's by kPromoteMargin and by kPromoteSigmas standard
// deviations of the counts' noise, so experts do not flap between re-plans under uniform
// routing; free room is filled by the hottest. The result
// is deterministic: the same input and current give the same plan. A `current` of another
// shape counts as none; max_promotions applies only with one. Throws UsageError for a
// negative shape or counts of the wrong length.
ExpertPlacement plan_expert_placement(const ExpertPlacementInput& in,
                                      const ExpertPlacement* current);

// For a host expert h to replace a resident r (counts in routing choices): h > r × kPromoteMargin
// and h − r ≥ kPromoteSigmas × sqrt(h + r) (the standard deviation of the difference of two
// Poisson counts; decayed counts vary less), and by one choice at least. Under uniform routing
// the hottest host expert and the coldest resident of 6,144 differ by about 5.4 such
// deviations at most (Poisson counts; 3.5 for decayed ones); a real skew (a Zipf router)
// leads by ten or more.
inline constexpr double kPromoteMargin = 1.25;
inline constexpr double kPromoteSigmas = 6.0;

// The experts a re-plan moves: those to copy into device memory and those whose device copy
// is released, each as layer * n_expert + e, ascending. Plans of different shapes: every
// resident expert of `to` is promoted and nothing demoted.
struct ExpertMoves {
  std::vector<int64_t> promoted;
  std::vector<int64_t> demoted;
};
ExpertMoves expert_moves(const ExpertPlacement& from, const ExpertPlacement& to);

// Decayed routing counts are fixed-point: one (token, expert) choice adds kRoutingCountOne,
// so decay keeps fractions of a choice instead of rounding small counts to zero at once.
inline constexpr uint64_t kRoutingCountOne = 256;

// decayed[i] = floor(decayed[i] × keep) + fresh[i] × kRoutingCountOne, for `fresh` the
// device's int32 counts [n_layer × n_expert] since the last call (negative ones count as 0).
// `keep` in [0, 1]: the share of the old counts that survives one interval. `decayed` is
// sized to n (zeros) when it is empty. Throws UsageError when the sizes differ or keep is
// outside [0, 1].
void decay_routing_counts(std::vector<uint64_t>& decayed, const int32_t* fresh, size_t n,
                          double keep);

// The per-interval `keep` for a half-life: 0.5^(interval / half_life). A half-life of 0 or
// less keeps nothing (only the newest interval counts).
double routing_decay_keep(double interval_seconds, double half_life_seconds);

}  // namespace granule
