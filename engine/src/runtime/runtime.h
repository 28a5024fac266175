// The runtime a model runs on, assembled in one place for the engine, granule-bench and the
// tests: the ledger with its budget, the backend the options pick (CUDA, or the CPU when no
// GPU is usable and the device is Auto), the KvSpace on the backend's address space, and the
// KV granule pool.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

#include "backends/backend.h"
#include "granule/engine.h"
#include "memory/kv_space.h"
#include "memory/memory_manager.h"

namespace granule {

struct RuntimeOptions {
  DeviceKind device = DeviceKind::Auto;
  BackendOptions backend;
  int64_t context_length = 4096;  // tokens per slot
  int32_t slots = 8;
  // Granules created ahead of need: -1 sizes the pool from the shapes
  // (default_kv_pool_granules), 0 turns it off.
  int64_t kv_pool_granules = -1;
  int64_t prefill_chunk_tokens = 512;  // sizes the default pool
  // Wraps the backend picked (fault injection in tests); empty: none.
  std::function<std::unique_ptr<Backend>(std::unique_ptr<Backend>)> wrap_backend;

  // The runtime part of an engine's options (context_length already clamped to the model).
  static RuntimeOptions from(const EngineOptions& options);
};

struct Runtime {
  // Declared in this order so that destruction runs KV, then backend, then ledger.
  std::unique_ptr<MemoryManager> memory;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<KvSpace> kv;
};

// Throws DeviceError when the device asked for is unusable (Cuda without a GPU),
// UnsupportedError when this build has no CUDA backend and Cuda is asked for, CapacityError
// when the KV space cannot be reserved.
Runtime make_runtime(const ModelFile& file, const ModelConfig& config, const WeightTable& weights,
                     const RuntimeOptions& options);

}  // namespace granule
