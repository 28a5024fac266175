// The GRANULE_* kernel overrides (engine/src/backends/kernel_config_env.cpp): each accepted value
// sets its knob, a value a variable does not accept keeps the knob and warns in one line
// naming the variable and the values it accepts, an empty value counts as unset, the process
// environment is read through the same parser, and the README lists every variable.
#include "backends/kernel_config_env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

namespace granule {
namespace {

using kernels::KernelConfig;
using kernels::MatvecShape;
using kernels::SplitShape;

// An environment of its own, so the tests never depend on the process's.
struct FakeEnvironment {
  std::map<std::string, std::string> values;
  EnvironmentLookup lookup() const {
    return [this](const char* variable) -> const char* {
      const auto it = values.find(variable);
      return it == values.end() ? nullptr : it->second.c_str();
    };
  }
};

KernelConfig parse(const FakeEnvironment& env, std::vector<std::string>& warnings,
                   KernelConfig config = {}) {
  return apply_kernel_overrides(config, env.lookup(), warnings);
}

TEST(KernelConfigEnv, NothingSetGivesTheDefaults) {
  std::vector<std::string> warnings;
  const KernelConfig config = parse(FakeEnvironment{}, warnings);
  EXPECT_EQ(config.matvec_shape, MatvecShape::k64x2);
  EXPECT_EQ(config.split_shape, SplitShape::k1x2);
  EXPECT_EQ(config.split_shape_long, SplitShape::k1x2);
  EXPECT_TRUE(config.early_launch);
  EXPECT_TRUE(config.split_weights);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(describe(config),
            "matvec 64x2, split 1x2 (long rows 1x2), early launch on, split weights on");
}

TEST(KernelConfigEnv, EveryAcceptedMatvecShapeSetsIt) {
  const std::pair<const char*, MatvecShape> cases[] = {{"64x2", MatvecShape::k64x2},
                                                       {"64x4", MatvecShape::k64x4},
                                                       {"128x4", MatvecShape::k128x4},
                                                       {"64x8", MatvecShape::k64x8},
                                                       {"32x4", MatvecShape::k32x4}};
  for (const auto& [value, shape] : cases) {
    std::vector<std::string> warnings;
    const KernelConfig config = parse({{{"GRANULE_MATVEC_SHAPE", value}}}, warnings);
    EXPECT_EQ(config.matvec_shape, shape) << value;
    EXPECT_TRUE(warnings.empty()) << value;
  }
}

TEST(KernelConfigEnv, SplitShapesSetTheirOwnKindOfRow) {
  const std::pair<const char*, SplitShape> cases[] = {{"1x2", SplitShape::k1x2},
                                                      {"1x4", SplitShape::k1x4},
                                                      {"1x8", SplitShape::k1x8},
                                                      {"2x4", SplitShape::k2x4}};
  for (const auto& [value, shape] : cases) {
    std::vector<std::string> warnings;
    const KernelConfig short_rows = parse({{{"GRANULE_SPLIT_SHAPE", value}}}, warnings);
    EXPECT_EQ(short_rows.split_shape, shape) << value;
    EXPECT_EQ(short_rows.split_shape_long, SplitShape::k1x2) << value;
    const KernelConfig long_rows = parse({{{"GRANULE_SPLIT_SHAPE_LONG", value}}}, warnings);
    EXPECT_EQ(long_rows.split_shape, SplitShape::k1x2) << value;
    EXPECT_EQ(long_rows.split_shape_long, shape) << value;
    EXPECT_TRUE(warnings.empty()) << value;
  }
}

TEST(KernelConfigEnv, SwitchesTakeZeroAndOne) {
  std::vector<std::string> warnings;
  const KernelConfig off =
      parse({{{"GRANULE_PDL", "0"}, {"GRANULE_SPLIT_WEIGHTS", "0"}}}, warnings);
  EXPECT_FALSE(off.early_launch);
  EXPECT_FALSE(off.split_weights);
  EXPECT_EQ(describe(off),
            "matvec 64x2, split 1x2 (long rows 1x2), early launch off, split weights off");
  KernelConfig start;
  start.early_launch = false;
  start.split_weights = false;
  const KernelConfig on =
      parse({{{"GRANULE_PDL", "1"}, {"GRANULE_SPLIT_WEIGHTS", "1"}}}, warnings, start);
  EXPECT_TRUE(on.early_launch);
  EXPECT_TRUE(on.split_weights);
  EXPECT_TRUE(warnings.empty());
}

TEST(KernelConfigEnv, ABadValueKeepsTheKnobAndWarnsOnceNamingTheAcceptedValues) {
  std::vector<std::string> warnings;
  KernelConfig start;
  start.matvec_shape = MatvecShape::k128x4;  // kept as it was, not reset to the default
  const KernelConfig config = parse({{{"GRANULE_MATVEC_SHAPE", "96x2"},
                                      {"GRANULE_SPLIT_SHAPE_LONG", "2x4"},
                                      {"GRANULE_PDL", "no"}}},
                                    warnings, start);
  EXPECT_EQ(config.matvec_shape, MatvecShape::k128x4);
  EXPECT_TRUE(config.early_launch);
  EXPECT_EQ(config.split_shape_long, SplitShape::k2x4);  // the good value beside them applies
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_EQ(warnings[0],
            "GRANULE_MATVEC_SHAPE=96x2 ignored (accepted: 64x2, 64x4, 128x4, 64x8, 32x4); "
            "keeping 128x4");
  EXPECT_EQ(warnings[1], "GRANULE_PDL=no ignored (accepted: 0, 1); keeping 1");
  for (const std::string& w : warnings) EXPECT_EQ(w.find('\n'), std::string::npos) << w;
}

TEST(KernelConfigEnv, MmaSwitchesAndTheirRowThreshold) {
  std::vector<std::string> warnings;
  const KernelConfig defaults = parse(FakeEnvironment{}, warnings);
  EXPECT_TRUE(defaults.mma);
  EXPECT_EQ(defaults.mma_min_rows, 8);
  EXPECT_EQ(describe_mma(defaults), "int8 mma from 8 rows, f16 mma from 17 rows");
  const KernelConfig set = parse({{{"GRANULE_MMA_MIN_ROWS", "16"}}}, warnings);
  EXPECT_EQ(set.mma_min_rows, 16);
  EXPECT_EQ(describe_mma(set), "int8 mma from 16 rows, f16 mma from 17 rows");
  EXPECT_FALSE(parse({{{"GRANULE_MMA", "0"}}}, warnings).mma);
  EXPECT_EQ(describe_mma(parse({{{"GRANULE_MMA", "0"}}}, warnings)),
            "int8 mma off, f16 mma from 17 rows");
  EXPECT_TRUE(parse({{{"GRANULE_MMA", "1"}}}, warnings).mma);
  EXPECT_TRUE(warnings.empty());
  // The kernel is the device's choice now: the old version numbers are refused.
  KernelConfig off;
  off.mma = false;
  EXPECT_FALSE(parse({{{"GRANULE_MMA", "2"}}}, warnings, off).mma);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "GRANULE_MMA=2 ignored (accepted: 0, 1); keeping 0");
  for (const char* bad : {"0", "-3", "8x", "99999999999", " 4"}) {
    std::vector<std::string> w;
    EXPECT_EQ(parse({{{"GRANULE_MMA_MIN_ROWS", bad}}}, w, set).mma_min_rows, 16) << bad;
    ASSERT_EQ(w.size(), 1u) << bad;
    EXPECT_EQ(w[0], "GRANULE_MMA_MIN_ROWS=" + std::string(bad) +
                        " ignored (accepted: a whole number from 1 to 1048576); keeping 16");
  }
}

TEST(KernelConfigEnv, FlashPrefillSwitch) {
  std::vector<std::string> warnings;
  const KernelConfig defaults = parse(FakeEnvironment{}, warnings);
  EXPECT_TRUE(defaults.flash_prefill);
  EXPECT_EQ(describe_attention(defaults),
            "flash prefill on, decode splits for 3 blocks per SM of 4 or 8 warps, batch-1 "
            "fusion " +
                std::to_string(KernelConfig{}.decode_fusion) + ", staying warps " +
                std::to_string(KernelConfig{}.split_rows) +
                ", attention early 3, late norm, step copies in the graph");
  const KernelConfig off = parse({{{"GRANULE_FLASH_PREFILL", "0"}}}, warnings);
  EXPECT_FALSE(off.flash_prefill);
  EXPECT_EQ(describe_attention(off),
            "flash prefill off, decode splits for 3 blocks per SM of 4 or 8 warps, batch-1 "
            "fusion " +
                std::to_string(KernelConfig{}.decode_fusion) + ", staying warps " +
                std::to_string(KernelConfig{}.split_rows) +
                ", attention early 3, late norm, step copies in the graph");
  EXPECT_TRUE(parse({{{"GRANULE_FLASH_PREFILL", "1"}}}, warnings, off).flash_prefill);
  EXPECT_TRUE(warnings.empty());
  EXPECT_FALSE(parse({{{"GRANULE_FLASH_PREFILL", "yes"}}}, warnings, off).flash_prefill);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "GRANULE_FLASH_PREFILL=yes ignored (accepted: 0, 1); keeping 0");
}

