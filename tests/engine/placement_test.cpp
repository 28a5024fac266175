// The placement plan's arithmetic (engine/src/memory/placement.h): everything resident when it
// fits; otherwise a resident prefix of layers beside a ring of staging slots sized to the
// largest layer and the trailing layers streamed; the minimum working set; a cap from
// pressure; the shortfall message; when the prefill overlap's scratch is taken. And the tables
// the plan is fed from: the weight layout (memory/weight_layout.h) and the CUDA workspace list
// (memory/workspace_layout.h).
#include "memory/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <set>
#include <string>

#include "granule/gguf.h"
#include "memory/weight_layout.h"
#include "memory/workspace_layout.h"
#include "model/weight_split.h"
#include "support/temp_model.h"

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

TEST(Placement, TheOverlapScratchIsTakenOnlyWhereTheSameLayersStayResident) {
  // 650 MiB holds everything with 0 MiB to spare; 700 MiB leaves 50 MiB.
  EXPECT_FALSE(overlap_scratch_fits(input(650), 1));
  EXPECT_TRUE(overlap_scratch_fits(input(700), 50 * MiB));
  EXPECT_FALSE(overlap_scratch_fits(input(700), 50 * MiB + 1));
  // Streaming either way: 600 MiB keeps 7 layers; 20 MiB more workspace would cost one.
  EXPECT_TRUE(overlap_scratch_fits(input(600), 0));
  EXPECT_FALSE(overlap_scratch_fits(input(600), 20 * MiB));
  EXPECT_FALSE(overlap_scratch_fits(input(249), 0));  // does not load at all
}

TEST(Placement, DefaultKvReserveIsOnePrefillChunkOfAtMost512Tokens) {
  EXPECT_EQ(default_kv_reserve_tokens(512), 512);
  EXPECT_EQ(default_kv_reserve_tokens(8192), 512);
  EXPECT_EQ(default_kv_reserve_tokens(300), 300);
  EXPECT_EQ(default_kv_reserve_tokens(0), 0);
}

// "tiny" (2 layers, 64 wide, ff 128, 4/2 heads of 16, vocab 384, untied) with Q4_0 layers.
struct TinyModel {
  test::TempModel file{spec(), "placement-layout"};
  std::unique_ptr<ModelFile> gguf = ModelFile::open(file.path);
  ModelConfig config = ModelConfig::from_gguf(*gguf);
  WeightTable weights = WeightTable::from_gguf(*gguf, config);

  static SyntheticModelSpec spec() {
    SyntheticModelSpec s = SyntheticModelSpec::preset("tiny");
    s.weight_type = TensorType::Q4_0;
    return s;
  }
};

TEST(WeightLayout, EveryMatrixIsAlignedPaddedAndSplitWhereTheKernelsReadSplitRows) {
  const TinyModel m;
  const WeightLayout split = weight_layout(m.config, m.weights, true);
  const WeightLayout gguf = weight_layout(m.config, m.weights, false);
  ASSERT_EQ(split.layers.size(), 2u);
  for (const WeightLayout* layout : {&split, &gguf}) {
    for (const LayerWeightLayout& l : layout->layers) {
      uint64_t at = 0;
      for (const MatrixLayout& x : l.matrices) {
        EXPECT_EQ(x.offset, at);
        EXPECT_EQ(x.offset % 256, 0u);
        if (!x.tensor) {  // a matrix this layer kind has not (the ssm_ ones here): no bytes
          EXPECT_EQ(x.padded_bytes, 0u);
          continue;
        }
        EXPECT_EQ(x.padded_bytes, (x.bytes + 16 + 255) / 256 * 256);
        EXPECT_EQ(x.bytes, static_cast<uint64_t>(x.rows * x.row_bytes));
        at += x.padded_bytes;
      }
      EXPECT_EQ(l.bytes, at);
    }
  }
  // wq: 64 rows of 64 Q4_0 elements, 36 bytes as stored; split rows are 48 bytes apart.
  const MatrixLayout& wq = split.layers[0].matrices[0];
  EXPECT_TRUE(wq.split);
  EXPECT_EQ(wq.gguf_row_bytes, 36);
  EXPECT_EQ(wq.row_bytes, split_row_stride(wq.tensor->ggml_type, 64));
  EXPECT_EQ(wq.row_bytes, 48);
  EXPECT_EQ(wq.bytes, 3072u);
  EXPECT_EQ(wq.padded_bytes, 3328u);
  const MatrixLayout& wq_gguf = gguf.layers[0].matrices[0];
  EXPECT_FALSE(wq_gguf.split);
  EXPECT_EQ(wq_gguf.bytes, 2304u);  // 64 x 36, as stored
  EXPECT_EQ(wq_gguf.padded_bytes, 2560u);
  // F32 embeddings and head: no split layout, 384 x 64 x 4 bytes each (+ slack, aligned).
  ASSERT_EQ(split.fixed.size(), 2u);
  EXPECT_FALSE(split.fixed[0].split);
  EXPECT_EQ(split.fixed[1].offset, 98560u);
  EXPECT_EQ(split.fixed_matrix_bytes, 2 * 98560u);
  // Norms (64 floats, one aligned 256-byte run each): two per layer, then the output norm.
  EXPECT_EQ(split.layers[0].vectors[0], 0);
  EXPECT_EQ(split.layers[0].vectors[1], 64);
  EXPECT_EQ(split.layers[1].vectors[0], 128);
  EXPECT_EQ(split.layers[0].vectors[2], -1);  // no Q bias
  EXPECT_EQ(split.output_norm_vector, 256);
  EXPECT_EQ(split.vector_floats, 320u);
  EXPECT_EQ(split.rope_bytes, 8u * 8u);  // head_dim 16: 8 frequencies as doubles
  EXPECT_EQ(split.largest_layer_matrix_elements, 64 * 128);
}

