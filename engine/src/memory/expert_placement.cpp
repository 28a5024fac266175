// plan_expert_placement: resident experts by decayed routing counts, sticky between re-plans;
// the counts' decay.
#include "memory/expert_placement.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "granule/error.h"

namespace granule {
namespace {

// Layers in an evenly spread order (bit-reversed indices, those past the end skipped): the
// first k of it are spaced about n_layer / k apart for every k, so the layers that hold one
// expert more than the others are spread over the depth, not bunched at the start.
std::vector<int64_t> spread_layer_order(int64_t n_layer) {
  int bits = 0;
  while ((int64_t{1} << bits) < n_layer) ++bits;
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(n_layer));
  for (int64_t i = 0; i < (int64_t{1} << bits); ++i) {
    int64_t reversed = 0;
    for (int b = 0; b < bits; ++b)
      if (i & (int64_t{1} << b)) reversed |= int64_t{1} << (bits - 1 - b);
    if (reversed < n_layer) order.push_back(reversed);
  }
  return order;
}

// The total order every choice uses: hotter first (a larger count), then the lower expert
// index, then the layer earlier in the spread order.
class Ranking {
 public:
  Ranking(const ExpertPlacementInput& in) : in_(in), layer_rank_(static_cast<size_t>(in.n_layer)) {
    const std::vector<int64_t> order = spread_layer_order(in.n_layer);
    for (size_t r = 0; r < order.size(); ++r)
      layer_rank_[static_cast<size_t>(order[r])] = static_cast<int64_t>(r);
  }
  uint64_t count(int64_t i) const {
    return in_.routing_counts.empty() ? 0 : in_.routing_counts[static_cast<size_t>(i)];
  }
  bool hotter(int64_t a, int64_t b) const {
    const uint64_t ca = count(a), cb = count(b);
    if (ca != cb) return ca > cb;
    const int64_t ea = a % in_.n_expert, eb = b % in_.n_expert;
    if (ea != eb) return ea < eb;
    return layer_rank_[static_cast<size_t>(a / in_.n_expert)] <
           layer_rank_[static_cast<size_t>(b / in_.n_expert)];
  }
  // Whether host expert `host` should replace resident expert `resident`: a lead by the
  // margin that also stands out of the counting noise.
  bool beats(int64_t host, int64_t resident) const {
    const double h = static_cast<double>(count(host)) / kRoutingCountOne;
    const double r = static_cast<double>(count(resident)) / kRoutingCountOne;
    return h - r >= 1.0 && h > r * kPromoteMargin && h - r >= kPromoteSigmas * std::sqrt(h + r);
  }

 private:
  const ExpertPlacementInput& in_;
  std::vector<int64_t> layer_rank_;
};

}  // namespace

ExpertFootprint expert_footprint(const ModelConfig& config, const WeightTable& w) {
  ExpertFootprint f;
  const auto add = [](uint64_t& sum, const TensorInfo* t) {
    if (t) sum += t->size_bytes;
  };
  add(f.always_resident_bytes, w.token_embd);
  add(f.always_resident_bytes, w.output_norm);
  add(f.always_resident_bytes, w.rope_freqs);
  if (w.output != w.token_embd) add(f.always_resident_bytes, w.output);
  const auto n_expert = static_cast<uint64_t>(std::max<int64_t>(config.moe.n_expert, 1));
  for (const LayerWeights& l : w.layers) {
    for (const TensorInfo* t :
         {l.attn_norm,  l.wq,       l.wk,         l.wv,         l.wo,       l.bq,
          l.bk,         l.bv,       l.q_norm,     l.k_norm,     l.ffn_norm, l.w_gate,
          l.w_up,       l.w_down,   l.bo,         l.attn_sinks, l.router,   l.router_bias,
          l.gate_shexp, l.up_shexp, l.down_shexp, l.shexp_gate})
      add(f.always_resident_bytes, t);
    uint64_t experts = 0;  // this layer's, all of them
    for (const TensorInfo* t :
         {l.gate_exps, l.up_exps, l.down_exps, l.gate_exps_bias, l.up_exps_bias, l.down_exps_bias})
      add(experts, t);
    if (!config.is_moe()) {
      f.always_resident_bytes += experts;
      continue;
    }
    f.experts_bytes += experts;
    f.layer_expert_bytes.push_back(experts / n_expert);
    f.expert_bytes = std::max(f.expert_bytes, experts / n_expert);
  }
  return f;
}

int64_t ExpertPlacement::resident_count() const {
  return std::count_if(resident.begin(), resident.end(), [](uint8_t r) { return r != 0; });
}

int64_t ExpertPlacement::resident_in_layer(int64_t layer) const {
  const auto first = resident.begin() + layer * n_expert;
  return std::count_if(first, first + n_expert, [](uint8_t r) { return r != 0; });
}

int64_t experts_that_fit(const ExpertPlacementInput& in) {
  const int64_t total = in.n_layer * in.n_expert;
  if (in.expert_bytes == 0) return total;
  const uint64_t fit = in.budget_bytes / in.expert_bytes;
  return fit >= static_cast<uint64_t>(total) ? total : static_cast<int64_t>(fit);
}