TEST(KernelConfigEnv, PrefillOverlapSwitch) {
  std::vector<std::string> warnings;
  const KernelConfig defaults = parse(FakeEnvironment{}, warnings);
  EXPECT_TRUE(defaults.prefill_overlap);
  EXPECT_EQ(describe_prefill_overlap(defaults), "prefill dequantisation overlap on");
  const KernelConfig off = parse({{{"GRANULE_PREFILL_OVERLAP", "0"}}}, warnings);
  EXPECT_FALSE(off.prefill_overlap);
  EXPECT_TRUE(off.flash_prefill);  // the other switches keep their defaults
  EXPECT_EQ(describe_prefill_overlap(off), "prefill dequantisation overlap off");
  EXPECT_TRUE(parse({{{"GRANULE_PREFILL_OVERLAP", "1"}}}, warnings, off).prefill_overlap);
  EXPECT_FALSE(parse({{{"GRANULE_PREFILL_OVERLAP", ""}}}, warnings, off).prefill_overlap);
  EXPECT_TRUE(warnings.empty());
  EXPECT_FALSE(parse({{{"GRANULE_PREFILL_OVERLAP", "off"}}}, warnings, off).prefill_overlap);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "GRANULE_PREFILL_OVERLAP=off ignored (accepted: 0, 1); keeping 0");
}

