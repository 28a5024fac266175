// Contiguous-VA KV: one virtual address range per sequence slot, reserved once, with
// physical granules committed under it on demand and decommitted from the tail. Layout
// inside a slot is token-major: [token][layer][K|V][kv_head][head_dim], so one granule
// covers many tokens of every layer. The address space itself is a VirtualMemory: host
// (mmap PROT_NONE + commit per granule) for the CPU backend, CUDA VMM for the GPU.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "memory_manager.h"

namespace granule {

// Reserve / commit / decommit granules of address space. Implementations: HostVirtualMemory
// (kv_space.cpp), CudaVirtualMemory (cuda/cuda_vmm.cpp).
class VirtualMemory {
 public:
  virtual ~VirtualMemory() = default;
  virtual uint64_t granule_bytes() const = 0;
  // Reserves bytes (a multiple of granule_bytes) of address space; returns its base.
  virtual uint8_t* reserve(uint64_t bytes) = 0;
  virtual void unreserve(uint8_t* base, uint64_t bytes) = 0;
  // Backs [addr, addr + granule_bytes) with physical memory / releases it. addr is a
  // granule multiple from a reservation's base. Failures throw granule::Error.
  virtual void commit(uint8_t* addr) = 0;
  virtual void decommit(uint8_t* addr) = 0;
  // The same for `granules` consecutive granules, all or nothing: when a commit fails part
  // way, what this call committed is decommitted again before the error propagates. The
  // defaults loop over commit()/decommit(); an implementation may batch (a CUDA one can
  // take handles from a pre-created pool and set access once for the whole range).
  virtual void commit_range(uint8_t* addr, uint64_t granules);
  virtual void decommit_range(uint8_t* addr, uint64_t granules);
};
std::unique_ptr<VirtualMemory> make_host_virtual_memory(uint64_t granule_bytes = 2u << 20);

struct KvGeometry {
  int64_t bytes_per_token = 0;  // n_layer * 2 * n_head_kv * head_dim * elem_bytes
  int64_t max_tokens = 0;       // per slot (the context length)
  int32_t slots = 0;
  int64_t lookahead_tokens = 16;  // mapped beyond the tokens a step writes
};

struct KvStats {
  uint64_t granules_mapped = 0;         // cumulative
  uint64_t granules_unmapped = 0;       // cumulative
  double last_mapping_us = 0;           // time spent in map/unmap since the last reset_step_stats()
  uint64_t last_granules_mapped = 0;    // since the last reset_step_stats()
  uint64_t last_granules_unmapped = 0;  // since the last reset_step_stats()
  uint64_t committed_bytes = 0;         // all slots, now
  uint64_t peak_committed_bytes = 0;    // all slots, the most at any time
  uint64_t reserved_bytes = 0;          // all slots, now
  uint64_t map_refusals = 0;            // cumulative map_through() calls the budget refused
};

// Thread-safe: the engine thread maps and truncates while telemetry may read stats.
class KvSpace {
 public:
  // Reserves every slot's range at once; charges KvReservedVa. Throws CapacityError.
  KvSpace(std::unique_ptr<VirtualMemory> vm, KvGeometry geometry, MemoryManager& memory);
  ~KvSpace();
  KvSpace(const KvSpace&) = delete;
  KvSpace& operator=(const KvSpace&) = delete;

  const KvGeometry& geometry() const { return geometry_; }
  uint64_t granule_bytes() const;
  // The slot's base address: the same for the life of the KvSpace.
  uint8_t* slot_base(int32_t slot) const;
  // Ensures [0, tokens + lookahead) (clamped to max_tokens) is committed, charging each new
  // granule to KvCommitted; when the budget cannot hold the look-ahead, commits just
  // [0, tokens). Returns false and commits nothing when the budget cannot hold even that
  // (the caller frees or waits). Throws UsageError for tokens outside [0, max_tokens].
  bool map_through(int32_t slot, int64_t tokens);
  // Decommits every granule wholly past the first `tokens` tokens (regenerate, edit).
  void truncate(int32_t slot, int64_t tokens);
  void release(int32_t slot) { truncate(slot, 0); }

  uint64_t committed_bytes(int32_t slot) const;
  // Tokens of the slot that are backed by committed memory now (clamped to max_tokens).
  int64_t committed_tokens(int32_t slot) const;
  uint64_t reserved_bytes(int32_t slot) const;
  // Committed bytes that hold `tokens` tokens of one slot: whole granules, clamped to the slot.
  uint64_t bytes_for_tokens(int64_t tokens) const;
  // What the budget can still charge (to KV or anything else) now.
  uint64_t budget_available_bytes() const { return memory_.available_bytes(); }
  KvStats stats() const;
  void reset_step_stats();

 private:
  void check_slot(int32_t slot) const;
  // Decommits the slot's granules from `keep_granules` on; the caller holds mutex_.
  void shrink_locked(int32_t slot, uint64_t keep_granules);

  mutable std::mutex mutex_;
  std::unique_ptr<VirtualMemory> vm_;
  KvGeometry geometry_;
  MemoryManager& memory_;
  uint64_t slot_bytes_ = 0;  // reserved per slot, granule multiple
  uint8_t* base_ = nullptr;  // one reservation for all slots
  std::vector<uint64_t> committed_granules_;
  KvStats stats_;
};

}  // namespace granule
