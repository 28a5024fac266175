// Contiguous-VA KV: one virtual address range per sequence slot, reserved once, with
// physical granules committed under it on demand and decommitted from the tail. Layout
// inside a slot is token-major: [token][layer][K|V][kv_head][head_dim], so one granule
// covers many tokens of every layer; a model with sliding-window layers keeps them in a second
// part of the slot (its own granule-aligned range, token-major), whose granules wholly behind
// the window are unmapped as the window slides. The address space itself is a VirtualMemory: host
// (mmap PROT_NONE + commit per granule) for the CPU backend, CUDA VMM for the GPU.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "granule/model_config.h"
#include "granule/telemetry.h"  // KvStats
#include "memory/memory_manager.h"

namespace granule {

// Address space reserved once, and granules of physical memory created apart from it and
// mapped into it: KvSpace keeps unmapped granules in a pool, so a step that grows a sequence
// maps memory that already exists instead of allocating it. Implementations:
// HostVirtualMemory (kv_space.cpp; a memfd's pages), CudaVirtualMemory (cuda/cuda_vmm.cpp;
// cuMemCreate handles). Failures throw granule::Error.
class VirtualMemory {
 public:
  // One granule of physical memory: a CUDA allocation handle, or an offset into the host
  // implementation's memory file. Owned by whoever holds it (KvSpace's pool, a mapping).
  using Physical = uint64_t;

  virtual ~VirtualMemory() = default;
  virtual uint64_t granule_bytes() const = 0;
  // Reserves bytes (a multiple of granule_bytes) of address space; returns its base.
  virtual uint8_t* reserve(uint64_t bytes) = 0;
  virtual void unreserve(uint8_t* base, uint64_t bytes) = 0;
  // Creates one granule of physical memory, backed now (CapacityError when there is none).
  virtual Physical create() = 0;
  // Frees a granule that is not mapped; logs instead of throwing.
  virtual void destroy(Physical granule) noexcept = 0;
  // Maps granules[i] at addr + i * granule_bytes (addr a granule multiple from a
  // reservation's base, the range unmapped) and makes the range readable and writable. All
  // or nothing: when it throws, nothing of the range stays mapped and the caller still owns
  // every granule.
  virtual void map(uint8_t* addr, std::span<const Physical> granules) = 0;
  // Unmaps `count` mapped granules starting at addr, from the last one down, and appends
  // each to `out` as it comes off, still allocated. When it throws, what is in `out` was
  // unmapped and the rest of the range is still mapped.
  virtual void unmap(uint8_t* addr, uint64_t count, std::vector<Physical>& out) = 0;

  // Device work that may still touch mapped memory. Unmapping or releasing memory that queued
  // work reads or writes poisons the whole device context, and on a shared GPU queued work
  // can wait long after the host has moved on. fence() marks the point after every piece of
  // work queued so far that may touch this space and returns its ticket; fence_passed() says,
  // without blocking, whether that work has completed; fence_wait() blocks until it has.
  // Tickets grow. Neither throws: a device that can no longer run work (a lost context)
  // has nothing in flight, so its tickets pass. Host memory has no queued work: every
  // ticket has passed.
  virtual uint64_t fence() { return 0; }
  virtual bool fence_passed(uint64_t /*ticket*/) { return true; }
  virtual void fence_wait(uint64_t /*ticket*/) {}