TEST(KernelConfigEnv, F16MmaMinRows) {
  std::vector<std::string> warnings;
  const KernelConfig defaults = parse(FakeEnvironment{}, warnings);
  EXPECT_EQ(defaults.f16_mma_min_rows, KernelConfig{}.f16_mma_min_rows);
  const KernelConfig set = parse({{{"GRANULE_F16MMA_MIN_ROWS", "16"}}}, warnings);
  EXPECT_EQ(set.f16_mma_min_rows, 16);
  EXPECT_NE(describe_mma(set).find(", f16 mma from 16 rows"), std::string::npos)
      << describe_mma(set);
  const KernelConfig off = parse({{{"GRANULE_F16MMA_MIN_ROWS", "0"}}}, warnings, set);
  EXPECT_EQ(off.f16_mma_min_rows, 0);
  EXPECT_EQ(describe_mma(off).find("f16"), std::string::npos) << describe_mma(off);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(parse({{{"GRANULE_F16MMA_MIN_ROWS", "65"}}}, warnings, set).f16_mma_min_rows, 16);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(
      warnings[0],
      "GRANULE_F16MMA_MIN_ROWS=65 ignored (accepted: a whole number from 0 to 64); keeping 16");
}

TEST(KernelConfigEnv, AttentionBlocksPerSm) {
  std::vector<std::string> warnings;
  EXPECT_EQ(parse(FakeEnvironment{}, warnings).attention_blocks_per_sm, 3);
  const KernelConfig set = parse({{{"GRANULE_ATTN_BLOCKS_PER_SM", "8"}}}, warnings);
  EXPECT_EQ(set.attention_blocks_per_sm, 8);
  EXPECT_NE(describe_attention(set).find("decode splits for 8 blocks per SM"), std::string::npos)
      << describe_attention(set);
  EXPECT_EQ(parse(FakeEnvironment{}, warnings).attention_warps, 0);  // auto
  EXPECT_EQ(parse({{{"GRANULE_ATTN_WARPS", "8"}}}, warnings).attention_warps, 8);
  EXPECT_EQ(parse({{{"GRANULE_ATTN_WARPS", "4"}}}, warnings).attention_warps, 4);
  const KernelConfig automatic = parse({{{"GRANULE_ATTN_WARPS", "auto"}}}, warnings);
  EXPECT_EQ(automatic.attention_warps, 0);
  EXPECT_NE(describe_attention(automatic).find("of 4 or 8 warps"), std::string::npos)
      << describe_attention(automatic);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(parse({{{"GRANULE_ATTN_WARPS", "6"}}}, warnings).attention_warps, 0);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "GRANULE_ATTN_WARPS=6 ignored (accepted: auto, 4, 8); keeping auto");
  warnings.clear();
  EXPECT_EQ(parse({{{"GRANULE_ATTN_BLOCKS_PER_SM", "0"}}}, warnings, set).attention_blocks_per_sm,
            8);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0],
            "GRANULE_ATTN_BLOCKS_PER_SM=0 ignored (accepted: a whole number from 1 to 32); "
            "keeping 8");
}

