// Contiguous-VA KV: KvSpace (slots in one reservation, granules committed on demand and
// decommitted from the tail, every committed byte in the ledger) and HostVirtualMemory,
// the VirtualMemory of the CPU backend (mmap PROT_NONE reserve, commit per granule).
#include "kv_space.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "granule/error.h"
#include "granule/log.h"

namespace granule {
namespace {

uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

std::string mib(uint64_t bytes) {
  return std::to_string(bytes / (1u << 20)) + "." +
         std::to_string((bytes % (1u << 20)) * 10 / (1u << 20)) + " MiB";
}

double microseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

// Host address space: reserve with mmap(PROT_NONE) so nothing is backed, commit a granule
// by making it read-write (the kernel backs its pages on first touch), decommit by
// dropping the pages (MADV_DONTNEED gives them back at once) and closing access again.
class HostVirtualMemory final : public VirtualMemory {
 public:
  explicit HostVirtualMemory(uint64_t granule_bytes) : granule_bytes_(granule_bytes) {
    const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    if (granule_bytes_ == 0 || granule_bytes_ % page != 0) {
      throw UsageError("KV granule of " + std::to_string(granule_bytes_) +
                       " bytes is not a multiple of the " + std::to_string(page) +
                       "-byte page size");
    }
  }

  ~HostVirtualMemory() override {
    // KvSpace unreserves what it reserved; this only catches an owner that did not.
    for (const auto& [base, bytes] : reservations_) {
      logger("engine.kv")->warn("unreserving {} of KV address space left reserved", mib(bytes));
      munmap(base, bytes);
    }
  }

  uint64_t granule_bytes() const override { return granule_bytes_; }

  uint8_t* reserve(uint64_t bytes) override {
    if (bytes == 0 || bytes % granule_bytes_ != 0) {
      throw UsageError("KV reservation of " + std::to_string(bytes) +
                       " bytes is not a whole number of granules");
    }
    // Over-reserve by one granule and trim, so the base is granule-aligned as on the GPU
    // (and a 2 MiB granule can be backed by one transparent huge page).
    const uint64_t padded = bytes + granule_bytes_;
    void* raw =
        mmap(nullptr, padded, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) {
      throw CapacityError("cannot reserve " + mib(bytes) + " of address space for the KV cache (" +
                          std::strerror(errno) +
                          "); lower the context length or the number of sequences");
    }
    const auto raw_address = reinterpret_cast<uintptr_t>(raw);
    const uintptr_t aligned = (raw_address + granule_bytes_ - 1) / granule_bytes_ * granule_bytes_;
    const uint64_t head = aligned - raw_address;
    const uint64_t tail = padded - head - bytes;
    if (head != 0) munmap(raw, head);
    if (tail != 0) munmap(reinterpret_cast<void*>(aligned + bytes), tail);
    auto* base = reinterpret_cast<uint8_t*>(aligned);
    reservations_.emplace_back(base, bytes);
    return base;
  }

  void unreserve(uint8_t* base, uint64_t bytes) override {
    auto it = std::find(reservations_.begin(), reservations_.end(), std::make_pair(base, bytes));
    if (it == reservations_.end()) {
      throw UsageError("unreserve of a KV range that was not reserved here");
    }
    reservations_.erase(it);
    munmap(base, bytes);
  }

  void commit(uint8_t* addr) override { commit_range(addr, 1); }
  void decommit(uint8_t* addr) override { decommit_range(addr, 1); }

  // One system call for the whole range: the ranges KvSpace commits are contiguous.
  void commit_range(uint8_t* addr, uint64_t granules) override {
    if (mprotect(addr, granules * granule_bytes_, PROT_READ | PROT_WRITE) != 0) {
      // mprotect changes nothing on failure, so there is nothing to roll back.
      throw CapacityError("cannot commit " + mib(granules * granule_bytes_) +
                          " of host memory for the KV cache (" + std::strerror(errno) + ")");
    }
  }

  void decommit_range(uint8_t* addr, uint64_t granules) override {
    const uint64_t bytes = granules * granule_bytes_;
    // MADV_DONTNEED frees a private anonymous mapping's pages now (a later touch would see
    // zeros); PROT_NONE then makes any stray access to the tail fault instead of silently
    // re-backing it.
    if (madvise(addr, bytes, MADV_DONTNEED) != 0 || mprotect(addr, bytes, PROT_NONE) != 0) {
      throw DeviceError("cannot decommit " + mib(bytes) + " of KV host memory (" +
                        std::strerror(errno) + ")");
    }
  }

