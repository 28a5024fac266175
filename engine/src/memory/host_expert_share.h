// The share of a decode run's missed experts (those not in VRAM, which few rows chose) that the
// host's CPU computes from its own int8 copies while PCIe carries the rest (the CUDA backend's
// host experts, cuda_moe_host.cpp; EngineOptions::host_expert_share): one rule for the backend
// and the fit preview. Plain C++, header only.
#pragma once
#include <algorithm>

namespace granule {

// Runs of more rows stage every miss (a prefill chunk's experts are chosen by many rows).
constexpr int kHostExpertMaxRows = 64;
// The default rule (setting -1): every candidate in runs of kHostExpertAutoMinRows or more rows,
// kHostExpertAutoSmallShare of them in smaller runs. H100, qwen3-30b-a3b shape at a 52 %
// budget, 2026-12-07 (one run each, the host's pools kept awake): batch 1 gave 68.5 t/s with
// every miss staged, 75.3 with the host taking 64/256 of them, 79.0 with 96, 95.8 with 128,
// 101.6 with 160, 109.7 with 192 and 66.3 with all; 160 keeps clear of the fall past 192 on a
// slower host. At 16 chats, all of them gave 193.4 against 171.7 with sleeping pools.
constexpr int kHostExpertAutoMinRows = 8;
constexpr int kHostExpertAutoSmallShare = 160;

// The share in 256ths for a run of `rows` rows: setting 0 none, 1..256 that share, -1 (or any
// negative) the default rule; none past kHostExpertMaxRows rows.
inline int host_expert_share_at(int setting, int rows) {
  if (setting == 0 || rows < 1 || rows > kHostExpertMaxRows) return 0;
  if (setting > 0) return std::min(setting, 256);
  return rows >= kHostExpertAutoMinRows ? 256 : kHostExpertAutoSmallShare;
}

}  // namespace granule