TEST(KernelConfigEnv, AnEmptyValueCountsAsUnset) {
  std::vector<std::string> warnings;
  const KernelConfig config =
      parse({{{"GRANULE_SPLIT_SHAPE", ""}, {"GRANULE_SPLIT_WEIGHTS", ""}}}, warnings);
  EXPECT_EQ(config.split_shape, SplitShape::k1x2);
  EXPECT_TRUE(config.split_weights);
  EXPECT_TRUE(warnings.empty());
}

TEST(KernelConfigEnv, TheProcessEnvironmentGoesThroughTheSameParser) {
  ASSERT_EQ(::setenv("GRANULE_SPLIT_SHAPE", "2x4", 1), 0);
  ASSERT_EQ(::setenv("GRANULE_SPLIT_WEIGHTS", "0", 1), 0);
  ASSERT_EQ(::setenv("GRANULE_MATVEC_SHAPE", "bogus", 1), 0);  // warns in the log, keeps 64x2
  const KernelConfig config = kernel_config_from_environment();
  ::unsetenv("GRANULE_SPLIT_SHAPE");
  ::unsetenv("GRANULE_SPLIT_WEIGHTS");
  ::unsetenv("GRANULE_MATVEC_SHAPE");
  EXPECT_EQ(config.split_shape, SplitShape::k2x4);
  EXPECT_FALSE(config.split_weights);
  EXPECT_EQ(config.matvec_shape, MatvecShape::k64x2);
  EXPECT_TRUE(kernel_config_from_environment().split_weights);  // read anew, nothing cached
}