TEST(WeightLayout, ThePlanSizesAreTheTablesTotals) {
  const TinyModel m;
  const WeightLayout layout = weight_layout(m.config, m.weights, true);
  const DeviceWeightSizes sizes = layout.sizes();
  EXPECT_EQ(sizes.fixed_bytes,
            layout.fixed_matrix_bytes + layout.vector_floats * sizeof(float) + layout.rope_bytes);
  EXPECT_EQ(sizes.fixed_bytes, 2 * 98560u + 320 * 4 + 64);
  ASSERT_EQ(sizes.layer_bytes.size(), layout.layers.size());
  uint64_t layers = 0;
  for (size_t i = 0; i < layout.layers.size(); ++i) {
    EXPECT_EQ(sizes.layer_bytes[i], layout.layers[i].bytes);
    layers += layout.layers[i].bytes;
  }
  EXPECT_EQ(sizes.total(), sizes.fixed_bytes + layers);
  // A plan over them holds exactly the table's bytes.
  PlacementInput in;
  in.weights = sizes;
  in.budget_bytes = sizes.total();
  const PlacementPlan all = plan_placement(in);
  EXPECT_EQ(all.resident_layers, 2);
  EXPECT_EQ(all.resident_weight_bytes, sizes.total());
  in.max_resident_layers = 0;  // every layer through the ring
  const PlacementPlan streamed = plan_placement(in);
  EXPECT_EQ(streamed.staging_bytes, 2 * std::max(layout.layers[0].bytes, layout.layers[1].bytes));
  EXPECT_EQ(streamed.resident_layers, 0);
  EXPECT_EQ(streamed.streamed_bytes_per_pass, layers);
  EXPECT_EQ(streamed.resident_weight_bytes, sizes.fixed_bytes);
}

TEST(WeightLayout, ALayerBlobHoldsItsMatricesInTheirDeviceLayout) {
  const TinyModel m;
  for (bool split : {true, false}) {
    const WeightLayout layout = weight_layout(m.config, m.weights, split);
    const LayerWeightLayout& l = layout.layers[1];
    std::vector<uint8_t> blob(l.bytes, 0xAB);
    l.write(blob.data());
    for (const MatrixLayout& x : l.matrices) {
      if (!x.tensor) continue;  // not this layer kind's
      std::vector<uint8_t> expected(x.bytes);
      if (split)
        split_rows(x.tensor->ggml_type, x.tensor->data, x.rows, x.cols, expected.data());
      else
        std::memcpy(expected.data(), x.tensor->data, x.bytes);
      EXPECT_EQ(std::memcmp(blob.data() + x.offset, expected.data(), x.bytes), 0)
          << x.tensor->name << (split ? " split" : " as stored");
    }
  }
}

