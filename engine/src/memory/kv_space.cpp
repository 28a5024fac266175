// Contiguous-VA KV: KvSpace (slots in one reservation, granules committed on demand and
// decommitted from the tail, every committed byte in the ledger) and HostVirtualMemory,
// the VirtualMemory of the CPU backend (mmap PROT_NONE reserve, commit per granule).
#include "memory/kv_space.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <string>
#include <unordered_map>
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

// Host address space: reserved with mmap(PROT_NONE), so nothing is backed. Physical
// granules are ranges of one memory file (memfd): create() allocates a range's pages with
// fallocate, map() maps ranges over the reservation (MAP_FIXED replaces the PROT_NONE
// pages in one step), unmap() puts PROT_NONE back over them, and destroy() punches the
// range's pages out of the file. So a granule keeps its pages while unmapped, like a CUDA
// allocation handle, and a pooled granule maps without the kernel zeroing pages.
class HostVirtualMemory final : public VirtualMemory {
 public:
  explicit HostVirtualMemory(uint64_t granule_bytes) : granule_bytes_(granule_bytes) {
    const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    if (granule_bytes_ == 0 || granule_bytes_ % page != 0) {
      throw UsageError("KV granule of " + std::to_string(granule_bytes_) +
                       " bytes is not a multiple of the " + std::to_string(page) +
                       "-byte page size");
    }
    fd_ = memfd_create("granule-kv", MFD_CLOEXEC);
    if (fd_ < 0) {
      throw DeviceError(std::string("cannot create the KV cache's memory file (memfd_create: ") +
                        std::strerror(errno) + ")");
    }
  }

  ~HostVirtualMemory() override {
    // KvSpace unreserves what it reserved; this only catches an owner that did not.
    for (const auto& [base, bytes] : reservations_) {
      logger("engine.kv")->warn("unreserving {} of KV address space left reserved", mib(bytes));
      munmap(base, bytes);
    }
    close(fd_);  // the file's pages go with its last mapping
  }

  uint64_t granule_bytes() const override { return granule_bytes_; }

  uint8_t* reserve(uint64_t bytes) override {
    if (bytes == 0 || bytes % granule_bytes_ != 0) {
      throw UsageError("KV reservation of " + std::to_string(bytes) +
                       " bytes is not a whole number of granules");
    }
    // Over-reserve by one granule and trim, so the base is granule-aligned as on the GPU.
    const uint64_t padded = bytes + granule_bytes_;
    void* raw = mmap(nullptr, padded, PROT_NONE, kReservedFlags, -1, 0);
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
    // Granules still mapped here stay allocated in the file until destroyed; forget where.
    std::erase_if(mapped_,
                  [&](const auto& m) { return m.first >= base && m.first < base + bytes; });
    munmap(base, bytes);
  }

  Physical create() override {
    const bool reuse = !free_offsets_.empty();
    const uint64_t offset = reuse ? free_offsets_.back() : file_bytes_;
    if (!reuse && ftruncate(fd_, static_cast<off_t>(file_bytes_ + granule_bytes_)) != 0) {
      throw CapacityError("cannot grow the KV cache's memory file (" +
                          std::string(std::strerror(errno)) + ")");
    }
    // Allocates the pages now, so mapping the granule later costs no page zeroing.
    if (fallocate(fd_, 0, static_cast<off_t>(offset), static_cast<off_t>(granule_bytes_)) != 0) {
      const int error = errno;
      if (!reuse && ftruncate(fd_, static_cast<off_t>(file_bytes_)) != 0) {
        logger("engine.kv")->warn("shrinking the KV memory file back: {}", std::strerror(errno));
      }
      throw CapacityError("cannot allocate " + mib(granule_bytes_) +
                          " of host memory for the KV cache (" + std::strerror(error) + ")");
    }
    if (reuse) {
      free_offsets_.pop_back();
    } else {
      file_bytes_ += granule_bytes_;
    }
    return offset;
  }

