// Parses the GRANULE_* kernel overrides: each variable, the values it accepts and the knob of
// KernelConfig it sets (kernels/README.md's table gives each one's measured reason).
#include "backends/kernel_config_env.h"

#include <cstdlib>
#include <string_view>
#include <type_traits>

#include "granule/log.h"

namespace granule {
namespace {

using kernels::KernelConfig;

constexpr const char* kEarlyLaunchVariable = "GRANULE_PDL";
constexpr const char* kSplitWeightsVariable = "GRANULE_SPLIT_WEIGHTS";
constexpr const char* kMmaVariable = "GRANULE_MMA";
constexpr const char* kMmaMinRowsVariable = "GRANULE_MMA_MIN_ROWS";
constexpr const char* kF16MmaMinRowsVariable = "GRANULE_F16MMA_MIN_ROWS";
constexpr const char* kFlashPrefillVariable = "GRANULE_FLASH_PREFILL";
constexpr const char* kVariables[] = {kEarlyLaunchVariable,   kSplitWeightsVariable,
                                      kMmaVariable,           kMmaMinRowsVariable,
                                      kF16MmaMinRowsVariable, kFlashPrefillVariable};

// A whole number of rows in [lowest, highest].
struct Count {
  int lowest, highest;
};
constexpr Count kMmaMinRows{1, 1 << 20}, kF16MmaMinRows{0, 64};

// Reads `variable` as a switch ("0" or "1") into `on`; warns and keeps it on any other value.
void apply_switch(const char* variable, bool& on, const EnvironmentLookup& lookup,
                  std::vector<std::string>& warnings) {
  const char* raw = lookup(variable);
  if (!raw || !*raw) return;
  const std::string_view value(raw);
  if (value == "0" || value == "1") {
    on = value == "1";
    return;
  }
  warnings.push_back(std::string(variable) + "=" + std::string(value) +
                     " ignored (accepted: 0, 1); keeping " + (on ? "1" : "0"));
}

// Reads `variable` as a whole number in `range` into `knob`; warns and keeps it otherwise.
void apply_count(const char* variable, Count range, int& knob, const EnvironmentLookup& lookup,
                 std::vector<std::string>& warnings) {
  const char* raw = lookup(variable);
  if (!raw || !*raw) return;
  const std::string_view value(raw);
  long long parsed = 0;
  bool ok = value.size() <= 9;
  for (const char c : value) {
    ok = ok && c >= '0' && c <= '9';
    parsed = parsed * 10 + (c - '0');
  }
  if (ok && parsed >= range.lowest && parsed <= range.highest) {
    knob = static_cast<int>(parsed);
    return;
  }
  warnings.push_back(std::string(variable) + "=" + std::string(value) +
                     " ignored (accepted: a whole number from " + std::to_string(range.lowest) +
                     " to " + std::to_string(range.highest) + "); keeping " + std::to_string(knob));
}

}  // namespace

std::span<const char* const> kernel_override_variables() { return kVariables; }

KernelConfig apply_kernel_overrides(KernelConfig config, const EnvironmentLookup& lookup,
                                    std::vector<std::string>& warnings) {
  apply_switch(kEarlyLaunchVariable, config.early_launch, lookup, warnings);
  apply_switch(kSplitWeightsVariable, config.split_weights, lookup, warnings);
  // GRANULE_MMA=1 keeps the default products (the kernel version is the device's fit), 0 the
  // dp4a kernels.
  bool mma = static_cast<bool>(config.mma);
  apply_switch(kMmaVariable, mma, lookup, warnings);
  using Mma = std::remove_reference_t<decltype(config.mma)>;
  config.mma = !mma ? Mma{} : config.mma ? config.mma : KernelConfig{}.mma;
  apply_count(kMmaMinRowsVariable, kMmaMinRows, config.mma_min_rows, lookup, warnings);
  apply_count(kF16MmaMinRowsVariable, kF16MmaMinRows, config.f16_mma_min_rows, lookup, warnings);
  apply_switch(kFlashPrefillVariable, config.flash_prefill, lookup, warnings);
  return config;
}

KernelConfig kernel_config_from_environment() {
  std::vector<std::string> warnings;
  const KernelConfig config = apply_kernel_overrides(
      KernelConfig{}, [](const char* variable) { return std::getenv(variable); }, warnings);
  for (const std::string& w : warnings) logger("engine.cuda")->warn("{}", w);
  return config;
}

namespace {
const char* on_off(bool on) { return on ? "on" : "off"; }
}  // namespace

std::string describe(const KernelConfig& config) {
  return std::string("early launch ") + on_off(config.early_launch) + ", split weights " +
         on_off(config.split_weights);
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
  return std::string("flash prefill ") + on_off(config.flash_prefill);
}

}  // namespace granule