  // create() + map() for fresh granules, and unmap() + destroy(): for callers without a pool.
  void commit_range(uint8_t* addr, uint64_t granules);
  void decommit_range(uint8_t* addr, uint64_t granules);
};
std::unique_ptr<VirtualMemory> make_host_virtual_memory(uint64_t granule_bytes = 2u << 20);

// One part of a slot's KV (KV by layer kind, ModelConfig::kv_part): the layers that see every
// token, or the sliding-window layers, whose tokens only the next window_tokens positions read.
struct KvPartGeometry {
  int64_t bytes_per_token = 0;  // this part's share of a token's record (0: an empty part)
  int64_t window_tokens = 0;    // > 0: granules wholly behind the window are let go
};

struct KvGeometry {
  int64_t bytes_per_token = 0;  // a token's record over every layer (and every part)
  int64_t max_tokens = 0;       // per slot (the context length)
  int32_t slots = 0;
  int64_t lookahead_tokens = 16;  // mapped beyond the tokens a step writes
  // The parts of each slot, in ModelConfig::kv_part order, each a granule-aligned range of the
  // slot, token-major; their bytes per token sum to bytes_per_token. Empty: one part of
  // bytes_per_token keeping every token (a model without sliding-window layers).
  std::vector<KvPartGeometry> parts;
};

// The parts of a model's KV at an element size: empty when no layer slides (one part), else
// {the layers that keep every token, the sliding layers with the model's window}.
std::vector<KvPartGeometry> kv_parts(const ModelConfig& config, int64_t element_bytes);

// KvStats, the KV space's counters, is in granule/telemetry.h: the snapshot carries it as is.

// The pool the engine keeps unless told otherwise: a prefill chunk's granules (its tokens
// may belong to several chats) plus one per four slots, for decodes crossing into a new
// granule at once (one slot in four is generous: a 2 MiB granule holds 16 to 90 tokens of
// the usual models).
uint64_t default_kv_pool_granules(const KvGeometry& geometry, int64_t prefill_chunk_tokens,
                                  uint64_t granule_bytes);

// Thread-safe: the engine thread maps and truncates while telemetry may read stats.
class KvSpace {
 public:
  // Reserves every slot's range at once; charges KvReservedVa. Throws CapacityError.
  KvSpace(std::unique_ptr<VirtualMemory> vm, KvGeometry geometry, MemoryManager& memory);
  // The ledger this space charges (and whose budget it maps against).
  MemoryManager& memory() const { return memory_; }
  ~KvSpace();
  KvSpace(const KvSpace&) = delete;
  KvSpace& operator=(const KvSpace&) = delete;

  const KvGeometry& geometry() const { return geometry_; }
  uint64_t granule_bytes() const;
  // The slot's base address: the same for the life of the KvSpace.
  uint8_t* slot_base(int32_t slot) const;
  // The parts (geometry().parts, or the one part) and where each starts in a slot.
  int parts() const { return static_cast<int>(parts_.size()); }
  const KvPartGeometry& part(int part) const { return parts_[static_cast<size_t>(part)]; }
  uint64_t part_offset_bytes(int part) const;
  // Ensures [0, tokens + lookahead) (clamped to max_tokens) is committed, charging each new
  // granule to KvCommitted; when the budget cannot hold the look-ahead, commits just
  // [0, tokens). Returns false and commits nothing when the budget cannot hold even that
  // (the caller frees or waits). Throws UsageError for tokens outside [0, max_tokens].
  // `from`: the first position the coming step writes (its rows read back to
  // from + 1 - window): a window part commits from the granule holding that token on, and its
  // granules wholly before it retire (unmapped once the device work queued so far has
  // completed, as truncate()'s). A part's granules before `from`'s window that were let go
  // are mapped again when asked for (their contents are gone: can_continue_at()).
  bool map_through(int32_t slot, int64_t tokens, int64_t from = 0) {
    return map(slot, tokens, from, false);
  }
  // The same while a step runs on the device, for what the next step will write: a refusal
  // is not counted (the next step's map_through() decides), and the granules and time go
  // to the "ahead" counters, apart from the step's own mapping.
  bool map_ahead(int32_t slot, int64_t tokens, int64_t from = 0) {
    return map(slot, tokens, from, true);
  }
  // The pool: granules created ahead of need, so map_through() only maps. Granules a slot
  // gives back go to the pool while it is under its target, the rest are destroyed. Pooled
  // bytes are charged to KvPool and count as available to KV (budget_available_bytes()).
  void set_pool_target(uint64_t granules);
  // Creates granules until the pool holds its target or the budget refuses one; returns how
  // many it created. For the time between launching a step and waiting for it. Never throws.
  uint64_t refill_pool();
  // Destroys pooled granules until at most `keep` are left (to hand budget to others).
  void trim_pool(uint64_t keep);
  // Decommits every granule wholly past the first `tokens` tokens (regenerate, edit). The
  // slot stops using them at once; they are unmapped (and pooled or destroyed) once the
  // device work queued so far has completed (VirtualMemory::fence), which reclaim() and the
  // calls below check between steps without blocking. Until then they stay mapped, so a
  // slot that grows again first takes its own retiring granules back.
  void truncate(int32_t slot, int64_t tokens);
  void release(int32_t slot) { truncate(slot, 0); }

  // Unmaps retiring granules whose device work has completed; with `wait`, waits for all of
  // them first (only where memory is needed now, or at shutdown). Returns granules unmapped.
  uint64_t reclaim(bool wait = false);

