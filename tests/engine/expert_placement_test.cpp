// The expert placement plan (engine/src/memory/expert_placement.h): how many experts a budget
// holds at its edges, the uniform spread over layers without counts, skewed counts keeping
// the hot experts, hysteresis against flapping, the promotion cap, determinism, the moves
// between plans, and the decay of routing counts.
#include "memory/expert_placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "granule/error.h"

namespace granule {
namespace {

ExpertPlacementInput shape(int64_t n_layer, int64_t n_expert, int64_t experts_fitting) {
  ExpertPlacementInput in;
  in.n_layer = n_layer;
  in.n_expert = n_expert;
  in.expert_bytes = 3000;
  // A budget a little over the experts asked for: the remainder holds no further expert.
  in.budget_bytes = static_cast<uint64_t>(experts_fitting) * in.expert_bytes + 2999;
  return in;
}

size_t at(const ExpertPlacementInput& in, int64_t layer, int64_t e) {
  return static_cast<size_t>(layer * in.n_expert + e);
}

TEST(ExpertPlacement, ZeroBudgetHoldsNoExpert) {
  ExpertPlacementInput in = shape(4, 8, 0);
  in.budget_bytes = 0;
  const ExpertPlacement p = plan_expert_placement(in, nullptr);
  EXPECT_EQ(p.resident.size(), 32u);
  EXPECT_EQ(p.resident_count(), 0);
  in.budget_bytes = in.expert_bytes - 1;  // one byte short of one expert
  EXPECT_EQ(plan_expert_placement(in, nullptr).resident_count(), 0);
}

TEST(ExpertPlacement, BudgetOverEveryExpertHoldsAllOfThem) {
  ExpertPlacementInput in = shape(4, 8, 1000);
  EXPECT_EQ(experts_that_fit(in), 32);
  const ExpertPlacement p = plan_expert_placement(in, nullptr);
  EXPECT_EQ(p.resident_count(), 32);
  in.budget_bytes = 32 * in.expert_bytes;  // exactly all
  EXPECT_EQ(plan_expert_placement(in, nullptr).resident_count(), 32);
  in.budget_bytes -= 1;
  EXPECT_EQ(plan_expert_placement(in, nullptr).resident_count(), 31);
  in.expert_bytes = 0;  // nothing to place costs nothing
  EXPECT_EQ(plan_expert_placement(in, nullptr).resident_count(), 32);
}

TEST(ExpertPlacement, EmptyShapeGivesAnEmptyPlan) {
  const ExpertPlacement p = plan_expert_placement(shape(0, 0, 10), nullptr);
  EXPECT_TRUE(p.resident.empty());
  EXPECT_EQ(p.resident_count(), 0);
}

TEST(ExpertPlacement, BadInputIsAUsageError) {
  ExpertPlacementInput in = shape(4, 8, 10);
  in.routing_counts.assign(31, 1);
  EXPECT_THROW(plan_expert_placement(in, nullptr), UsageError);
  in = shape(-1, 8, 10);
  EXPECT_THROW(plan_expert_placement(in, nullptr), UsageError);
}

TEST(ExpertPlacement, UniformSpreadsEvenlyOverLayers) {
  // 48 layers × 128 experts, 3000 fit: 62 or 63 per layer (3000 = 48 × 62 + 24).
  const ExpertPlacementInput in = shape(48, 128, 3000);
  const ExpertPlacement p = plan_expert_placement(in, nullptr);
  EXPECT_EQ(p.resident_count(), 3000);
  std::vector<int64_t> layers_with_extra;
  for (int64_t l = 0; l < 48; ++l) {
    const int64_t n = p.resident_in_layer(l);
    ASSERT_TRUE(n == 62 || n == 63) << "layer " << l << " holds " << n;
    if (n == 63) layers_with_extra.push_back(l);
    // The lowest indices of each layer: experts 0..n-1.
    for (int64_t e = 0; e < 128; ++e) EXPECT_EQ(p.is_resident(l, e), e < n) << l << "/" << e;
  }
  ASSERT_EQ(layers_with_extra.size(), 24u);
  // Spread, not bunched: every run of 4 consecutive layers holds at least one with an extra.
  for (int64_t l = 0; l + 4 <= 48; ++l) {
    const auto in_run = std::count_if(layers_with_extra.begin(), layers_with_extra.end(),
                                      [&](int64_t x) { return x >= l && x < l + 4; });
    EXPECT_GE(in_run, 1) << "layers " << l << ".." << l + 3;
  }
  // All-zero counts are the uniform plan too.
  ExpertPlacementInput zero = in;
  zero.routing_counts.assign(48 * 128, 0);
  EXPECT_EQ(plan_expert_placement(zero, nullptr).resident, p.resident);
}

TEST(ExpertPlacement, SkewedCountsKeepTheHotExperts) {
  // Per layer, expert e has count (n_expert - e) × (layer + 1) choices, except that layer 2
  // routes everything to its experts 5 and 6. 10 of 4 × 8 fit.
  ExpertPlacementInput in = shape(4, 8, 10);
  in.routing_counts.assign(32, 0);
  for (int64_t l = 0; l < 4; ++l)
    for (int64_t e = 0; e < 8; ++e)
      in.routing_counts[at(in, l, e)] = static_cast<uint64_t>((8 - e) * (l + 1)) * kRoutingCountOne;
  for (int64_t e = 0; e < 8; ++e) in.routing_counts[at(in, 2, e)] = 0;
  in.routing_counts[at(in, 2, 5)] = 1000 * kRoutingCountOne;
  in.routing_counts[at(in, 2, 6)] = 999 * kRoutingCountOne;
  const ExpertPlacement p = plan_expert_placement(in, nullptr);
  EXPECT_EQ(p.resident_count(), 10);
  // Every count above the tenth largest is resident; every count below the eleventh is not.
  std::vector<uint64_t> counts = in.routing_counts;
  std::sort(counts.rbegin(), counts.rend());
  const uint64_t tenth = counts[9], eleventh = counts[10];
  for (size_t i = 0; i < 32; ++i) {
    if (in.routing_counts[i] > tenth) EXPECT_TRUE(p.resident[i]) << i;
    if (in.routing_counts[i] < eleventh || in.routing_counts[i] == 0)
      EXPECT_FALSE(p.resident[i]) << i;
  }
  EXPECT_TRUE(p.is_resident(2, 5));
  EXPECT_TRUE(p.is_resident(2, 6));
  EXPECT_FALSE(p.is_resident(2, 0));
}

TEST(ExpertPlacement, EqualCountsTieToTheLowerExpertIndex) {
  ExpertPlacementInput in = shape(1, 8, 3);
  in.routing_counts = {5, 9, 9, 9, 9, 0, 0, 1};
  const ExpertPlacement p = plan_expert_placement(in, nullptr);
  EXPECT_EQ(p.resident, (std::vector<uint8_t>{0, 1, 1, 1, 0, 0, 0, 0}));
}

TEST(ExpertPlacement, IsDeterministic) {
  ExpertPlacementInput in = shape(48, 128, 2500);
  in.routing_counts.resize(48 * 128);
  uint64_t x = 12345;
  for (uint64_t& c : in.routing_counts) {  // a fixed pseudo-random pattern with many ties
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    c = (x >> 60) * kRoutingCountOne;
  }
  const ExpertPlacement a = plan_expert_placement(in, nullptr);
  const ExpertPlacement b = plan_expert_placement(in, nullptr);
  EXPECT_EQ(a.resident, b.resident);
  EXPECT_EQ(a.resident_count(), 2500);
  const ExpertPlacement c = plan_expert_placement(in, &a);
  const ExpertPlacement d = plan_expert_placement(in, &a);
  EXPECT_EQ(c.resident, d.resident);
  // Re-planning the same counts from the plan they produced changes nothing.
  EXPECT_EQ(c.resident, a.resident);
}

TEST(ExpertPlacement, HysteresisKeepsResidentsAgainstSmallLeads) {
  // Two experts fit of one layer's four. Experts 0 and 1 are resident; expert 2 becomes a
  // little hotter than expert 1, then much hotter. Counts large enough that noise is no issue.
  constexpr uint64_t k = 100 * kRoutingCountOne;
  ExpertPlacementInput in = shape(1, 4, 2);
  in.routing_counts = {100 * k, 100 * k, 0, 0};
  const ExpertPlacement first = plan_expert_placement(in, nullptr);
  ASSERT_EQ(first.resident, (std::vector<uint8_t>{1, 1, 0, 0}));

  in.routing_counts = {100 * k, 100 * k, 120 * k, 0};
  const ExpertPlacement small_lead = plan_expert_placement(in, &first);
  EXPECT_EQ(small_lead.resident, first.resident) << "a 20% lead does not move an expert";
  // Without the current plan the same counts choose the hotter ones.
  EXPECT_EQ(plan_expert_placement(in, nullptr).resident, (std::vector<uint8_t>{1, 0, 1, 0}));

  in.routing_counts = {100 * k, 100 * k, 126 * k, 0};
  const ExpertPlacement big_lead = plan_expert_placement(in, &first);
  // Expert 1 is the coldest resident (equal counts: the higher index is colder).
  EXPECT_EQ(big_lead.resident, (std::vector<uint8_t>{1, 0, 1, 0}));

  // And back: expert 1 regains a lead over expert 0 (the coldest resident) under the margin,
  // nothing moves.
  in.routing_counts = {100 * k, 124 * k, 126 * k, 0};
  EXPECT_EQ(plan_expert_placement(in, &big_lead).resident, big_lead.resident);
}

TEST(ExpertPlacement, HysteresisNeedsALeadOutOfTheNoiseAtSmallCounts) {
  ExpertPlacementInput in = shape(1, 2, 1);
  in.routing_counts = {0, 0};
  const ExpertPlacement first = plan_expert_placement(in, nullptr);
  ASSERT_EQ(first.resident, (std::vector<uint8_t>{1, 0}));
  in.routing_counts = {0, kRoutingCountOne - 1};  // decayed dust: far over 1.25× of 0
  EXPECT_EQ(plan_expert_placement(in, &first).resident, first.resident);
  // 35 choices against none: under 6 × sqrt(35); 36: 6 × sqrt(36).
  in.routing_counts = {0, 35 * kRoutingCountOne};
  EXPECT_EQ(plan_expert_placement(in, &first).resident, first.resident);
  in.routing_counts = {0, 36 * kRoutingCountOne};
  EXPECT_EQ(plan_expert_placement(in, &first).resident, (std::vector<uint8_t>{0, 1}));
  // 100 against 180: an 80% lead, but only 5.7 deviations.
  in.routing_counts = {100 * kRoutingCountOne, 180 * kRoutingCountOne};
  EXPECT_EQ(plan_expert_placement(in, &first).resident, first.resident);
}

TEST(ExpertPlacement, UniformRoutingNoiseMovesNothing) {
  // 48 × 128 experts, half resident, counts drawn around the same mean with a Poisson-like
  // spread (a uniform router's counts, ~40 choices each): twenty re-plans keep the placement.
  ExpertPlacementInput in = shape(48, 128, 3072);
  const ExpertPlacement first = plan_expert_placement(in, nullptr);
  uint64_t x = 99;
  ExpertPlacement current = first;
  for (int round = 0; round < 20; ++round) {
    in.routing_counts.assign(48 * 128, 0);
    for (uint64_t& c : in.routing_counts) {  // 40 ± a binomial-like spread of up to ±20
      int64_t v = 40;
      for (int b = 0; b < 40; ++b) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        v += (x >> 63) ? 1 : -1;
      }
      c = static_cast<uint64_t>(std::max<int64_t>(v, 0)) * kRoutingCountOne;
    }
    current = plan_expert_placement(in, &current);
  }
  EXPECT_EQ(current.resident, first.resident);
}

TEST(ExpertPlacement, ChangedBudgetDemotesTheColdestAndFillsRoomWithTheHottest) {
  ExpertPlacementInput in = shape(2, 4, 4);
  in.routing_counts = {40, 30, 20, 10, 45, 35, 25, 15};
  for (uint64_t& c : in.routing_counts) c *= kRoutingCountOne;
  const ExpertPlacement four = plan_expert_placement(in, nullptr);
  EXPECT_EQ(four.resident, (std::vector<uint8_t>{1, 1, 0, 0, 1, 1, 0, 0}));
  in.budget_bytes = 2 * in.expert_bytes;
  const ExpertPlacement two = plan_expert_placement(in, &four);
  EXPECT_EQ(two.resident, (std::vector<uint8_t>{1, 0, 0, 0, 1, 0, 0, 0}));
  in.budget_bytes = 5 * in.expert_bytes;
  const ExpertPlacement five = plan_expert_placement(in, &two);
  EXPECT_EQ(five.resident, (std::vector<uint8_t>{1, 1, 0, 0, 1, 1, 1, 0}));
}

TEST(ExpertPlacement, PromotionCapLimitsOneReplansCopies) {
  ExpertPlacementInput in = shape(1, 8, 4);
  const ExpertPlacement first = plan_expert_placement(in, nullptr);  // experts 0..3
  in.routing_counts = {0, 0, 0, 0, 50, 60, 70, 80};
  for (uint64_t& c : in.routing_counts) c *= kRoutingCountOne;
  in.max_promotions = 2;
  const ExpertPlacement capped = plan_expert_placement(in, &first);
  EXPECT_EQ(capped.resident_count(), 4);
  // The two hottest came in, for the two coldest residents (3, then 2).
  EXPECT_EQ(capped.resident, (std::vector<uint8_t>{1, 1, 0, 0, 0, 0, 1, 1}));
  const ExpertMoves moves = expert_moves(first, capped);
  EXPECT_EQ(moves.promoted, (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(moves.demoted, (std::vector<int64_t>{2, 3}));
  // The next re-plan finishes the job.
  const ExpertPlacement next = plan_expert_placement(in, &capped);
  EXPECT_EQ(next.resident, (std::vector<uint8_t>{0, 0, 0, 0, 1, 1, 1, 1}));
}

TEST(ExpertPlacement, CurrentOfAnotherShapeIsIgnored) {
  const ExpertPlacementInput in = shape(2, 4, 3);
  ExpertPlacement other;
  other.n_layer = 1;
  other.n_expert = 4;
  other.resident = {0, 0, 1, 1};
  EXPECT_EQ(plan_expert_placement(in, &other).resident,
            plan_expert_placement(in, nullptr).resident);
  const ExpertMoves moves = expert_moves(other, plan_expert_placement(in, nullptr));
  EXPECT_EQ(moves.promoted.size(), 3u);
  EXPECT_TRUE(moves.demoted.empty());
}

TEST(RoutingCounts, DecayKeepsAShareAndAddsFreshChoices) {
  std::vector<uint64_t> decayed;
  const std::vector<int32_t> step = {4, 0, 1, -3};
  decay_routing_counts(decayed, step.data(), step.size(), 0.5);
  EXPECT_EQ(decayed, (std::vector<uint64_t>{4 * kRoutingCountOne, 0, kRoutingCountOne, 0}));
  const std::vector<int32_t> none = {0, 0, 0, 0};
  decay_routing_counts(decayed, none.data(), none.size(), 0.5);
  EXPECT_EQ(decayed, (std::vector<uint64_t>{2 * kRoutingCountOne, 0, kRoutingCountOne / 2, 0}));
  // Many quiet intervals bring every count to zero (floor), not to a stuck remainder.
  for (int i = 0; i < 20; ++i) decay_routing_counts(decayed, none.data(), none.size(), 0.5);
  EXPECT_EQ(decayed, (std::vector<uint64_t>{0, 0, 0, 0}));
  EXPECT_THROW(decay_routing_counts(decayed, none.data(), 3, 0.5), UsageError);
  EXPECT_THROW(decay_routing_counts(decayed, none.data(), 4, 1.5), UsageError);
}

TEST(RoutingCounts, KeepPerIntervalFollowsTheHalfLife) {
  EXPECT_DOUBLE_EQ(routing_decay_keep(1.0, 1.0), 0.5);
  EXPECT_DOUBLE_EQ(routing_decay_keep(2.0, 1.0), 0.25);
  EXPECT_NEAR(std::pow(routing_decay_keep(0.01, 2.0), 200), 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(routing_decay_keep(1.0, 0.0), 0.0);
  EXPECT_DOUBLE_EQ(routing_decay_keep(0.0, 1.0), 1.0);
}

}  // namespace
}  // namespace granule