TEST(KernelConfigEnv, DecodeFusion) {
  std::vector<std::string> warnings;
  EXPECT_EQ(parse(FakeEnvironment{}, warnings).decode_fusion, 4);
  const KernelConfig off = parse({{{"GRANULE_DECODE_FUSION", "0"}}}, warnings);
  EXPECT_EQ(off.decode_fusion, 0);
  EXPECT_NE(describe_attention(off).find("batch-1 fusion 0"), std::string::npos)
      << describe_attention(off);
  EXPECT_EQ(parse({{{"GRANULE_DECODE_FUSION", "1"}}}, warnings).decode_fusion, 1);
  EXPECT_EQ(parse({{{"GRANULE_DECODE_FUSION", "2"}}}, warnings).decode_fusion, 2);
  EXPECT_EQ(parse({{{"GRANULE_DECODE_FUSION", "3"}}}, warnings).decode_fusion, 3);
  EXPECT_EQ(parse({{{"GRANULE_DECODE_FUSION", "4"}}}, warnings).decode_fusion, 4);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(parse({{{"GRANULE_DECODE_FUSION", "5"}}}, warnings, off).decode_fusion, 0);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "GRANULE_DECODE_FUSION=5 ignored (accepted: 0, 1, 2, 3, 4); keeping 0");
}

TEST(KernelConfigEnv, SplitRows) {
  std::vector<std::string> warnings;
  EXPECT_EQ(parse(FakeEnvironment{}, warnings).split_rows, KernelConfig{}.split_rows);
  const KernelConfig one = parse({{{"GRANULE_SPLIT_ROWS", "1"}}}, warnings);
  EXPECT_EQ(one.split_rows, 1);
  EXPECT_NE(describe_attention(one).find("staying warps 1"), std::string::npos)
      << describe_attention(one);
  EXPECT_EQ(parse({{{"GRANULE_SPLIT_ROWS", "0"}}}, warnings).split_rows, 0);
  EXPECT_EQ(parse({{{"GRANULE_SPLIT_ROWS", "2"}}}, warnings).split_rows, 2);
  EXPECT_EQ(parse({{{"GRANULE_SPLIT_ROWS", "3"}}}, warnings).split_rows, 3);
  EXPECT_EQ(parse({{{"GRANULE_SPLIT_ROWS", "4"}}}, warnings).split_rows, 4);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(parse({{{"GRANULE_SPLIT_ROWS", "5"}}}, warnings, one).split_rows, 1);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "GRANULE_SPLIT_ROWS=5 ignored (accepted: 0, 1, 2, 3, 4); keeping 1");
}

TEST(KernelConfigEnv, AttentionEarly) {
  std::vector<std::string> warnings;
  EXPECT_EQ(parse(FakeEnvironment{}, warnings).attention_early, 3);
  const KernelConfig none = parse({{{"GRANULE_ATTN_EARLY", "0"}}}, warnings);
  EXPECT_EQ(none.attention_early, 0);
  EXPECT_EQ(describe_attention(none).find("attention early"), std::string::npos)
      << describe_attention(none);
  const KernelConfig both = parse({{{"GRANULE_ATTN_EARLY", "3"}}}, warnings);
  EXPECT_EQ(both.attention_early, 3);
  EXPECT_NE(describe_attention(both).find("attention early 3"), std::string::npos)
      << describe_attention(both);
  EXPECT_EQ(parse({{{"GRANULE_ATTN_EARLY", "1"}}}, warnings).attention_early, 1);
  EXPECT_EQ(parse({{{"GRANULE_ATTN_EARLY", "2"}}}, warnings).attention_early, 2);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(parse({{{"GRANULE_ATTN_EARLY", "4"}}}, warnings, both).attention_early, 3);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "GRANULE_ATTN_EARLY=4 ignored (accepted: 0, 1, 2, 3); keeping 3");
}

TEST(KernelConfigEnv, EarlyTrigger) {
  std::vector<std::string> warnings;
  const KernelConfig none = parse(FakeEnvironment{}, warnings);
  EXPECT_EQ(none.early_trigger, 0);
  EXPECT_EQ(describe_attention(none).find("early trigger"), std::string::npos)
      << describe_attention(none);
  const KernelConfig all = parse({{{"GRANULE_EARLY_TRIGGER", "2"}}}, warnings);
  EXPECT_EQ(all.early_trigger, 2);
  EXPECT_NE(describe_attention(all).find("early trigger 2"), std::string::npos)
      << describe_attention(all);
  EXPECT_EQ(parse({{{"GRANULE_EARLY_TRIGGER", "1"}}}, warnings).early_trigger, 1);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(parse({{{"GRANULE_EARLY_TRIGGER", "3"}}}, warnings, all).early_trigger, 2);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "GRANULE_EARLY_TRIGGER=3 ignored (accepted: 0, 1, 2); keeping 2");
}

