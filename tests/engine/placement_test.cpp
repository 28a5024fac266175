// The placement plan's arithmetic (engine/src/memory/placement.h): everything resident when it
// fits; otherwise a resident prefix of layers beside a ring of staging slots sized to the
// largest layer and the trailing layers streamed; the minimum working set; a cap from
// pressure; the shortfall message.
#include "memory/placement.h"

#include <gtest/gtest.h>

#include <numeric>

namespace granule {
namespace {

constexpr uint64_t MiB = 1ull << 20;

PlacementInput input(uint64_t budget_mib) {
  PlacementInput in;
  in.budget_bytes = budget_mib * MiB;
  in.weights.fixed_bytes = 100 * MiB;
  in.weights.layer_bytes.assign(10, 50 * MiB);
  in.workspace_bytes = 20 * MiB;
  in.kv_reserve_bytes = 30 * MiB;
  return in;
}

TEST(Placement, EverythingResidentWhenItFitsAndNoStagingIsHeld) {
  const PlacementPlan p = plan_placement(input(650));  // 100 + 500 + 20 + 30
  EXPECT_TRUE(p.loads);
  EXPECT_EQ(p.resident_layers, 10);
  EXPECT_EQ(p.streamed_layers, 0);
  EXPECT_EQ(p.staging_bytes, 0u);
  EXPECT_EQ(p.streamed_bytes_per_pass, 0u);
  EXPECT_EQ(p.resident_weight_bytes, 600 * MiB);
  EXPECT_EQ(p.kv_headroom_bytes, 30 * MiB);
}

TEST(Placement, ShrinkingBudgetsStreamMoreTrailingLayers) {
  int32_t previous = -1;
  for (uint64_t budget = 649; budget >= 250; budget -= 25) {
    const PlacementPlan p = plan_placement(input(budget));
    ASSERT_TRUE(p.loads) << budget;
    EXPECT_GE(p.streamed_layers, previous) << budget;
    previous = p.streamed_layers;
    EXPECT_GT(p.streamed_layers, 0) << budget;
    EXPECT_EQ(p.resident_layers + p.streamed_layers, 10);
    // The streamed layers are the trailing run.
    for (int32_t i = 0; i < 10; ++i) EXPECT_EQ(p.layer_streamed[i], i >= p.resident_layers);
    EXPECT_EQ(p.staging_slots, std::min(2, p.streamed_layers));
    EXPECT_EQ(p.staging_slot_bytes, 50 * MiB);
    EXPECT_EQ(p.streamed_bytes_per_pass, static_cast<uint64_t>(p.streamed_layers) * 50 * MiB);
    // What is held fits the budget beside the workspace and the KV reserve.
    EXPECT_LE(p.device_bytes() + 20 * MiB + 30 * MiB, budget * MiB);
    EXPECT_GE(p.kv_headroom_bytes, 30 * MiB);
  }
  // 600 MiB: 100 fixed + 100 ring + 20 + 30 leaves 350 MiB: 7 resident layers.
  EXPECT_EQ(plan_placement(input(600)).resident_layers, 7);
}

TEST(Placement, BelowTheMinimumWorkingSetItDoesNotLoadAndSaysWhy) {
  // Minimum: fixed 100 + two slots of 50 + workspace 20 + KV 30 = 250 MiB.
  EXPECT_EQ(plan_placement(input(250)).minimum_budget_bytes, 250 * MiB);
  EXPECT_TRUE(plan_placement(input(250)).loads);
  EXPECT_EQ(plan_placement(input(250)).resident_layers, 0);
  const PlacementInput in = input(249);
  const PlacementPlan p = plan_placement(in);
  EXPECT_FALSE(p.loads);
  const std::string why = describe_shortfall(in, p);
  EXPECT_NE(why.find("249 MiB"), std::string::npos) << why;
  EXPECT_NE(why.find("250 MiB"), std::string::npos) << why;
  EXPECT_NE(why.find("staging for 2 layers"), std::string::npos) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos);
}

TEST(Placement, APressureCapStreamsMoreThanTheBudgetWould) {
  PlacementInput in = input(650);
  in.max_resident_layers = 6;
  const PlacementPlan p = plan_placement(in);
  EXPECT_EQ(p.resident_layers, 6);
  EXPECT_EQ(p.streamed_layers, 4);
  EXPECT_EQ(p.staging_bytes, 100 * MiB);
  // Four layers leave (200 MiB) and a ring of two comes (100 MiB): 100 MiB freed.
  EXPECT_EQ(plan_placement(input(650)).device_bytes() - p.device_bytes(), 100 * MiB);
}

TEST(Placement, TheRingHasASlotPerStreamedLayerUpToTwoSizedToTheLargestStreamed) {
  PlacementInput in = input(0);
  in.weights.layer_bytes = {40 * MiB, 10 * MiB, 10 * MiB, 40 * MiB};
  // Pressure caps the resident layers at 3: the last (40 MiB) streams through one slot.
  in.budget_bytes = 1000 * MiB;
  in.max_resident_layers = 3;
  const PlacementPlan p = plan_placement(in);
  EXPECT_EQ(p.streamed_layers, 1);
  EXPECT_EQ(p.staging_slots, 1);
  EXPECT_EQ(p.staging_slot_bytes, 40 * MiB);
  // Two streamed: the ring is two slots of the larger of the two (40 MiB).
  in.max_resident_layers = 2;
  const PlacementPlan two = plan_placement(in);
  EXPECT_EQ(two.streamed_layers, 2);
  EXPECT_EQ(two.staging_bytes, 80 * MiB);
  // By budget alone: 249 MiB cannot hold the first layer beside a ring of two 40 MiB slots.
  in.max_resident_layers = -1;
  in.budget_bytes = 249 * MiB;
  EXPECT_EQ(plan_placement(in).resident_layers, 0);
  in.budget_bytes = 250 * MiB;  // everything fits
  EXPECT_EQ(plan_placement(in).resident_layers, 4);
}

TEST(Placement, DefaultKvReserveIsOnePrefillChunkOfAtMost512Tokens) {
  EXPECT_EQ(default_kv_reserve_tokens(512), 512);
  EXPECT_EQ(default_kv_reserve_tokens(8192), 512);
  EXPECT_EQ(default_kv_reserve_tokens(300), 300);
  EXPECT_EQ(default_kv_reserve_tokens(0), 0);
}

}  // namespace
}  // namespace granule