// A Gated DeltaNet layer's input projections (ssm_in, ssm_z, ssm_beta, ssm_alpha: one input) in
// split rows of one type lie back to back, so that a one-row step reads them as one matrix
// (cuda_hybrid.cpp); the matrix after them starts aligned again. As stored (GGUF blocks) they
// keep their own aligned, padded places. Either way the blob holds each matrix's rows.
TEST(WeightLayout, ADeltaNetLayersInputProjectionsLieBackToBackInSplitRows) {
  SyntheticModelSpec spec = SyntheticModelSpec::preset("tiny-qwen35");
  spec.n_embd = 256;  // rows the split layout takes
  spec.weight_type = TensorType::Q4_0;
  test::TempModel file(spec, "placement-qwen35");
  const std::unique_ptr<ModelFile> gguf = ModelFile::open(file.path);
  const ModelConfig config = ModelConfig::from_gguf(*gguf);
  const WeightTable weights = WeightTable::from_gguf(*gguf, config);
  ASSERT_TRUE(config.layer_recurrent(0));
  constexpr size_t kSsmIn = 7, kSsmAlpha = 10, kSsmOut = 11;
  for (bool split : {true, false}) {
    const WeightLayout layout = weight_layout(config, weights, split);
    const LayerWeightLayout& l = layout.layers[0];
    for (size_t m = kSsmIn; m <= kSsmOut; ++m) ASSERT_TRUE(l.matrices[m].tensor);
    EXPECT_EQ(l.matrices[kSsmIn].split, split);
    EXPECT_EQ(l.matrices[kSsmIn].offset % 256, 0u);
    for (size_t m = kSsmIn + 1; m <= kSsmAlpha; ++m) {
      const MatrixLayout& before = l.matrices[m - 1];
      const MatrixLayout& x = l.matrices[m];
      if (split) {
        EXPECT_EQ(x.offset, before.offset + before.bytes) << x.tensor->name;
        EXPECT_EQ(before.padded_bytes, before.bytes) << x.tensor->name;
      } else {
        EXPECT_EQ(x.offset % 256, 0u) << x.tensor->name;
        EXPECT_EQ(x.offset, before.offset + before.padded_bytes) << x.tensor->name;
        EXPECT_GE(before.padded_bytes, before.bytes + 16) << x.tensor->name;
      }
    }
    const MatrixLayout& alpha = l.matrices[kSsmAlpha];
    EXPECT_EQ(l.matrices[kSsmOut].offset, alpha.offset + alpha.padded_bytes);
    EXPECT_EQ(l.matrices[kSsmOut].offset % 256, 0u);
    EXPECT_GE(l.matrices[kSsmOut].offset, alpha.offset + alpha.bytes + 16);
    EXPECT_EQ(l.bytes % 256, 0u);
    std::vector<uint8_t> blob(l.bytes, 0xAB);
    l.write(blob.data());
    for (const MatrixLayout& x : l.matrices) {
      if (!x.tensor) continue;
      std::vector<uint8_t> expected(x.bytes);
      if (split)
        split_rows(x.tensor->ggml_type, x.tensor->data, x.rows, x.cols, expected.data());
      else
        std::memcpy(expected.data(), x.tensor->data, x.bytes);
      EXPECT_EQ(std::memcmp(blob.data() + x.offset, expected.data(), x.bytes), 0)
          << x.tensor->name << (split ? " split" : " as stored");
    }
  }
}

TEST(CudaWorkspace, TheListNamesEveryBufferOnceAndSumsThem) {
  const TinyModel m;
  const WeightLayout layout = weight_layout(m.config, m.weights, true);
  const CudaWorkspace w = cuda_workspace(m.config, layout, 512, 4096, 3);
  std::set<std::string> names;
  uint64_t total = 0;
  for (const auto* list : {&w.buffers, &w.attention})
    for (const WorkspaceBuffer& b : *list) {
      EXPECT_TRUE(names.insert(std::string(b.name)).second) << b.name;
      EXPECT_EQ(w.bytes(b.name), b.bytes);
      total += b.bytes;
    }
  EXPECT_EQ(w.total(), total);
  EXPECT_EQ(w.load_bytes() + w.attention_bytes(), total);
  EXPECT_EQ(w.bytes("no such buffer"), 0u);
  // Beyond 64 rows the GEMM path's f16 scratch: the largest layer matrix; the overlap's second
  // scratch is as large.
  EXPECT_EQ(w.bytes("weight_f16"), 64u * 128u * 2u);
  EXPECT_EQ(w.overlap_bytes, w.bytes("weight_f16"));
  EXPECT_EQ(w.bytes("slot_bases"), 3u * 8u);
  EXPECT_EQ(w.bytes("hidden"), 512u * 64u * 4u);
  EXPECT_EQ(w.bytes("logits"), 64u * 384u * 4u);
  // Structured output's device copy: a status, then 64 rows of a header and 384 bits.
  EXPECT_EQ(w.bytes("token_masks"), 16u + 64u * (16u + 48u));
}

TEST(CudaWorkspace, SixtyFourRowsNeedNoGemmScratchAndTheInputsAreOneAlignedRegion) {
  const TinyModel m;
  const WeightLayout layout = weight_layout(m.config, m.weights, true);
  const CudaWorkspace w = cuda_workspace(m.config, layout, 16, 1000, 0);
  EXPECT_EQ(w.rows, 64);  // never fewer than the matvec path's 64
  EXPECT_EQ(w.bytes("weight_f16"), 0u);
  EXPECT_EQ(w.overlap_bytes, 0u);
  EXPECT_EQ(w.bytes("slot_bases"), 0u);
  // [8 x 64 int32][64 x 48-byte sampling parameters][64 int32][64 x 256 int32], each aligned.
  EXPECT_EQ(w.params_offset, 2048u);
  EXPECT_EQ(w.lengths_offset, 5120u);
  EXPECT_EQ(w.history_offset, 5376u);
  EXPECT_EQ(w.bytes("inputs"), 5376u + 64u * 256u * 4u);
  // Attention: decode rows in splits of 64 tokens (16 of them for 1000) beat prefill's one:
  // 64 rows x 4 heads x 16 splits x (16 + 2) floats; counters: 64 rows x 2 KV heads.
  EXPECT_EQ(w.bytes("attention_partial"), 64u * 4u * 16u * 18u * 4u);
  EXPECT_EQ(w.bytes("attention_counters"), 64u * 2u * 4u);
  // A longer context needs more scratch, nothing else changes.
  const CudaWorkspace longer = cuda_workspace(m.config, layout, 16, 8000, 0);
  EXPECT_GT(longer.attention_bytes(), w.attention_bytes());
  EXPECT_EQ(longer.load_bytes(), w.load_bytes());
}

}  // namespace
}  // namespace granule
