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
// e.context_per_chat, e.kv_bytes_per_token and e.h2d_bytes_per_second. On the CPU every
// expert counts as resident (host memory holds every weight).
void estimate_mixture_of_experts(FitEstimate& e, const WeightTable& weights);

}  // namespace granule
