// The GRANULE_* environment overrides of the kernel configuration (kernels/kernel_config.h),
// parsed in this one place and listed in the README. Plain C++, in every build, so the
// parsing is tested without a GPU; the CUDA backend reads the environment once, at start.
#pragma once
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kernel_config.h"

namespace granule {

// Every variable apply_kernel_overrides() reads, in the README's order.
std::span<const char* const> kernel_override_variables();

// Returns a variable's value, or null when it is not set.
using EnvironmentLookup = std::function<const char*(const char* variable)>;

// `config` with each override that `lookup` finds applied. A variable set to a value it does
// not accept leaves its knob as it was and adds one line to `warnings` naming the variable,
// the values it accepts and the value kept. An empty value counts as not set.
kernels::KernelConfig apply_kernel_overrides(kernels::KernelConfig config,
                                             const EnvironmentLookup& lookup,
                                             std::vector<std::string>& warnings);

// The defaults with the process environment's overrides; each warning goes to the
// engine.cuda log.
kernels::KernelConfig kernel_config_from_environment();

// One line for the log: "matvec 64x2, split 1x2 (long rows 1x2), early launch on, split
// weights on".
std::string describe(const kernels::KernelConfig& config);

// One line for the log on the tensor-core products: "int8 mma from 8 rows, f16 mma from 17
// rows", "int8 mma off, f16 mma from 17 rows", "int8 mma from 8 rows" (f16 off).
std::string describe_mma(const kernels::KernelConfig& config);

// One line for the log on the prefill attention kernel: "flash prefill on" or "flash prefill
// off".
std::string describe_attention(const kernels::KernelConfig& config);

// One line for the log on the GEMM path's dequantisation on a second stream: "prefill
// dequantisation overlap on" or "... off".
std::string describe_prefill_overlap(const kernels::KernelConfig& config);

}  // namespace granule
