// Parses the GRANULE_* kernel overrides: each variable, the names it accepts and the knob
// of KernelConfig it sets.
#include "backends/kernel_config_env.h"

#include <cstdlib>
#include <string_view>

#include "granule/log.h"

namespace granule {
namespace {

using kernels::KernelConfig;
using kernels::MatvecShape;
using kernels::SplitShape;

constexpr const char* kMatvecShapeVariable = "GRANULE_MATVEC_SHAPE";
constexpr const char* kSplitShapeVariable = "GRANULE_SPLIT_SHAPE";
constexpr const char* kSplitShapeLongVariable = "GRANULE_SPLIT_SHAPE_LONG";
constexpr const char* kEarlyLaunchVariable = "GRANULE_PDL";
constexpr const char* kSplitWeightsVariable = "GRANULE_SPLIT_WEIGHTS";
constexpr const char* kMmaVariable = "GRANULE_MMA";
constexpr const char* kMmaMinRowsVariable = "GRANULE_MMA_MIN_ROWS";
constexpr const char* kFlashPrefillVariable = "GRANULE_FLASH_PREFILL";
constexpr const char* kPrefillOverlapVariable = "GRANULE_PREFILL_OVERLAP";
constexpr const char* kF16MmaMinRowsVariable = "GRANULE_F16MMA_MIN_ROWS";
constexpr const char* kAttentionBlocksVariable = "GRANULE_ATTN_BLOCKS_PER_SM";
constexpr const char* kAttentionWarpsVariable = "GRANULE_ATTN_WARPS";
constexpr const char* kDecodeFusionVariable = "GRANULE_DECODE_FUSION";
constexpr const char* kSplitRowsVariable = "GRANULE_SPLIT_ROWS";
constexpr const char* kAttentionEarlyVariable = "GRANULE_ATTN_EARLY";
constexpr const char* kEarlyTriggerVariable = "GRANULE_EARLY_TRIGGER";
constexpr const char* kLateNormVariable = "GRANULE_LATE_NORM";
constexpr const char* kGraphIoVariable = "GRANULE_GRAPH_IO";
constexpr const char* kOneRowSplitVariable = "GRANULE_ATTN_SPLIT_ONE_ROW";
constexpr const char* kVariables[] = {
    kMatvecShapeVariable,   kSplitShapeVariable,      kSplitShapeLongVariable,
    kEarlyLaunchVariable,   kSplitWeightsVariable,    kMmaVariable,
    kMmaMinRowsVariable,    kFlashPrefillVariable,    kPrefillOverlapVariable,
    kF16MmaMinRowsVariable, kAttentionBlocksVariable, kAttentionWarpsVariable,
    kDecodeFusionVariable,  kSplitRowsVariable,       kAttentionEarlyVariable,
    kEarlyTriggerVariable,  kLateNormVariable,        kGraphIoVariable,
    kOneRowSplitVariable};
// GRANULE_MMA_MIN_ROWS: a whole number of rows in this range.
constexpr int kMinRowsLowest = 1, kMinRowsHighest = 1 << 20;

// A value a variable accepts and the knob setting it stands for.
template <typename T>
struct Choice {
  std::string_view name;
  T value;
};

constexpr Choice<MatvecShape> kMatvecShapes[] = {{"64x2", MatvecShape::k64x2},
                                                 {"64x4", MatvecShape::k64x4},
                                                 {"128x4", MatvecShape::k128x4},
                                                 {"64x8", MatvecShape::k64x8},
                                                 {"32x4", MatvecShape::k32x4}};
constexpr Choice<SplitShape> kSplitShapes[] = {{"1x2", SplitShape::k1x2},
                                               {"1x4", SplitShape::k1x4},
                                               {"1x8", SplitShape::k1x8},
                                               {"2x4", SplitShape::k2x4}};
constexpr Choice<bool> kSwitch[] = {{"0", false}, {"1", true}};
constexpr Choice<int> kAttentionWarps[] = {{"auto", 0}, {"4", 4}, {"8", 8}};
constexpr Choice<int> kDecodeFusions[] = {{"0", 0}, {"1", 1}, {"2", 2}, {"3", 3}, {"4", 4}};
constexpr Choice<int> kSplitRowsModes[] = {{"0", 0}, {"1", 1}, {"2", 2}, {"3", 3}, {"4", 4}};
constexpr Choice<int> kAttentionEarlyModes[] = {{"0", 0}, {"1", 1}, {"2", 2}, {"3", 3}};
constexpr Choice<int> kEarlyTriggerModes[] = {{"0", 0}, {"1", 1}, {"2", 2}};
// None below 64: the attention workspace holds the splits of 64 tokens (cuda_model.cpp).
constexpr Choice<int> kOneRowSplits[] = {
    {"64", 64}, {"128", 128}, {"256", 256}, {"512", 512}, {"1024", 1024}};

template <typename T, size_t N>
std::string_view name_of(const Choice<T> (&choices)[N], T value) {
  for (const Choice<T>& c : choices)
    if (c.value == value) return c.name;
  return "?";
}

// Sets `knob` from `variable` when it names one of `choices`; otherwise warns and keeps it.
template <typename T, size_t N>
void apply(const char* variable, const Choice<T> (&choices)[N], T& knob,
           const EnvironmentLookup& lookup, std::vector<std::string>& warnings) {
  const char* raw = lookup(variable);
  if (!raw || !*raw) return;
  const std::string_view value(raw);
  for (const Choice<T>& c : choices) {
    if (c.name == value) {
      knob = c.value;
      return;
    }
  }
  std::string accepted;
  for (const Choice<T>& c : choices) (accepted += accepted.empty() ? "" : ", ") += c.name;
  warnings.push_back(std::string(variable) + "=" + std::string(value) + " ignored (accepted: " +
                     accepted + "); keeping " + std::string(name_of(choices, knob)));
}

// Sets `knob` from `variable` when it is a whole number in [lowest, highest]; otherwise
// warns and keeps it.
void apply_count(const char* variable, int lowest, int highest, int& knob,
                 const EnvironmentLookup& lookup, std::vector<std::string>& warnings) {
  const char* raw = lookup(variable);
  if (!raw || !*raw) return;
  const std::string_view value(raw);
  long long parsed = 0;
  bool ok = value.size() <= 9;
  for (const char c : value) {
    ok = ok && c >= '0' && c <= '9';
    parsed = parsed * 10 + (c - '0');
  }
  if (ok && parsed >= lowest && parsed <= highest) {
    knob = static_cast<int>(parsed);
    return;
  }
  warnings.push_back(std::string(variable) + "=" + std::string(value) +
                     " ignored (accepted: a whole number from " + std::to_string(lowest) + " to " +
                     std::to_string(highest) + "); keeping " + std::to_string(knob));
}

}  // namespace

std::span<const char* const> kernel_override_variables() { return kVariables; }

KernelConfig apply_kernel_overrides(KernelConfig config, const EnvironmentLookup& lookup,
                                    std::vector<std::string>& warnings) {
  apply(kMatvecShapeVariable, kMatvecShapes, config.matvec_shape, lookup, warnings);
  apply(kSplitShapeVariable, kSplitShapes, config.split_shape, lookup, warnings);
  apply(kSplitShapeLongVariable, kSplitShapes, config.split_shape_long, lookup, warnings);
  apply(kEarlyLaunchVariable, kSwitch, config.early_launch, lookup, warnings);
  apply(kSplitWeightsVariable, kSwitch, config.split_weights, lookup, warnings);
  apply(kMmaVariable, kSwitch, config.mma, lookup, warnings);
  apply_count(kMmaMinRowsVariable, kMinRowsLowest, kMinRowsHighest, config.mma_min_rows, lookup,
              warnings);
  apply(kFlashPrefillVariable, kSwitch, config.flash_prefill, lookup, warnings);
  apply(kPrefillOverlapVariable, kSwitch, config.prefill_overlap, lookup, warnings);
  apply_count(kF16MmaMinRowsVariable, 0, 64, config.f16_mma_min_rows, lookup, warnings);
  apply_count(kAttentionBlocksVariable, 1, 32, config.attention_blocks_per_sm, lookup, warnings);
  apply(kAttentionWarpsVariable, kAttentionWarps, config.attention_warps, lookup, warnings);
  apply(kDecodeFusionVariable, kDecodeFusions, config.decode_fusion, lookup, warnings);
  apply(kSplitRowsVariable, kSplitRowsModes, config.split_rows, lookup, warnings);
  apply(kAttentionEarlyVariable, kAttentionEarlyModes, config.attention_early, lookup, warnings);
  apply(kEarlyTriggerVariable, kEarlyTriggerModes, config.early_trigger, lookup, warnings);
  apply(kLateNormVariable, kSwitch, config.late_norm, lookup, warnings);
  apply(kGraphIoVariable, kSwitch, config.graph_io, lookup, warnings);
  apply(kOneRowSplitVariable, kOneRowSplits, config.one_row_split_tokens, lookup, warnings);
  return config;
}

KernelConfig kernel_config_from_environment() {
  std::vector<std::string> warnings;
  const KernelConfig config = apply_kernel_overrides(
      KernelConfig{}, [](const char* variable) { return std::getenv(variable); }, warnings);
  for (const std::string& w : warnings) logger("engine.cuda")->warn("{}", w);
  return config;
}

std::string describe(const KernelConfig& config) {
  auto on_off = [](bool on) { return on ? "on" : "off"; };
  return "matvec " + std::string(name_of(kMatvecShapes, config.matvec_shape)) + ", split " +
         std::string(name_of(kSplitShapes, config.split_shape)) + " (long rows " +
         std::string(name_of(kSplitShapes, config.split_shape_long)) + "), early launch " +
         on_off(config.early_launch) + ", split weights " + on_off(config.split_weights);
}

std::string describe_mma(const KernelConfig& config) {
  const std::string f16 =
      config.f16_mma_min_rows > 0
          ? ", f16 mma from " + std::to_string(config.f16_mma_min_rows) + " rows"
          : "";
  if (!config.mma) return "int8 mma off" + f16;
  return "int8 mma from " + std::to_string(config.mma_min_rows) + " rows" + f16;
}

std::string describe_attention(const KernelConfig& config) {
  return std::string("flash prefill ") + (config.flash_prefill ? "on" : "off") +
         ", decode splits for " + std::to_string(config.attention_blocks_per_sm) +
         " blocks per SM of " +
         (config.attention_warps ? std::to_string(config.attention_warps) : std::string("4 or 8")) +
         " warps, batch-1 fusion " + std::to_string(config.decode_fusion) + ", staying warps " +
         std::to_string(config.split_rows) +
         (config.attention_early ? ", attention early " + std::to_string(config.attention_early)
                                 : std::string()) +
         (config.early_trigger ? ", early trigger " + std::to_string(config.early_trigger)
                               : std::string()) +
         (config.late_norm ? ", late norm" : "") +
         (config.graph_io ? ", step copies in the graph" : "") +
         (config.one_row_split_tokens != KernelConfig{}.one_row_split_tokens
              ? ", one-row splits of " + std::to_string(config.one_row_split_tokens) + " tokens"
              : std::string());
}

std::string describe_prefill_overlap(const KernelConfig& config) {
  return std::string("prefill dequantisation overlap ") + (config.prefill_overlap ? "on" : "off");
}

}  // namespace granule
