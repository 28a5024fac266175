// The GRANULE_* kernel overrides (engine/src/backends/kernel_config_env.cpp): each accepted value
// sets its knob, a value a variable does not accept keeps the knob and warns in one line naming
// the variable and the values it accepts, an empty value counts as unset, the process
// environment is read through the same parser, and kernels/README.md's table lists exactly the
// variables read.
#include "backends/kernel_config_env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>

namespace granule {
namespace {

using kernels::KernelConfig;

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

// The switches: each variable and the knob it sets.
struct Switch {
  const char* variable;
  std::function<bool(const KernelConfig&)> get;
  std::function<void(KernelConfig&, bool)> set;
};
const Switch kSwitches[] = {
    {"GRANULE_PDL", [](const KernelConfig& c) { return c.early_launch; },
     [](KernelConfig& c, bool on) { c.early_launch = on; }},
    {"GRANULE_SPLIT_WEIGHTS", [](const KernelConfig& c) { return c.split_weights; },
     [](KernelConfig& c, bool on) { c.split_weights = on; }},
    {"GRANULE_MMA", [](const KernelConfig& c) { return static_cast<bool>(c.mma); },
     [](KernelConfig& c, bool on) { c.mma = on ? KernelConfig{}.mma : decltype(c.mma){}; }},
    {"GRANULE_FLASH_PREFILL", [](const KernelConfig& c) { return c.flash_prefill; },
     [](KernelConfig& c, bool on) { c.flash_prefill = on; }},
};

// The row thresholds: each variable, its knob and its range.
struct Count {
  const char* variable;
  int KernelConfig::*knob;
  int lowest, highest;
};
const Count kCounts[] = {{"GRANULE_MMA_MIN_ROWS", &KernelConfig::mma_min_rows, 1, 1 << 20},
                         {"GRANULE_F16MMA_MIN_ROWS", &KernelConfig::f16_mma_min_rows, 0, 64}};

TEST(KernelConfigEnv, NothingSetGivesTheDefaults) {
  std::vector<std::string> warnings;
  const KernelConfig config = parse(FakeEnvironment{}, warnings);
  EXPECT_TRUE(config.early_launch);
  EXPECT_TRUE(config.split_weights);
  EXPECT_TRUE(config.mma);
  EXPECT_EQ(config.mma_min_rows, 8);
  EXPECT_EQ(config.f16_mma_min_rows, 17);
  EXPECT_TRUE(config.flash_prefill);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(describe(config), "early launch on, split weights on");
  EXPECT_EQ(describe_mma(config), "int8 mma from 8 rows, f16 mma from 17 rows");
  EXPECT_EQ(describe_attention(config), "flash prefill on");
}

TEST(KernelConfigEnv, SwitchesTakeZeroAndOne) {
  for (const Switch& s : kSwitches) {
    std::vector<std::string> warnings;
    const KernelConfig off = parse({{{s.variable, "0"}}}, warnings);
    EXPECT_FALSE(s.get(off)) << s.variable;
    KernelConfig start;
    s.set(start, false);
    const KernelConfig on = parse({{{s.variable, "1"}}}, warnings, start);
    EXPECT_TRUE(s.get(on)) << s.variable;
    EXPECT_TRUE(warnings.empty()) << s.variable;
    // Only its own knob moves.
    KernelConfig want;
    s.set(want, false);
    EXPECT_EQ(describe(off) + describe_mma(off) + describe_attention(off),
              describe(want) + describe_mma(want) + describe_attention(want))
        << s.variable;
  }
  std::vector<std::string> warnings;
  const KernelConfig off = parse({{{"GRANULE_PDL", "0"},
                                   {"GRANULE_SPLIT_WEIGHTS", "0"},
                                   {"GRANULE_MMA", "0"},
                                   {"GRANULE_FLASH_PREFILL", "0"},
                                   {"GRANULE_F16MMA_MIN_ROWS", "0"}}},
                                 warnings);
  EXPECT_EQ(describe(off), "early launch off, split weights off");
  EXPECT_EQ(describe_mma(off), "int8 mma off");
  EXPECT_EQ(describe_attention(off), "flash prefill off");
  // GRANULE_MMA=1 over a config with the products on keeps them as they are.
  EXPECT_EQ(parse({{{"GRANULE_MMA", "1"}}}, warnings).mma, KernelConfig{}.mma);
  EXPECT_TRUE(warnings.empty());
}

TEST(KernelConfigEnv, CountsTakeWholeNumbersInTheirRange) {
  for (const Count& c : kCounts) {
    for (const int value : {c.lowest, c.lowest + 1, 16, c.highest}) {
      std::vector<std::string> warnings;
      const KernelConfig config = parse({{{c.variable, std::to_string(value)}}}, warnings);
      EXPECT_EQ(config.*c.knob, value) << c.variable;
      EXPECT_TRUE(warnings.empty()) << c.variable << "=" << value;
    }
  }
  std::vector<std::string> warnings;
  const KernelConfig set =
      parse({{{"GRANULE_MMA_MIN_ROWS", "16"}, {"GRANULE_F16MMA_MIN_ROWS", "32"}}}, warnings);
  EXPECT_EQ(describe_mma(set), "int8 mma from 16 rows, f16 mma from 32 rows");
}

TEST(KernelConfigEnv, ABadValueKeepsTheKnobAndWarnsOnceNamingTheAcceptedValues) {
  for (const Switch& s : kSwitches) {
    for (const char* bad : {"no", "2", "on", " 1", "01"}) {
      std::vector<std::string> warnings;
      KernelConfig start;
      s.set(start, false);  // kept as it was, not reset to the default
      const KernelConfig config =
          parse({{{s.variable, bad}, {"GRANULE_MMA_MIN_ROWS", "12"}}}, warnings, start);
      EXPECT_FALSE(s.get(config)) << s.variable << "=" << bad;
      EXPECT_EQ(config.mma_min_rows, 12);  // the good value beside it applies
      ASSERT_EQ(warnings.size(), 1u) << s.variable << "=" << bad;
      EXPECT_EQ(warnings[0],
                std::string(s.variable) + "=" + bad + " ignored (accepted: 0, 1); keeping 0");
    }
  }
  for (const Count& c : kCounts) {
    for (const std::string& bad :
         {std::to_string(c.lowest - 1), std::to_string(c.highest + 1), std::string("8x"),
          std::string("99999999999"), std::string(" 4"), std::string("-3")}) {
      std::vector<std::string> warnings;
      KernelConfig start;
      start.*c.knob = 9;
      EXPECT_EQ(parse({{{c.variable, bad}}}, warnings, start).*c.knob, 9) << c.variable << bad;
      ASSERT_EQ(warnings.size(), 1u) << c.variable << "=" << bad;
      EXPECT_EQ(warnings[0],
                std::string(c.variable) + "=" + bad + " ignored (accepted: a whole number from " +
                    std::to_string(c.lowest) + " to " + std::to_string(c.highest) + "); keeping 9");
      EXPECT_EQ(warnings[0].find('\n'), std::string::npos);
    }
  }
}

TEST(KernelConfigEnv, AnEmptyValueCountsAsUnset) {
  FakeEnvironment env;
  for (const char* variable : kernel_override_variables()) env.values[variable] = "";
  KernelConfig start;
  start.early_launch = start.split_weights = start.flash_prefill = false;
  start.mma_min_rows = 3;
  start.f16_mma_min_rows = 0;
  std::vector<std::string> warnings;
  const KernelConfig config = parse(env, warnings, start);
  EXPECT_FALSE(config.early_launch || config.split_weights || config.flash_prefill);
  EXPECT_EQ(config.mma, KernelConfig{}.mma);
  EXPECT_EQ(config.mma_min_rows, 3);
  EXPECT_EQ(config.f16_mma_min_rows, 0);
  EXPECT_TRUE(warnings.empty());
}

TEST(KernelConfigEnv, TheProcessEnvironmentGoesThroughTheSameParser) {
  ASSERT_EQ(::setenv("GRANULE_MMA_MIN_ROWS", "24", 1), 0);
  ASSERT_EQ(::setenv("GRANULE_SPLIT_WEIGHTS", "0", 1), 0);
  ASSERT_EQ(::setenv("GRANULE_PDL", "bogus", 1), 0);  // warns in the log, keeps 1
  const KernelConfig config = kernel_config_from_environment();
  ::unsetenv("GRANULE_MMA_MIN_ROWS");
  ::unsetenv("GRANULE_SPLIT_WEIGHTS");
  ::unsetenv("GRANULE_PDL");
  EXPECT_EQ(config.mma_min_rows, 24);
  EXPECT_FALSE(config.split_weights);
  EXPECT_TRUE(config.early_launch);
  EXPECT_TRUE(kernel_config_from_environment().split_weights);  // read anew, nothing cached
}

// The knobs of kernels/README.md's table ("| `GRANULE_...` | values | default | reason |" rows)
// are exactly the variables read, and there are at most six (the product reads at most eight).
TEST(KernelConfigEnv, TheKernelsReadmeTableListsExactlyTheVariablesRead) {
  std::ifstream in(std::filesystem::path(GRANULE_SOURCE_DIR) / "kernels" / "README.md");
  ASSERT_TRUE(in) << "kernels/README.md not found";
  std::set<std::string> table;
  for (std::string line; std::getline(in, line);) {
    const std::string start = "| `GRANULE_";
    if (line.rfind(start, 0) != 0) continue;
    const size_t end = line.find('`', 3);
    ASSERT_NE(end, std::string::npos) << line;
    table.insert(line.substr(3, end - 3));
  }
  const std::set<std::string> read(kernel_override_variables().begin(),
                                   kernel_override_variables().end());
  EXPECT_EQ(read.size(), kernel_override_variables().size()) << "a variable listed twice";
  EXPECT_LE(read.size(), 6u);
  EXPECT_EQ(table, read);
  EXPECT_EQ(read, (std::set<std::string>{"GRANULE_PDL", "GRANULE_SPLIT_WEIGHTS", "GRANULE_MMA",
                                         "GRANULE_MMA_MIN_ROWS", "GRANULE_F16MMA_MIN_ROWS",
                                         "GRANULE_FLASH_PREFILL"}));
}

// The variables of the knobs measured and removed are no longer read: setting them changes
// nothing and warns nothing.
TEST(KernelConfigEnv, RemovedVariablesAreNotRead) {
  FakeEnvironment env;
  for (const char* variable :
       {"GRANULE_MATVEC_SHAPE", "GRANULE_SPLIT_SHAPE", "GRANULE_SPLIT_SHAPE_LONG",
        "GRANULE_PREFILL_OVERLAP", "GRANULE_ATTN_BLOCKS_PER_SM", "GRANULE_ATTN_WARPS",
        "GRANULE_DECODE_FUSION", "GRANULE_SPLIT_ROWS", "GRANULE_ATTN_EARLY",
        "GRANULE_EARLY_TRIGGER", "GRANULE_LATE_NORM", "GRANULE_GRAPH_IO",
        "GRANULE_ATTN_SPLIT_ONE_ROW"})
    env.values[variable] = "0";
  std::vector<std::string> warnings;
  const KernelConfig config = parse(env, warnings);
  EXPECT_EQ(
      describe(config) + describe_mma(config) + describe_attention(config),
      describe(KernelConfig{}) + describe_mma(KernelConfig{}) + describe_attention(KernelConfig{}));
  EXPECT_TRUE(warnings.empty());
}

}  // namespace
}  // namespace granule