  void destroy(Physical granule) noexcept override {
    if (fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(granule),
                  static_cast<off_t>(granule_bytes_)) != 0) {
      logger("engine.kv")->error("freeing a KV granule's host pages: {}", std::strerror(errno));
    }
    try {
      free_offsets_.push_back(granule);
    } catch (const std::bad_alloc&) {
      logger("engine.kv")->error("out of host memory while freeing a KV granule");
    }
  }

  void map(uint8_t* addr, std::span<const Physical> granules) override {
    for (size_t i = 0; i < granules.size(); ++i) {
      uint8_t* at = addr + i * granule_bytes_;
      void* p = mmap(at, granule_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd_,
                     static_cast<off_t>(granules[i]));
      if (p == MAP_FAILED) {
        const int error = errno;
        std::vector<Physical> undone;
        try {
          unmap(addr, i, undone);
        } catch (const std::exception& e) {
          logger("engine.kv")->error("undoing a failed KV map: {}", e.what());
        }
        throw CapacityError("cannot map " + mib(granule_bytes_) + " of KV host memory (" +
                            std::strerror(error) + ")");
      }
      mapped_[at] = granules[i];
    }
  }

  void unmap(uint8_t* addr, uint64_t count, std::vector<Physical>& out) override {
    for (uint64_t i = count; i-- > 0;) {
      uint8_t* at = addr + i * granule_bytes_;
      auto it = mapped_.find(at);
      if (it == mapped_.end()) throw UsageError("unmap of a KV granule that is not mapped");
      // Back to reserved address space in one step: MAP_FIXED replaces the file's pages, and
      // a stray access past the committed tail faults again.
      if (mmap(at, granule_bytes_, PROT_NONE, kReservedFlags | MAP_FIXED, -1, 0) == MAP_FAILED) {
        throw DeviceError("cannot unmap " + mib(granule_bytes_) + " of KV host memory (" +
                          std::strerror(errno) + ")");
      }
      out.push_back(it->second);
      mapped_.erase(it);
    }
  }

 private:
  static constexpr int kReservedFlags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;

  uint64_t granule_bytes_;
  int fd_ = -1;
  uint64_t file_bytes_ = 0;             // the memory file's size: every offset handed out
  std::vector<uint64_t> free_offsets_;  // offsets destroyed, for create() to hand out again
  std::unordered_map<uint8_t*, Physical> mapped_;
  std::vector<std::pair<uint8_t*, uint64_t>> reservations_;
};

}  // namespace

void VirtualMemory::commit_range(uint8_t* addr, uint64_t granules) {
  std::vector<Physical> fresh;
  fresh.reserve(granules);
  try {
    for (uint64_t i = 0; i < granules; ++i) fresh.push_back(create());
    map(addr, fresh);
  } catch (...) {
    for (Physical p : fresh) destroy(p);
    throw;
  }
}

void VirtualMemory::decommit_range(uint8_t* addr, uint64_t granules) {
  std::vector<Physical> off;
  off.reserve(granules);
  try {
    unmap(addr, granules, off);
  } catch (...) {
    for (Physical p : off) destroy(p);
    throw;
  }
  for (Physical p : off) destroy(p);
}

uint64_t default_kv_pool_granules(const KvGeometry& geometry, int64_t prefill_chunk_tokens,
                                  uint64_t granule_bytes) {
  const uint64_t chunk_bytes = static_cast<uint64_t>(std::max<int64_t>(prefill_chunk_tokens, 0)) *
                               static_cast<uint64_t>(geometry.bytes_per_token);
  return ceil_div(chunk_bytes, granule_bytes) +
         static_cast<uint64_t>(std::max(geometry.slots, 0) + 3) / 4;
}

std::unique_ptr<VirtualMemory> make_host_virtual_memory(uint64_t granule_bytes) {
  return std::make_unique<HostVirtualMemory>(granule_bytes);
}

std::vector<KvPartGeometry> kv_parts(const ModelConfig& config, int64_t element_bytes) {
  bool slides = false;
  for (int64_t l = 0; l < config.n_layer; ++l) slides = slides || config.layer_slides(l);
  if (!slides) return {};
  std::vector<KvPartGeometry> parts(ModelConfig::kKvParts);
  for (int p = 0; p < ModelConfig::kKvParts; ++p)
    parts[static_cast<size_t>(p)].bytes_per_token = config.kv_part_elements(p) * element_bytes;
  parts[ModelConfig::kKvPartWindow].window_tokens = config.sliding_window;
  return parts;
}

