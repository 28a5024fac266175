// The memory budget and the ledger by category: every device byte the engine holds is
// charged here first, so the engine can refuse what does not fit instead of failing later.
#include "memory/memory_manager.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "granule/error.h"
#include "granule/log.h"

namespace granule {
namespace {

constexpr int kCategoryCount = static_cast<int>(MemoryCategory::Count);

bool counts_against_budget(MemoryCategory c) {
  return c != MemoryCategory::KvReservedVa && c != MemoryCategory::HostPinned;
}

// What counts against the budget: every category but reserved address space and host memory.
uint64_t physical_bytes(const std::array<uint64_t, kCategoryCount>& by_category) {
  uint64_t used = 0;
  for (int k = 0; k < kCategoryCount; ++k) {
    if (counts_against_budget(static_cast<MemoryCategory>(k))) used += by_category[k];
  }
  return used;
}

int index_of(MemoryCategory c) {
  const int i = static_cast<int>(c);
  if (i < 0 || i >= kCategoryCount)
    throw UsageError("unknown memory category " + std::to_string(i));
  return i;
}

// "1.5 GiB", "64.0 MiB", "512 B": for messages a user reads.
std::string human_bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  if (unit == 0) {
    std::snprintf(text, sizeof text, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(text, sizeof text, "%.1f %s", value, kUnits[unit]);
  }
  return text;
}

}  // namespace

std::string_view memory_category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::WeightsResident:
      return "weights";
    case MemoryCategory::WeightsStaging:
      return "staging";
    case MemoryCategory::KvCommitted:
      return "kv";
    case MemoryCategory::KvPool:
      return "kv_pool";
    case MemoryCategory::KvReservedVa:
      return "kv_reserved_va";
    case MemoryCategory::Workspace:
      return "workspace";
    case MemoryCategory::Graphs:
      return "graphs";
    case MemoryCategory::Other:
      return "other";
    case MemoryCategory::RecurrentState:
      return "recurrent_state";
    case MemoryCategory::HostPinned:
      return "host_pinned";
    case MemoryCategory::Count:
      break;
  }
  return "unknown";
}

MemoryManager::MemoryManager(uint64_t budget_bytes, uint64_t device_total_bytes)
    : budget_bytes_(budget_bytes), device_total_bytes_(device_total_bytes) {}

bool MemoryManager::try_charge(MemoryCategory c, uint64_t bytes) {
  const int i = index_of(c);
  std::lock_guard lock(mutex_);
  if (counts_against_budget(c)) {
    const uint64_t used = physical_bytes(bytes_);
    // Written as a subtraction so a huge request cannot overflow past the check.
    if (used > budget_bytes_ || bytes > budget_bytes_ - used) return false;
    peak_ = std::max(peak_, used + bytes);
  }
  bytes_[i] += bytes;
  return true;
}

void MemoryManager::charge(MemoryCategory c, uint64_t bytes) {
  if (try_charge(c, bytes)) return;
  uint64_t used = 0, budget = 0;
  {
    std::lock_guard lock(mutex_);
    budget = budget_bytes_;
    used = physical_bytes(bytes_);
  }
  const uint64_t shortfall = used + bytes > budget ? used + bytes - budget : 0;
  throw CapacityError("not enough memory for " + std::string(memory_category_name(c)) + ": " +
                      human_bytes(bytes) + " needed, " + human_bytes(shortfall) + " short of the " +
                      human_bytes(budget) + " budget (" + human_bytes(used) +
                      " in use); raise the budget or lower the context length or sequences");
}

void MemoryManager::release(MemoryCategory c, uint64_t bytes) {
  const int i = index_of(c);
  std::lock_guard lock(mutex_);
  if (bytes > bytes_[i]) {
    // A caller released more than it charged: an engine bug, not a user error. Releasing
    // often runs in destructors, so clamp and say so rather than throw.
    logger("engine.memory")
        ->error("released {} bytes of {} but only {} were charged", bytes, memory_category_name(c),
                bytes_[i]);
    bytes = bytes_[i];
  }
  bytes_[i] -= bytes;
}

void MemoryManager::transfer(MemoryCategory from, MemoryCategory to, uint64_t bytes) {
  const int f = index_of(from), t = index_of(to);
  if (counts_against_budget(from) != counts_against_budget(to))
    throw UsageError("cannot transfer bytes between address space and physical memory");
  std::lock_guard lock(mutex_);
  if (bytes > bytes_[f]) {
    logger("engine.memory")
        ->error("transferred {} bytes out of {} but only {} were charged", bytes,
                memory_category_name(from), bytes_[f]);
    bytes = bytes_[f];
  }
  bytes_[f] -= bytes;
  bytes_[t] += bytes;
}

uint64_t MemoryManager::budget_bytes() const {
  std::lock_guard lock(mutex_);
  return budget_bytes_;
}

void MemoryManager::set_budget_bytes(uint64_t b) {
  std::lock_guard lock(mutex_);
  // Lowering the budget under what is held is allowed: nothing is taken back, but no new
  // charge succeeds until enough is released.
  budget_bytes_ = b;
}

uint64_t MemoryManager::used_bytes() const {
  std::lock_guard lock(mutex_);
  return physical_bytes(bytes_);
}

uint64_t MemoryManager::available_bytes() const {
  std::lock_guard lock(mutex_);
  const uint64_t used = physical_bytes(bytes_);
  return used >= budget_bytes_ ? 0 : budget_bytes_ - used;
}

uint64_t MemoryManager::bytes(MemoryCategory c) const {
  const int i = index_of(c);
  std::lock_guard lock(mutex_);
  return bytes_[i];
}

uint64_t MemoryManager::peak_bytes() const {
  std::lock_guard lock(mutex_);
  return peak_;
}

std::array<uint64_t, static_cast<int>(MemoryCategory::Count)> MemoryManager::snapshot() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

}  // namespace granule
