// The part of Engine::estimate (granule/engine.h) that sizes a mixture-of-experts model, apart
// from reading the file so tests can give it tables built by hand.
#pragma once
#include "granule/engine.h"
#include "granule/model_config.h"

namespace granule {

// Fills the plan of `e` for a mixture-of-experts model from its weights: e.experts, the
// minimum budget (always-resident weights, workspace, KV reserve: streamed experts need no
// staging, the kernels read them from mapped host memory), the resident bytes, KV capacity and
// the PCIe bound. Reads e.config, e.gpu, e.budget_bytes, e.workspace_bytes, e.chats,
// e.context_per_chat, e.kv_bytes_per_token, e.h2d_bytes_per_second and, for the share of the
// missed experts the host's CPU computes at batch 1 (`host_expert_setting`:
// EngineOptions::host_expert_share), e.host_available_bytes and e.host_total_bytes. On the CPU
// every expert counts as resident (host memory holds every weight).
void estimate_mixture_of_experts(FitEstimate& e, const WeightTable& weights,
                                 int host_expert_setting = -1);

}  // namespace granule