KvSpace::KvSpace(std::unique_ptr<VirtualMemory> vm, KvGeometry geometry, MemoryManager& memory)
    : vm_(std::move(vm)), geometry_(std::move(geometry)), memory_(memory) {
  if (!vm_) throw UsageError("KvSpace needs a VirtualMemory");
  if (geometry_.bytes_per_token <= 0 || geometry_.max_tokens <= 0 || geometry_.slots <= 0 ||
      geometry_.lookahead_tokens < 0) {
    throw UsageError("invalid KV geometry: " + std::to_string(geometry_.bytes_per_token) +
                     " bytes per token, " + std::to_string(geometry_.max_tokens) +
                     " tokens per slot, " + std::to_string(geometry_.slots) + " slots, " +
                     std::to_string(geometry_.lookahead_tokens) + " look-ahead tokens");
  }
  parts_ = geometry_.parts;
  if (parts_.empty()) parts_.push_back({geometry_.bytes_per_token, 0});
  int64_t sum = 0;
  for (const KvPartGeometry& p : parts_) {
    if (p.bytes_per_token < 0 || p.window_tokens < 0)
      throw UsageError("invalid KV part: " + std::to_string(p.bytes_per_token) +
                       " bytes per token, a window of " + std::to_string(p.window_tokens));
    sum += p.bytes_per_token;
  }
  if (sum != geometry_.bytes_per_token)
    throw UsageError("the KV parts' " + std::to_string(sum) + " bytes per token differ from the " +
                     std::to_string(geometry_.bytes_per_token) + " of a token's record");
  const uint64_t g = vm_->granule_bytes();
  const auto max_tokens = static_cast<uint64_t>(geometry_.max_tokens);
  const auto slots = static_cast<uint64_t>(geometry_.slots);
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max() / 2;
  if (max_tokens > kMax / static_cast<uint64_t>(geometry_.bytes_per_token) ||
      ceil_div(max_tokens * static_cast<uint64_t>(geometry_.bytes_per_token), g) + parts_.size() >
          kMax / g / slots) {
    throw CapacityError("KV space for " + std::to_string(slots) + " sequences of " +
                        std::to_string(max_tokens) +
                        " tokens is too large to address; lower the context length");
  }
  // Each part in its own granule-aligned range of the slot.
  for (const KvPartGeometry& p : parts_) {
    part_offsets_.push_back(slot_bytes_);
    const uint64_t granules = ceil_div(max_tokens * static_cast<uint64_t>(p.bytes_per_token), g);
    part_granules_.push_back(granules);
    slot_bytes_ += granules * g;
  }
  const uint64_t total = slot_bytes_ * slots;
  base_ = vm_->reserve(total);
  memory_.charge(MemoryCategory::KvReservedVa, total);  // never refused: VA is not budgeted
  states_.resize(slots * parts_.size());
  for (int32_t slot = 0; slot < geometry_.slots; ++slot)
    for (int part = 0; part < parts(); ++part)
      state(slot, part).granules.assign(part_granules_[static_cast<size_t>(part)], kFree);
  retire_ticket_.assign(slots, 0);
  stats_.reserved_bytes = total;
  logger("engine.kv")
      ->info("reserved {} of KV address space: {} slots x {} tokens x {} bytes, granule {}{}",
             mib(total), slots, max_tokens, geometry_.bytes_per_token, mib(g),
             parts_.size() > 1
                 ? ", sliding-window layers apart (" +
                       std::to_string(parts_.back().bytes_per_token) + " bytes per token, window " +
                       std::to_string(parts_.back().window_tokens) + ")"
                 : std::string());
}