 private:
  uint64_t granule_bytes_;
  std::vector<std::pair<uint8_t*, uint64_t>> reservations_;
};

}  // namespace

void VirtualMemory::commit_range(uint8_t* addr, uint64_t granules) {
  const uint64_t g = granule_bytes();
  uint64_t done = 0;
  try {
    for (; done < granules; ++done) commit(addr + done * g);
  } catch (...) {
    while (done > 0) {
      --done;
      try {
        decommit(addr + done * g);
      } catch (const std::exception& e) {
        logger("engine.kv")->error("rolling back a failed commit: {}", e.what());
      }
    }
    throw;
  }
}

void VirtualMemory::decommit_range(uint8_t* addr, uint64_t granules) {
  const uint64_t g = granule_bytes();
  for (uint64_t i = 0; i < granules; ++i) decommit(addr + i * g);
}

std::unique_ptr<VirtualMemory> make_host_virtual_memory(uint64_t granule_bytes) {
  return std::make_unique<HostVirtualMemory>(granule_bytes);
}

KvSpace::KvSpace(std::unique_ptr<VirtualMemory> vm, KvGeometry geometry, MemoryManager& memory)
    : vm_(std::move(vm)), geometry_(geometry), memory_(memory) {
  if (!vm_) throw UsageError("KvSpace needs a VirtualMemory");
  if (geometry_.bytes_per_token <= 0 || geometry_.max_tokens <= 0 || geometry_.slots <= 0 ||
      geometry_.lookahead_tokens < 0) {
    throw UsageError("invalid KV geometry: " + std::to_string(geometry_.bytes_per_token) +
                     " bytes per token, " + std::to_string(geometry_.max_tokens) +
                     " tokens per slot, " + std::to_string(geometry_.slots) + " slots, " +
                     std::to_string(geometry_.lookahead_tokens) + " look-ahead tokens");
  }
  const uint64_t g = vm_->granule_bytes();
  const auto bytes_per_token = static_cast<uint64_t>(geometry_.bytes_per_token);
  const auto max_tokens = static_cast<uint64_t>(geometry_.max_tokens);
  const auto slots = static_cast<uint64_t>(geometry_.slots);
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max() / 2;
  if (max_tokens > kMax / bytes_per_token ||
      ceil_div(max_tokens * bytes_per_token, g) > kMax / g / slots) {
    throw CapacityError("KV space for " + std::to_string(slots) + " sequences of " +
                        std::to_string(max_tokens) +
                        " tokens is too large to address; lower the context length");
  }
  slot_bytes_ = ceil_div(max_tokens * bytes_per_token, g) * g;
  const uint64_t total = slot_bytes_ * slots;
  base_ = vm_->reserve(total);
  memory_.charge(MemoryCategory::KvReservedVa, total);  // never refused: VA is not budgeted
  committed_granules_.assign(slots, 0);
  stats_.reserved_bytes = total;
  logger("engine.kv")
      ->info("reserved {} of KV address space: {} slots x {} tokens x {} bytes, granule {}",
             mib(total), slots, max_tokens, bytes_per_token, mib(g));
}

KvSpace::~KvSpace() {
  std::lock_guard lock(mutex_);
  const uint64_t g = vm_->granule_bytes();
  for (int32_t slot = 0; slot < geometry_.slots; ++slot) {
    try {
      shrink_locked(slot, 0);
    } catch (const std::exception& e) {
      // Unreserving below drops whatever stayed mapped; the ledger must still balance.
      logger("engine.kv")->error("decommitting KV slot {} at shutdown: {}", slot, e.what());
      memory_.release(MemoryCategory::KvCommitted, committed_granules_[slot] * g);
      committed_granules_[slot] = 0;
    }
  }
  try {
    vm_->unreserve(base_, stats_.reserved_bytes);
  } catch (const std::exception& e) {
    logger("engine.kv")->error("unreserving KV address space: {}", e.what());
  }
  memory_.release(MemoryCategory::KvReservedVa, stats_.reserved_bytes);
}

uint64_t KvSpace::granule_bytes() const { return vm_->granule_bytes(); }

void KvSpace::check_slot(int32_t slot) const {
  if (slot < 0 || slot >= geometry_.slots) {
    throw UsageError("KV slot " + std::to_string(slot) + " out of range (" +
                     std::to_string(geometry_.slots) + " slots)");
  }
}

uint8_t* KvSpace::slot_base(int32_t slot) const {
  check_slot(slot);
  return base_ + static_cast<uint64_t>(slot) * slot_bytes_;
}

bool KvSpace::map_through(int32_t slot, int64_t tokens) {
  check_slot(slot);
  if (tokens < 0 || tokens > geometry_.max_tokens) {
    throw UsageError("cannot map " + std::to_string(tokens) + " tokens of KV: a slot holds " +
                     std::to_string(geometry_.max_tokens));
  }
  const uint64_t g = vm_->granule_bytes();
  const auto bytes_per_token = static_cast<uint64_t>(geometry_.bytes_per_token);
  const int64_t wanted_tokens = std::min(geometry_.max_tokens, tokens + geometry_.lookahead_tokens);
  const uint64_t wanted = ceil_div(static_cast<uint64_t>(wanted_tokens) * bytes_per_token, g);
  const uint64_t required = ceil_div(static_cast<uint64_t>(tokens) * bytes_per_token, g);

  std::lock_guard lock(mutex_);
  uint64_t& have = committed_granules_[slot];
  if (wanted <= have) return true;
  // The look-ahead only saves a later map call; when the budget cannot hold it, map just
  // what this step writes rather than refuse a step that fits.
  uint64_t target = wanted;
  if (!memory_.try_charge(MemoryCategory::KvCommitted, (target - have) * g)) {
    target = required;
    if (target > have && !memory_.try_charge(MemoryCategory::KvCommitted, (target - have) * g)) {
      ++stats_.map_refusals;
      logger("engine.kv")
          ->debug("slot {}: budget refused {} more for {} tokens", slot, mib((target - have) * g),
                  tokens);
      return false;
    }
    if (target <= have) return true;
  }
  const uint64_t more = target - have;
  const auto start = std::chrono::steady_clock::now();
  try {
    vm_->commit_range(slot_base(slot) + have * g, more);
  } catch (...) {
    stats_.last_mapping_us += microseconds_since(start);
    memory_.release(MemoryCategory::KvCommitted, more * g);
    throw;
  }
  stats_.last_mapping_us += microseconds_since(start);
  have = target;
  stats_.granules_mapped += more;
  stats_.last_granules_mapped += more;
  stats_.committed_bytes += more * g;
  stats_.peak_committed_bytes = std::max(stats_.peak_committed_bytes, stats_.committed_bytes);
  return true;
}

void KvSpace::truncate(int32_t slot, int64_t tokens) {
  check_slot(slot);
  if (tokens < 0) throw UsageError("cannot truncate KV to a negative length");
  const uint64_t g = vm_->granule_bytes();
  const auto kept_tokens = static_cast<uint64_t>(std::min(tokens, geometry_.max_tokens));
  const uint64_t keep = ceil_div(kept_tokens * static_cast<uint64_t>(geometry_.bytes_per_token), g);
  std::lock_guard lock(mutex_);
  shrink_locked(slot, keep);
}

void KvSpace::shrink_locked(int32_t slot, uint64_t keep_granules) {
  uint64_t& have = committed_granules_[slot];
  if (keep_granules >= have) return;
  const uint64_t g = vm_->granule_bytes();
  const uint64_t fewer = have - keep_granules;
  const auto start = std::chrono::steady_clock::now();
  vm_->decommit_range(base_ + static_cast<uint64_t>(slot) * slot_bytes_ + keep_granules * g, fewer);
  stats_.last_mapping_us += microseconds_since(start);
  memory_.release(MemoryCategory::KvCommitted, fewer * g);
  have = keep_granules;
  stats_.granules_unmapped += fewer;
  stats_.last_granules_unmapped += fewer;
  stats_.committed_bytes -= fewer * g;
}

uint64_t KvSpace::committed_bytes(int32_t slot) const {
  check_slot(slot);
  std::lock_guard lock(mutex_);
  return committed_granules_[slot] * vm_->granule_bytes();
}

int64_t KvSpace::committed_tokens(int32_t slot) const {
  const uint64_t bytes = committed_bytes(slot);
  return std::min(geometry_.max_tokens,
                  static_cast<int64_t>(bytes / static_cast<uint64_t>(geometry_.bytes_per_token)));
}

uint64_t KvSpace::reserved_bytes(int32_t slot) const {
  check_slot(slot);
  return slot_bytes_;
}

uint64_t KvSpace::bytes_for_tokens(int64_t tokens) const {
  const auto clamped = static_cast<uint64_t>(std::clamp<int64_t>(tokens, 0, geometry_.max_tokens));
  const uint64_t g = vm_->granule_bytes();
  return ceil_div(clamped * static_cast<uint64_t>(geometry_.bytes_per_token), g) * g;
}

KvStats KvSpace::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void KvSpace::reset_step_stats() {
  std::lock_guard lock(mutex_);
  stats_.last_mapping_us = 0;
  stats_.last_granules_mapped = 0;
  stats_.last_granules_unmapped = 0;
}

}  // namespace granule
