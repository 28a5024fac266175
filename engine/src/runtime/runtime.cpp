// make_runtime: ledger → backend → KV geometry → KvSpace → attach_kv → granule pool.
#include "runtime/runtime.h"

#include <limits>

#include "granule/error.h"
#include "granule/log.h"
#include "memory/placement.h"

namespace granule {

RuntimeOptions RuntimeOptions::from(const EngineOptions& options) {
  RuntimeOptions r;
  r.device = options.device;
  r.backend.vram_budget_bytes = options.vram_budget_bytes;
  r.backend.cuda_graphs = options.cuda_graphs;
  r.backend.cpu_threads = options.cpu_threads;
  r.backend.cuda_host_experts = options.host_expert_share;
  r.backend.cuda_host_rows = options.host_row_share;
  r.backend.max_tokens_per_pass = options.prefill_chunk_tokens;
  r.backend.kv_reserve_tokens = default_kv_reserve_tokens(options.context_length);
  r.backend.context_length = options.context_length;
  r.backend.cpu_emulate_device_numerics = options.cpu_emulate_device_numerics;
  r.backend.cpu_exact_numerics = options.cpu_exact_numerics;
  r.context_length = options.context_length;
  r.slots = options.max_sequences;
  r.kv_pool_granules = options.kv_pool_granules;
  r.prefill_chunk_tokens = options.prefill_chunk_tokens;
  r.wrap_backend = options.wrap_backend;
  return r;
}

Runtime make_runtime(const ModelFile& file, const ModelConfig& config, const WeightTable& weights,
                     const RuntimeOptions& options) {
  const auto log = logger("engine");
  Runtime rt;
  // The budget is the user's, or unlimited until a backend that knows its device sets it.
  rt.memory = std::make_unique<MemoryManager>(options.backend.vram_budget_bytes
                                                  ? options.backend.vram_budget_bytes
                                                  : std::numeric_limits<uint64_t>::max() / 2);
  BackendOptions backend = options.backend;
  backend.sequence_slots = options.slots;
  const BackendInit init{file, config, weights, *rt.memory, backend};
#ifdef GRANULE_HAVE_CUDA
  if (options.device != DeviceKind::Cpu) {
    try {
      rt.backend = make_cuda_backend(init);
    } catch (const DeviceError& e) {
      if (options.device == DeviceKind::Cuda) throw;
      // Expected on machines without an NVIDIA driver: one line at info level, so command-line
      // errors stay one line on stderr; the device name says "CPU" either way.
      log->info("no usable GPU ({}); running on the CPU", e.what());
    }
  }
#else
  if (options.device == DeviceKind::Cuda) {
    throw UnsupportedError("this build of Granule has no CUDA backend; choose the CPU device");
  }
#endif
  if (!rt.backend) {
    rt.backend = make_cpu_backend(init);
    if (!options.backend.vram_budget_bytes && rt.backend->device_total_bytes()) {
      rt.memory->set_budget_bytes(rt.backend->device_total_bytes());
    }
  }
  if (options.wrap_backend) rt.backend = options.wrap_backend(std::move(rt.backend));
  KvGeometry geometry;
  geometry.bytes_per_token = rt.backend->kv_bytes_per_token();
  // KV by layer kind: the sliding-window layers in a part of their own (memory/kv_space.h).
  if (const int64_t elements = config.kv_bytes_per_token(1); elements > 0)
    geometry.parts = kv_parts(config, geometry.bytes_per_token / elements);
  geometry.max_tokens = options.context_length;
  geometry.slots = options.slots;
  rt.kv = std::make_unique<KvSpace>(rt.backend->make_kv_virtual_memory(), geometry, *rt.memory);
  rt.backend->attach_kv(*rt.kv);
  const uint64_t pool =
      options.kv_pool_granules < 0
          ? default_kv_pool_granules(geometry, options.prefill_chunk_tokens, rt.kv->granule_bytes())
          : static_cast<uint64_t>(options.kv_pool_granules);
  rt.kv->set_pool_target(pool);
  const uint64_t created = rt.kv->refill_pool();
  log->info("KV pool: {} of {} granules created ahead of need", created, pool);
  return rt;
}

}  // namespace granule