KvSpace::~KvSpace() {
  std::lock_guard lock(mutex_);
  const uint64_t g = vm_->granule_bytes();
  pool_target_ = 0;  // what the slots give back below is destroyed, not pooled
  for (int32_t slot = 0; slot < geometry_.slots; ++slot) {
    try {
      shrink_locked(slot, 0);
      // Shutting down is not a hot path: wait for the device work that may touch the slot.
      vm_->fence_wait(retire_ticket_[slot]);
      unmap_retiring_locked(slot);
    } catch (const std::exception& e) {
      // Unreserving below drops whatever stayed mapped; the ledger must still balance.
      logger("engine.kv")->error("decommitting KV slot {} at shutdown: {}", slot, e.what());
      for (int part = 0; part < parts(); ++part) {
        PartState& st = state(slot, part);
        uint64_t mapped = 0;
        for (uint8_t x : st.granules) mapped += x != kFree ? 1 : 0;
        memory_.release(MemoryCategory::KvCommitted, mapped * g);
        std::fill(st.granules.begin(), st.granules.end(), kFree);
        st.lo = st.hi = st.retire_lo = st.retire_hi = st.retiring = 0;
      }
    }
  }
  destroy_pooled_locked(0);
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

uint64_t KvSpace::part_offset_bytes(int part) const {
  if (part < 0 || part >= parts()) throw UsageError("KV part " + std::to_string(part) + " unknown");
  return part_offsets_[static_cast<size_t>(part)];
}

uint8_t* KvSpace::granule_address(int32_t slot, int part, uint64_t granule) const {
  return base_ + static_cast<uint64_t>(slot) * slot_bytes_ +
         part_offsets_[static_cast<size_t>(part)] + granule * vm_->granule_bytes();
}

uint64_t KvSpace::granules_through(int part, int64_t tokens) const {
  const auto bytes_per_token =
      static_cast<uint64_t>(parts_[static_cast<size_t>(part)].bytes_per_token);
  return ceil_div(static_cast<uint64_t>(std::max<int64_t>(tokens, 0)) * bytes_per_token,
                  vm_->granule_bytes());
}

uint64_t KvSpace::granule_of(int part, int64_t token) const {
  const auto bytes_per_token =
      static_cast<uint64_t>(parts_[static_cast<size_t>(part)].bytes_per_token);
  return static_cast<uint64_t>(std::max<int64_t>(token, 0)) * bytes_per_token /
         vm_->granule_bytes();
}

bool KvSpace::map(int32_t slot, int64_t tokens, int64_t from, bool ahead) {
  check_slot(slot);
  if (tokens < 0 || tokens > geometry_.max_tokens) {
    throw UsageError("cannot map " + std::to_string(tokens) + " tokens of KV: a slot holds " +
                     std::to_string(geometry_.max_tokens));
  }
  from = std::clamp<int64_t>(from, 0, tokens);
  const uint64_t g = vm_->granule_bytes();
  const int64_t wanted_tokens = std::min(geometry_.max_tokens, tokens + geometry_.lookahead_tokens);
  const auto n_parts = static_cast<size_t>(parts());
  // Per part: the run [first, wanted) to commit, [first, required) at the least.
  std::vector<uint64_t> first(n_parts), wanted(n_parts), required(n_parts);
  for (int p = 0; p < parts(); ++p) {
    const KvPartGeometry& part = parts_[static_cast<size_t>(p)];
    wanted[static_cast<size_t>(p)] = granules_through(p, wanted_tokens);
    required[static_cast<size_t>(p)] = granules_through(p, tokens);
    first[static_cast<size_t>(p)] = part.window_tokens > 0
                                        ? std::min(granule_of(p, from + 1 - part.window_tokens),
                                                   required[static_cast<size_t>(p)])
                                        : 0;
  }

  std::lock_guard lock(mutex_);
  // Granules of [first, end) that are not mapped (neither committed nor retiring).
  auto fresh_in = [&](const std::vector<uint64_t>& end) {
    uint64_t fresh = 0;
    for (int p = 0; p < parts(); ++p) {
      const PartState& st = state(slot, p);
      const uint64_t a = first[static_cast<size_t>(p)], b = end[static_cast<size_t>(p)];
      for (uint64_t i = a; i < b; ++i) {
        if (i == st.lo && st.hi > st.lo) i = std::max(i, st.hi);  // [lo, hi): committed
        if (i >= b) break;
        fresh += st.granules[i] == kFree ? 1 : 0;
      }
    }
    return fresh;
  };
  auto covered = [&](const std::vector<uint64_t>& end) {
    for (int p = 0; p < parts(); ++p) {
      const PartState& st = state(slot, p);
      const uint64_t a = first[static_cast<size_t>(p)], b = end[static_cast<size_t>(p)];
      if (a < b && !(st.lo <= a && b <= st.hi)) return false;
      if (st.lo < a && st.hi > st.lo) return false;  // a window part's head to let go
    }
    return true;
  };
  if (covered(wanted)) return true;
  // Pooled granules are already charged (to KvPool); only granules beyond the pool need
  // budget. The look-ahead only saves a later map call: when the budget cannot hold it, map
  // just what this step writes rather than refuse a step that fits.
  auto charge_for = [&](uint64_t fresh) {
    const uint64_t beyond = fresh - std::min<uint64_t>(pool_.size(), fresh);
    return beyond == 0 || memory_.try_charge(MemoryCategory::KvCommitted, beyond * g);
  };
  // The slot's own retiring granules inside the run serve again first: still mapped and
  // charged, and whatever device work still touches them is ordered before the work that will
  // use them. A refusal below puts them back as they were.
  std::vector<std::pair<int, uint64_t>> taken;
  auto take_back = [&](const std::vector<uint64_t>& end) {
    for (int p = 0; p < parts(); ++p) {
      PartState& st = state(slot, p);
      if (st.retiring == 0) continue;
      const uint64_t a = std::max(first[static_cast<size_t>(p)], st.retire_lo);
      const uint64_t b = std::min(end[static_cast<size_t>(p)], st.retire_hi);
      for (uint64_t i = a; i < b; ++i) {
        if (st.granules[i] != kRetiring) continue;
        st.granules[i] = kCommitted;
        --st.retiring;
        stats_.retiring_bytes -= g;
        taken.emplace_back(p, i);
      }
    }
  };
  auto put_back = [&] {
    for (const auto& [p, i] : taken) {
      PartState& st = state(slot, p);
      st.retire_lo = st.retiring > 0 ? std::min(st.retire_lo, i) : i;
      st.retire_hi = st.retiring > 0 ? std::max(st.retire_hi, i + 1) : i + 1;
      st.granules[i] = kRetiring;
      ++st.retiring;
      stats_.retiring_bytes += g;
    }
    taken.clear();
  };
  std::vector<uint64_t> target = wanted;
  take_back(target);
  if (stats_.retiring_bytes > 0) reclaim_locked(false);  // other slots' finished cuts
  bool charged = charge_for(fresh_in(target));
  if (!charged && stats_.retiring_bytes > 0 && !ahead) {
    // Memory is needed now: wait for the device work behind the granules still retiring
    // (never while mapping ahead, which runs beside a step and must not block on it).
    reclaim_locked(true);
    charged = charge_for(fresh_in(target));
  }
  if (!charged) {
    put_back();
    target = required;
    take_back(target);
    if (!charge_for(fresh_in(target))) {
      put_back();
      if (ahead) return false;
      ++stats_.map_refusals;
      logger("engine.kv")->debug("slot {}: budget refused more KV for {} tokens", slot, tokens);
      return false;
    }
  }
  const uint64_t more = fresh_in(target);
  const uint64_t pooled = std::min<uint64_t>(pool_.size(), more);
  const auto start = std::chrono::steady_clock::now();
  double& time_spent = ahead ? stats_.last_ahead_us : stats_.last_mapping_us;
  // Pooled granules first (the newest, whose pages are most likely still cached), then
  // created ones; the charge for those was taken above.
  std::vector<VirtualMemory::Physical> granules(pool_.end() - static_cast<std::ptrdiff_t>(pooled),
                                                pool_.end());
  pool_.resize(pool_.size() - pooled);
  memory_.transfer(MemoryCategory::KvPool, MemoryCategory::KvCommitted, pooled * g);
  try {
    while (granules.size() < more) {
      granules.push_back(vm_->create());
      ++stats_.granules_created;
      if (!ahead) ++stats_.last_granules_created;
    }
  } catch (...) {
    time_spent += microseconds_since(start);
    put_back();
    for (size_t i = pooled; i < granules.size(); ++i) vm_->destroy(granules[i]);
    granules.resize(pooled);
    pool_.insert(pool_.end(), granules.begin(), granules.end());
    memory_.transfer(MemoryCategory::KvCommitted, MemoryCategory::KvPool, pooled * g);
    memory_.release(MemoryCategory::KvCommitted, (more - pooled) * g);
    throw;
  }
  // Map the runs of unmapped granules, part by part; a failure leaves what was mapped before it
  // retiring (charged, unmapped by the next reclaim) and gives the rest back.
  size_t used = 0;
  uint64_t retired = 0;
  std::vector<std::pair<int, std::pair<uint64_t, uint64_t>>> mapped_runs;
  try {
    for (int p = 0; p < parts(); ++p) {
      PartState& st = state(slot, p);
      const uint64_t a = first[static_cast<size_t>(p)], b = target[static_cast<size_t>(p)];
      for (uint64_t i = a; i < b;) {
        if (st.granules[i] != kFree) {
          ++i;
          continue;
        }
        uint64_t j = i;
        while (j < b && st.granules[j] == kFree) ++j;
        vm_->map(granule_address(slot, p, i),
                 std::span<const VirtualMemory::Physical>(granules.data() + used, j - i));
        used += j - i;
        mapped_runs.push_back({p, {i, j}});
        for (uint64_t k = i; k < j; ++k) st.granules[k] = kCommitted;
        i = j;
      }
    }
  } catch (...) {
    time_spent += microseconds_since(start);
    put_back();
    for (const auto& [p, run] : mapped_runs) {
      PartState& st = state(slot, p);
      for (uint64_t k = run.first; k < run.second; ++k) st.granules[k] = kRetiring;
      st.retire_lo = st.retiring > 0 ? std::min(st.retire_lo, run.first) : run.first;
      st.retire_hi = std::max(st.retire_hi, run.second);
      st.retiring += run.second - run.first;
    }
    stats_.committed_bytes += used * g;
    stats_.retiring_bytes += used * g;
    const size_t unused_pooled = pooled > used ? pooled - used : 0;
    for (size_t i = std::max(used, pooled); i < granules.size(); ++i) vm_->destroy(granules[i]);
    pool_.insert(pool_.end(), granules.begin() + static_cast<std::ptrdiff_t>(used),
                 granules.begin() + static_cast<std::ptrdiff_t>(used + unused_pooled));
    memory_.transfer(MemoryCategory::KvCommitted, MemoryCategory::KvPool, unused_pooled * g);
    memory_.release(MemoryCategory::KvCommitted, (more - used - unused_pooled) * g);
    retire_ticket_[slot] = vm_->fence();
    throw;
  }
  // Retiring granules inside the run serve again (still mapped and charged; the device work
  // that may touch them is ordered before the work that will use them), and a window part's
  // committed granules before its run retire.
  for (int p = 0; p < parts(); ++p) {
    PartState& st = state(slot, p);
    const uint64_t a = first[static_cast<size_t>(p)], b = target[static_cast<size_t>(p)];
    if (st.retiring > 0) {
      for (uint64_t i = std::max(a, st.retire_lo); i < std::min(b, st.retire_hi); ++i) {
        if (st.granules[i] != kRetiring) continue;
        st.granules[i] = kCommitted;
        --st.retiring;
        stats_.retiring_bytes -= g;
      }
    }
    // The committed granules stay one run: the old run's granules before the new one retire
    // (a window part's head), those after it stay (the tail only shrinks by truncate()),
    // unless a gap would part them from the new run (a sequence started over behind them).
    const uint64_t old_lo = st.lo, old_hi = st.hi;
    uint64_t hi = b;
    if (old_hi > old_lo) {
      if (old_lo > b) {
        retire_locked(slot, p, old_lo, old_hi);
        retired += old_hi - old_lo;
      } else {
        if (old_lo < a) {
          const uint64_t cut_end = std::min(a, old_hi);
          retire_locked(slot, p, old_lo, cut_end);
          retired += cut_end - old_lo;
        }
        hi = std::max(b, old_hi);
      }
    }
    st.lo = a;
    st.hi = std::max(hi, a);
  }
  time_spent += microseconds_since(start);
  stats_.granules_mapped += more;
  (ahead ? stats_.last_ahead_granules : stats_.last_granules_mapped) += more;
  stats_.granules_from_pool += pooled;
  stats_.committed_bytes += more * g;
  stats_.peak_committed_bytes = std::max(stats_.peak_committed_bytes, stats_.committed_bytes);
  if (retired > 0) fence_retired_locked(slot, retired);
  return true;
}

void KvSpace::retire_locked(int32_t slot, int part, uint64_t first, uint64_t end) {
  PartState& st = state(slot, part);
  if (first >= end) return;
  for (uint64_t i = first; i < end; ++i) st.granules[i] = kRetiring;
  st.retire_lo = st.retiring > 0 ? std::min(st.retire_lo, first) : first;
  st.retire_hi = st.retiring > 0 ? std::max(st.retire_hi, end) : end;
  st.retiring += end - first;
  stats_.retiring_bytes += (end - first) * vm_->granule_bytes();
}

void KvSpace::fence_retired_locked(int32_t slot, uint64_t retired) {
  // The retired granules stay mapped until the work queued so far (which may still read or
  // write them) has completed; a later ticket covers every earlier one.
  retire_ticket_[slot] = vm_->fence();
  if (vm_->fence_passed(retire_ticket_[slot])) {
    unmap_retiring_locked(slot);
  } else {
    stats_.unmaps_deferred += retired;
  }
}

void KvSpace::truncate(int32_t slot, int64_t tokens) {
  check_slot(slot);
  if (tokens < 0) throw UsageError("cannot truncate KV to a negative length");
  std::lock_guard lock(mutex_);
  shrink_locked(slot, std::min(tokens, geometry_.max_tokens));
}

void KvSpace::shrink_locked(int32_t slot, int64_t tokens) {
  uint64_t retired = 0;
  for (int p = 0; p < parts(); ++p) {
    PartState& st = state(slot, p);
    const uint64_t keep = std::max(granules_through(p, tokens), st.lo);
    if (keep >= st.hi) continue;
    retire_locked(slot, p, keep, st.hi);
    retired += st.hi - keep;
    st.hi = keep;
    if (tokens == 0) st.lo = st.hi = 0;  // released: the next sequence starts afresh
  }
  if (retired > 0) fence_retired_locked(slot, retired);
}

bool KvSpace::slot_retiring_locked(int32_t slot) const {
  for (int p = 0; p < parts(); ++p)
    if (state(slot, p).retiring > 0) return true;
  return false;
}

void KvSpace::unmap_retiring_locked(int32_t slot) {
  const uint64_t g = vm_->granule_bytes();
  for (int p = 0; p < parts(); ++p) {
    PartState& st = state(slot, p);
    if (st.retiring == 0) continue;
    for (uint64_t i = st.retire_lo; i < st.retire_hi && st.retiring > 0;) {
      if (st.granules[i] != kRetiring) {
        ++i;
        continue;
      }
      uint64_t j = i;
      while (j < st.retire_hi && st.granules[j] == kRetiring) ++j;
      std::vector<VirtualMemory::Physical> off;
      off.reserve(j - i);
      const auto start = std::chrono::steady_clock::now();
      struct Account {  // whatever came off is accounted for, even when unmap throws part way
        KvSpace& kv;
        PartState& st;
        uint64_t end;
        std::vector<VirtualMemory::Physical>& off;
        std::chrono::steady_clock::time_point start;
        ~Account() {
          // unmap() takes granules off from the last one down.
          const uint64_t fewer = off.size();
          const uint64_t bytes = fewer * kv.vm_->granule_bytes();
          for (uint64_t k = end - fewer; k < end; ++k) st.granules[k] = kFree;
          st.retiring -= fewer;
          kv.stats_.last_mapping_us += microseconds_since(start);
          kv.stats_.granules_unmapped += fewer;
          kv.stats_.last_granules_unmapped += fewer;
          kv.stats_.committed_bytes -= bytes;
          kv.stats_.retiring_bytes -= bytes;
          kv.take_back_locked(off);
        }
      } account{*this, st, j, off, start};
      vm_->unmap(granule_address(slot, p, i), j - i, off);
      i = j;
    }
    if (st.retiring == 0) st.retire_lo = st.retire_hi = 0;
  }
  static_cast<void>(g);
}

uint64_t KvSpace::reclaim_locked(bool wait) {
  if (stats_.retiring_bytes == 0) return 0;
  const uint64_t before = stats_.granules_unmapped;
  for (int32_t slot = 0; slot < geometry_.slots; ++slot) {
    if (!slot_retiring_locked(slot)) continue;
    if (wait) {
      vm_->fence_wait(retire_ticket_[slot]);
    } else if (!vm_->fence_passed(retire_ticket_[slot])) {
      continue;
    }
    unmap_retiring_locked(slot);
  }
  return stats_.granules_unmapped - before;
}

uint64_t KvSpace::reclaim(bool wait) {
  std::lock_guard lock(mutex_);
  return reclaim_locked(wait);
}

void KvSpace::take_back_locked(std::vector<VirtualMemory::Physical>& granules) {
  const uint64_t g = vm_->granule_bytes();
  const uint64_t room = pool_target_ > pool_.size() ? pool_target_ - pool_.size() : 0;
  const uint64_t pooled = std::min<uint64_t>(room, granules.size());
  // Never past the target, so within the capacity set_pool_target() reserved: no allocation
  // here, where a failure would leave granules unaccounted for.
  pool_.insert(pool_.end(), granules.begin(),
               granules.begin() + static_cast<std::ptrdiff_t>(pooled));
  memory_.transfer(MemoryCategory::KvCommitted, MemoryCategory::KvPool, pooled * g);
  for (size_t i = pooled; i < granules.size(); ++i) vm_->destroy(granules[i]);
  memory_.release(MemoryCategory::KvCommitted, (granules.size() - pooled) * g);
  granules.clear();
}

void KvSpace::destroy_pooled_locked(uint64_t keep) {
  const uint64_t g = vm_->granule_bytes();
  while (pool_.size() > keep) {
    vm_->destroy(pool_.back());
    pool_.pop_back();
    memory_.release(MemoryCategory::KvPool, g);
  }
}

void KvSpace::set_pool_target(uint64_t granules) {
  std::lock_guard lock(mutex_);
  pool_.reserve(granules);
  pool_target_ = granules;
  destroy_pooled_locked(granules);
}

uint64_t KvSpace::refill_pool() {
  std::lock_guard lock(mutex_);
  const uint64_t g = vm_->granule_bytes();
  const auto start = std::chrono::steady_clock::now();
  uint64_t created = 0;
  try {
    reclaim_locked(false);  // granules whose device work has completed go to the pool first
  } catch (const std::exception& e) {
    logger("engine.kv")->error("unmapping retired KV granules: {}", e.what());
  }
  try {
    while (pool_.size() < pool_target_ && memory_.try_charge(MemoryCategory::KvPool, g)) {
      VirtualMemory::Physical p{};
      try {
        p = vm_->create();
      } catch (...) {
        memory_.release(MemoryCategory::KvPool, g);
        throw;
      }
      pool_.push_back(p);
      ++created;
    }
  } catch (const std::exception& e) {
    // The device refused memory the budget allowed: map_through() creates on demand later,
    // where a failure reaches the sequence that needed it.
    logger("engine.kv")->warn("pre-creating KV granules stopped after {}: {}", created, e.what());
  }
  stats_.granules_created += created;
  stats_.last_refill_us += microseconds_since(start);
  return created;
}

void KvSpace::trim_pool(uint64_t keep) {
  std::lock_guard lock(mutex_);
  destroy_pooled_locked(keep);
}

uint64_t KvSpace::budget_available_bytes() const {
  std::lock_guard lock(mutex_);
  // Retiring granules count: map_through() waits for their device work when it needs them.
  return memory_.available_bytes() + pool_.size() * vm_->granule_bytes() + stats_.retiring_bytes;
}

uint64_t KvSpace::committed_bytes(int32_t slot) const {
  check_slot(slot);
  std::lock_guard lock(mutex_);
  uint64_t granules = 0;
  for (int p = 0; p < parts(); ++p) granules += state(slot, p).hi - state(slot, p).lo;
  return granules * vm_->granule_bytes();
}

uint64_t KvSpace::committed_bytes(int32_t slot, int part) const {
  check_slot(slot);
  part_offset_bytes(part);  // checks the part
  std::lock_guard lock(mutex_);
  return (state(slot, part).hi - state(slot, part).lo) * vm_->granule_bytes();
}

int64_t KvSpace::committed_tokens(int32_t slot) const {
  check_slot(slot);
  std::lock_guard lock(mutex_);
  int64_t tokens = geometry_.max_tokens;
  const uint64_t g = vm_->granule_bytes();
  for (int p = 0; p < parts(); ++p) {
    const auto bytes_per_token =
        static_cast<uint64_t>(parts_[static_cast<size_t>(p)].bytes_per_token);
    if (bytes_per_token == 0) continue;
    tokens = std::min(tokens, static_cast<int64_t>(state(slot, p).hi * g / bytes_per_token));
  }
  return tokens;
}

bool KvSpace::can_continue_at(int32_t slot, int64_t tokens) const {
  check_slot(slot);
  std::lock_guard lock(mutex_);
  const uint64_t g = vm_->granule_bytes();
  for (int p = 0; p < parts(); ++p) {
    const KvPartGeometry& part = parts_[static_cast<size_t>(p)];
    if (part.bytes_per_token == 0 || tokens <= 0) continue;
    const PartState& st = state(slot, p);
    const int64_t first =
        part.window_tokens > 0 ? std::max<int64_t>(0, tokens + 1 - part.window_tokens) : 0;
    const auto bytes_per_token = static_cast<uint64_t>(part.bytes_per_token);
    if (st.lo * g > static_cast<uint64_t>(first) * bytes_per_token ||
        st.hi * g < static_cast<uint64_t>(tokens) * bytes_per_token)
      return false;
  }
  return true;
}

std::vector<KvSpace::Range> KvSpace::live_ranges(int64_t tokens) const {
  std::vector<Range> ranges;
  const int64_t t = std::clamp<int64_t>(tokens, 0, geometry_.max_tokens);
  for (int p = 0; p < parts(); ++p) {
    const KvPartGeometry& part = parts_[static_cast<size_t>(p)];
    const int64_t first =
        part.window_tokens > 0 ? std::max<int64_t>(0, t + 1 - part.window_tokens) : 0;
    const auto bytes_per_token = static_cast<uint64_t>(part.bytes_per_token);
    const uint64_t bytes = static_cast<uint64_t>(t - first) * bytes_per_token;
    if (bytes == 0) continue;
    ranges.push_back(
        {part_offsets_[static_cast<size_t>(p)] + static_cast<uint64_t>(first) * bytes_per_token,
         bytes});
  }
  return ranges;
}

uint64_t KvSpace::live_bytes(int64_t tokens) const {
  uint64_t bytes = 0;
  for (const Range& r : live_ranges(tokens)) bytes += r.bytes;
  return bytes;
}

uint64_t KvSpace::reserved_bytes(int32_t slot) const {
  check_slot(slot);
  return slot_bytes_;
}

uint64_t KvSpace::bytes_for_tokens(int64_t tokens) const {
  const int64_t clamped = std::clamp<int64_t>(tokens, 0, geometry_.max_tokens);
  uint64_t granules = 0;
  for (int p = 0; p < parts(); ++p) {
    const KvPartGeometry& part = parts_[static_cast<size_t>(p)];
    uint64_t n = granules_through(p, clamped);
    // A window part holds the granules of its window and the one its start falls in.
    if (part.window_tokens > 0) n = std::min(n, granules_through(p, part.window_tokens) + 1);
    granules += n;
  }
  return granules * vm_->granule_bytes();
}

KvStats KvSpace::stats() const {
  std::lock_guard lock(mutex_);
  KvStats s = stats_;
  s.pool_bytes = pool_.size() * vm_->granule_bytes();
  s.pool_target_granules = pool_target_;
  return s;
}

void KvSpace::reset_step_stats() {
  std::lock_guard lock(mutex_);
  stats_.last_mapping_us = 0;
  stats_.last_granules_mapped = 0;
  stats_.last_granules_unmapped = 0;
  stats_.last_granules_created = 0;
  stats_.last_refill_us = 0;
  stats_.last_ahead_granules = 0;
  stats_.last_ahead_us = 0;
}

}  // namespace granule