  // Bytes the slot uses: retiring granules not included.
  uint64_t committed_bytes(int32_t slot) const;
  // The same for one part of the slot.
  uint64_t committed_bytes(int32_t slot, int part) const;
  // Whether the slot still holds what a position `tokens` reads of its first `tokens` tokens:
  // every window part's [tokens + 1 - window, tokens). Prefix reuse and swapping rely on it;
  // where it fails the sequence is computed again.
  bool can_continue_at(int32_t slot, int64_t tokens) const;
  // The byte ranges of a slot (from its base) a sequence of `tokens` tokens continues from:
  // each part's tokens, a window part's last window - 1 only. Swapping KV to host memory
  // copies them back to back (live_bytes in all).
  struct Range {
    uint64_t offset = 0, bytes = 0;
  };
  std::vector<Range> live_ranges(int64_t tokens) const;
  uint64_t live_bytes(int64_t tokens) const;
  // Tokens of the slot that are backed by committed memory now (clamped to max_tokens).
  int64_t committed_tokens(int32_t slot) const;
  uint64_t reserved_bytes(int32_t slot) const;
  // Committed bytes that hold `tokens` tokens of one slot: whole granules, clamped to the slot;
  // a window part's at most its window's granules and one more.
  uint64_t bytes_for_tokens(int64_t tokens) const;
  // What KV can still commit now: the budget's free bytes plus the pool's granules.
  uint64_t budget_available_bytes() const;
  KvStats stats() const;
  void reset_step_stats();

 private:
  // One part of one slot: per granule free, committed or retiring (mapped, unmapped once the
  // slot's retire ticket passes). The committed granules are the run [lo, hi); retiring ones
  // lie within [retire_lo, retire_hi).
  enum GranuleState : uint8_t { kFree = 0, kCommitted = 1, kRetiring = 2 };
  struct PartState {
    std::vector<uint8_t> granules;
    uint64_t lo = 0, hi = 0;
    uint64_t retire_lo = 0, retire_hi = 0;
    uint64_t retiring = 0;  // granules retiring
  };

  void check_slot(int32_t slot) const;
  bool map(int32_t slot, int64_t tokens, int64_t from, bool ahead);
  PartState& state(int32_t slot, int part) {
    return states_[static_cast<size_t>(slot) * parts_.size() + static_cast<size_t>(part)];
  }
  const PartState& state(int32_t slot, int part) const {
    return states_[static_cast<size_t>(slot) * parts_.size() + static_cast<size_t>(part)];
  }
  uint8_t* granule_address(int32_t slot, int part, uint64_t granule) const;
  // Granules [first, end) of a part hold tokens [first token, end token) (ceil for the end).
  uint64_t granules_through(int part, int64_t tokens) const;
  uint64_t granule_of(int part, int64_t token) const;
  // Marks committed granules of a part retiring (the caller fences them).
  void retire_locked(int32_t slot, int part, uint64_t first, uint64_t end);
  // Fences what was just retired in the slot, unmapping it at once when its work is done.
  void fence_retired_locked(int32_t slot, uint64_t retired);
  // Decommits every part's granules from its first `tokens` tokens' end on; the caller holds
  // mutex_.
  void shrink_locked(int32_t slot, int64_t tokens);
  // Takes back granules a slot unmapped: into the pool up to its target, destroyed past it;
  // their bytes move from KvCommitted to KvPool or leave the ledger. The caller holds mutex_.
  void take_back_locked(std::vector<VirtualMemory::Physical>& granules);
  // Unmaps the retiring granules of every slot whose fence has passed (or of all, waiting).
  uint64_t reclaim_locked(bool wait);
  // Unmaps the slot's retiring granules now: the caller knows their work has completed.
  void unmap_retiring_locked(int32_t slot);
  bool slot_retiring_locked(int32_t slot) const;
  void destroy_pooled_locked(uint64_t keep);

  mutable std::mutex mutex_;
  std::unique_ptr<VirtualMemory> vm_;
  KvGeometry geometry_;
  MemoryManager& memory_;
  std::vector<KvPartGeometry> parts_;    // geometry_.parts, or the one part
  std::vector<uint64_t> part_offsets_;   // bytes from a slot's base, granule multiples
  std::vector<uint64_t> part_granules_;  // reserved per slot and part
  uint64_t slot_bytes_ = 0;              // reserved per slot, granule multiple
  uint8_t* base_ = nullptr;              // one reservation for all slots
  std::vector<PartState> states_;        // slot-major, parts_.size() per slot
  std::vector<uint64_t> retire_ticket_;  // per slot: the fence behind its retiring granules
  std::vector<VirtualMemory::Physical> pool_;
  uint64_t pool_target_ = 0;
  KvStats stats_;
};

}  // namespace granule
