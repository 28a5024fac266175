// The memory budget and the ledger of every byte the engine holds on the compute device
// (VRAM on CUDA, host memory on the CPU backend), by category. Nothing allocates device
// memory except through it; charge() refuses what the budget cannot hold.
#pragma once
#include <array>
#include <cstdint>
#include <mutex>
#include <string_view>

#include "granule/telemetry.h"  // MemoryCategory, memory_category_name(): the ledger is telemetry

namespace granule {

class MemoryManager {
 public:
  explicit MemoryManager(uint64_t budget_bytes, uint64_t device_total_bytes = 0);

  // Records bytes in a category. Returns false (and records nothing) when a physical
  // category would push the total over the budget. KvReservedVa never counts.
  bool try_charge(MemoryCategory c, uint64_t bytes);
  // Same, but throws CapacityError naming the category and the shortfall.
  void charge(MemoryCategory c, uint64_t bytes);
  void release(MemoryCategory c, uint64_t bytes);
  // Moves bytes charged to one physical category to another in one step: the total does
  // not change, so it is never refused (a pooled granule becoming committed KV).
  void transfer(MemoryCategory from, MemoryCategory to, uint64_t bytes);

  uint64_t budget_bytes() const;
  void set_budget_bytes(uint64_t b);
  uint64_t device_total_bytes() const { return device_total_bytes_; }
  uint64_t used_bytes() const;       // physical categories only
  uint64_t available_bytes() const;  // budget - used (0 if over)
  uint64_t bytes(MemoryCategory c) const;
  uint64_t peak_bytes() const;
  std::array<uint64_t, static_cast<int>(MemoryCategory::Count)> snapshot() const;

 private:
  mutable std::mutex mutex_;
  uint64_t budget_bytes_;
  uint64_t device_total_bytes_;
  uint64_t peak_ = 0;
  std::array<uint64_t, static_cast<int>(MemoryCategory::Count)> bytes_{};
};

}  // namespace granule