TEST(KernelConfigEnv, LateNorm) {
  std::vector<std::string> warnings;
  EXPECT_TRUE(parse(FakeEnvironment{}, warnings).late_norm);
  const KernelConfig off = parse({{{"GRANULE_LATE_NORM", "0"}}}, warnings);
  EXPECT_FALSE(off.late_norm);
  EXPECT_EQ(describe_attention(off).find("late norm"), std::string::npos)
      << describe_attention(off);
  const KernelConfig on = parse({{{"GRANULE_LATE_NORM", "1"}}}, warnings);
  EXPECT_TRUE(on.late_norm);
  EXPECT_NE(describe_attention(on).find("late norm"), std::string::npos) << describe_attention(on);
  EXPECT_TRUE(warnings.empty());
  EXPECT_TRUE(parse({{{"GRANULE_LATE_NORM", "yes"}}}, warnings, on).late_norm);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "GRANULE_LATE_NORM=yes ignored (accepted: 0, 1); keeping 1");
}

TEST(KernelConfigEnv, GraphIo) {
  std::vector<std::string> warnings;
  EXPECT_TRUE(parse(FakeEnvironment{}, warnings).graph_io);
  const KernelConfig off = parse({{{"GRANULE_GRAPH_IO", "0"}}}, warnings);
  EXPECT_FALSE(off.graph_io);
  EXPECT_EQ(describe_attention(off).find("step copies in the graph"), std::string::npos);
  const KernelConfig on = parse({{{"GRANULE_GRAPH_IO", "1"}}}, warnings);
  EXPECT_TRUE(on.graph_io);
  EXPECT_NE(describe_attention(on).find("step copies in the graph"), std::string::npos)
      << describe_attention(on);
  EXPECT_TRUE(warnings.empty());
  EXPECT_FALSE(parse({{{"GRANULE_GRAPH_IO", "on"}}}, warnings, off).graph_io);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "GRANULE_GRAPH_IO=on ignored (accepted: 0, 1); keeping 0");
}

TEST(KernelConfigEnv, OneRowSplitTokens) {
  std::vector<std::string> warnings;
  const KernelConfig defaults = parse(FakeEnvironment{}, warnings);
  EXPECT_EQ(defaults.one_row_split_tokens, 64);
  EXPECT_EQ(describe_attention(defaults).find("one-row splits"), std::string::npos);
  const KernelConfig wide = parse({{{"GRANULE_ATTN_SPLIT_ONE_ROW", "256"}}}, warnings);
  EXPECT_EQ(wide.one_row_split_tokens, 256);
  EXPECT_NE(describe_attention(wide).find("one-row splits of 256 tokens"), std::string::npos)
      << describe_attention(wide);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(parse({{{"GRANULE_ATTN_SPLIT_ONE_ROW", "100"}}}, warnings, wide).one_row_split_tokens,
            256);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0],
            "GRANULE_ATTN_SPLIT_ONE_ROW=100 ignored (accepted: 64, 128, 256, 512, 1024); keeping "
            "256");
}

TEST(KernelConfigEnv, TheReadmeListsEveryVariable) {
  std::ifstream in(std::filesystem::path(GRANULE_SOURCE_DIR) / "README.md");
  ASSERT_TRUE(in) << "README.md not found";
  std::stringstream text;
  text << in.rdbuf();
  ASSERT_EQ(kernel_override_variables().size(), 19u);
  for (const char* variable : kernel_override_variables())
    EXPECT_NE(text.str().find("`" + std::string(variable) + "`"), std::string::npos)
        << variable << " is missing from the README's table of overrides";
}

}  // namespace
}  // namespace granule