ExpertPlacement plan_expert_placement(const ExpertPlacementInput& in,
                                      const ExpertPlacement* current) {
  if (in.n_layer < 0 || in.n_expert < 0)
    throw UsageError("expert placement: negative layer or expert count");
  const int64_t total = in.n_layer * in.n_expert;
  if (!in.routing_counts.empty() && in.routing_counts.size() != static_cast<size_t>(total))
    throw UsageError("expert placement: " + std::to_string(in.routing_counts.size()) +
                     " routing counts for " + std::to_string(in.n_layer) + " layers of " +
                     std::to_string(in.n_expert) + " experts");
  ExpertPlacement plan;
  plan.n_layer = in.n_layer;
  plan.n_expert = in.n_expert;
  plan.resident.assign(static_cast<size_t>(total), 0);
  if (total == 0) return plan;

  const int64_t fit = experts_that_fit(in);
  const Ranking ranking(in);
  const auto hotter = [&](int64_t a, int64_t b) { return ranking.hotter(a, b); };
  std::vector<int64_t> all(static_cast<size_t>(total));
  std::iota(all.begin(), all.end(), int64_t{0});

  const bool sticky = current != nullptr && current->n_layer == in.n_layer &&
                      current->n_expert == in.n_expert &&
                      current->resident.size() == static_cast<size_t>(total);
  if (!sticky) {
    std::partial_sort(all.begin(), all.begin() + fit, all.end(), hotter);
    for (int64_t k = 0; k < fit; ++k)
      plan.resident[static_cast<size_t>(all[static_cast<size_t>(k)])] = 1;
    return plan;
  }

  // Residents coldest first, host experts hottest first.
  std::vector<int64_t> resident, host;
  for (int64_t i : all) (current->resident[static_cast<size_t>(i)] ? resident : host).push_back(i);
  std::sort(resident.begin(), resident.end(), [&](int64_t a, int64_t b) { return hotter(b, a); });
  std::sort(host.begin(), host.end(), hotter);
  // A smaller budget: the coldest leave.
  size_t cold = 0;  // residents [0, cold) leave
  if (static_cast<int64_t>(resident.size()) > fit)
    cold = resident.size() - static_cast<size_t>(fit);
  int64_t promotions_left = in.max_promotions < 0 ? total : in.max_promotions;
  size_t hot = 0;  // host experts [0, hot) come in
  // Free room takes the hottest host experts.
  const int64_t staying = static_cast<int64_t>(resident.size() - cold);
  while (staying + static_cast<int64_t>(hot) < fit && hot < host.size() && promotions_left > 0) {
    ++hot;
    --promotions_left;
  }
  // Then swaps, hottest host expert against coldest staying resident, while it wins by the margin.
  size_t victim = cold;
  while (hot < host.size() && victim < resident.size() && promotions_left > 0 &&
         ranking.beats(host[hot], resident[victim])) {
    ++hot;
    ++victim;
    --promotions_left;
  }
  for (size_t k = victim; k < resident.size(); ++k)
    plan.resident[static_cast<size_t>(resident[k])] = 1;
  for (size_t k = 0; k < hot; ++k) plan.resident[static_cast<size_t>(host[k])] = 1;
  return plan;
}

ExpertMoves expert_moves(const ExpertPlacement& from, const ExpertPlacement& to) {
  ExpertMoves moves;
  const bool same_shape = from.n_layer == to.n_layer && from.n_expert == to.n_expert &&
                          from.resident.size() == to.resident.size();
  for (size_t i = 0; i < to.resident.size(); ++i) {
    const bool was = same_shape && from.resident[i] != 0;
    const bool is = to.resident[i] != 0;
    if (is && !was) moves.promoted.push_back(static_cast<int64_t>(i));
    if (was && !is) moves.demoted.push_back(static_cast<int64_t>(i));
  }
  return moves;
}

void decay_routing_counts(std::vector<uint64_t>& decayed, const int32_t* fresh, size_t n,
                          double keep) {
  if (!(keep >= 0.0 && keep <= 1.0))
    throw UsageError("routing counts: the share kept per interval must be within [0, 1]");
  if (decayed.empty()) decayed.assign(n, 0);
  if (decayed.size() != n)
    throw UsageError("routing counts: " + std::to_string(n) + " fresh counts for " +
                     std::to_string(decayed.size()) + " decayed ones");
  for (size_t i = 0; i < n; ++i) {
    const auto kept = static_cast<uint64_t>(std::floor(static_cast<double>(decayed[i]) * keep));
    const uint64_t added = fresh[i] > 0 ? static_cast<uint64_t>(fresh[i]) * kRoutingCountOne : 0;
    decayed[i] = kept + added;
  }
}

double routing_decay_keep(double interval_seconds, double half_life_seconds) {
  if (!(half_life_seconds > 0)) return 0.0;
  if (!(interval_seconds > 0)) return 1.0;
  return std::exp2(-interval_seconds / half_life_seconds);
}

}  // namespace granule
