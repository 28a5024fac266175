// KvSpace never unmaps or releases a granule that queued device work may still touch: a
// VirtualMemory stand-in for a GPU keeps a queue of simulated device work over address
// ranges, completes it only when the test says so, and records every unmap that lands
// under work that has not completed (what poisons a CUDA context when the GPU is shared
// and its queue runs late). Truncation, release, regrowth, budget pressure, the pool and
// shutdown are checked against it, alone and in a long randomized run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "granule/error.h"
#include "memory/kv_space.h"
#include "memory/memory_manager.h"

namespace granule {
namespace {

constexpr uint64_t kGranule = 64ull << 10;

uint64_t round_up(uint64_t bytes, uint64_t granule) {
  return (bytes + granule - 1) / granule * granule;
}

// Host memory with a simulated device queue. Work items are numbered from 1; a fence's
// ticket is the number of the last item queued before it, and a ticket has passed once the
// "device" has completed that item. fence_wait() lets the device run up to the ticket.
class QueuedVirtualMemory final : public VirtualMemory {
 public:
  QueuedVirtualMemory() : host_(make_host_virtual_memory(kGranule)) {}

  uint64_t granule_bytes() const override { return host_->granule_bytes(); }
  uint8_t* reserve(uint64_t bytes) override { return host_->reserve(bytes); }
  void unreserve(uint8_t* base, uint64_t bytes) override { host_->unreserve(base, bytes); }
  Physical create() override { return host_->create(); }
  void destroy(Physical granule) noexcept override { host_->destroy(granule); }
  void map(uint8_t* addr, std::span<const Physical> granules) override {
    host_->map(addr, granules);
    map_calls_ += granules.size();
  }
  void unmap(uint8_t* addr, uint64_t count, std::vector<Physical>& out) override {
    if (in_flight(addr, addr + count * granule_bytes())) {
      ++violations_;
      if (shared_violations_) ++*shared_violations_;
    }
    host_->unmap(addr, count, out);
    unmapped_ += count;
  }

  uint64_t fence() override {
    ++fences_;
    return static_cast<uint64_t>(work_.size());
  }
  bool fence_passed(uint64_t ticket) override { return completed_ >= ticket; }
  void fence_wait(uint64_t ticket) override {
    ++waits_;
    completed_ = std::max(completed_, ticket);
  }

  // Device work that reads or writes [from, to) once it runs.
  void queue(const uint8_t* from, const uint8_t* to) { work_.push_back({from, to}); }
  uint64_t queued() const { return work_.size(); }
  void complete_through(uint64_t item) { completed_ = std::max(completed_, item); }
  void complete_all() { completed_ = work_.size(); }

  uint64_t violations() const { return violations_; }
  uint64_t map_calls() const { return map_calls_; }
  uint64_t unmapped() const { return unmapped_; }
  uint64_t waits() const { return waits_; }
  uint64_t fences() const { return fences_; }

 private:
  struct Work {
    const uint8_t* from;
    const uint8_t* to;
  };
  // Whether work not yet completed touches [from, to).
  bool in_flight(const uint8_t* from, const uint8_t* to) const {
    for (uint64_t i = completed_; i < work_.size(); ++i)
      if (work_[i].from < to && from < work_[i].to) return true;
    return false;
  }

  std::unique_ptr<VirtualMemory> host_;
  std::vector<Work> work_;
  uint64_t completed_ = 0;
  uint64_t violations_ = 0, map_calls_ = 0, unmapped_ = 0, waits_ = 0, fences_ = 0;
  uint64_t* shared_violations_ = nullptr;

 public:
  // Also counts violations here, for a test that outlives this object.
  void count_violations_in(uint64_t* counter) { shared_violations_ = counter; }
};

KvGeometry geometry() {
  KvGeometry g;
  g.bytes_per_token = 1000;  // tokens straddle granules
  g.max_tokens = 300;        // 5 granules of 64 KiB per slot
  g.slots = 3;
  g.lookahead_tokens = 16;
  return g;
}

struct Fixture {
  MemoryManager memory;
  QueuedVirtualMemory* vm;
  KvSpace kv;
  explicit Fixture(uint64_t budget_bytes, std::unique_ptr<QueuedVirtualMemory> owned =
                                              std::make_unique<QueuedVirtualMemory>())
      : memory(budget_bytes), vm(owned.get()), kv(std::move(owned), geometry(), memory) {}
};

TEST(KvFence, TruncationUnderQueuedWorkUnmapsOnlyOnceTheWorkHasCompleted) {
  Fixture f(1ull << 30);
  ASSERT_TRUE(f.kv.map_through(0, 250));  // 250 + 16 tokens: 5 granules
  ASSERT_EQ(f.kv.committed_bytes(0), 5 * kGranule);
  uint8_t* base = f.kv.slot_base(0);
  std::memset(base, 0x5A, 250 * 1000);
  f.vm->queue(base, base + 250 * 1000);  // a step that reads all 250 tokens

  f.kv.truncate(0, 10);  // keep 1 granule; 4 must wait for the step
  EXPECT_EQ(f.kv.committed_bytes(0), kGranule) << "the slot stops using the cut at once";
  KvStats s = f.kv.stats();
  EXPECT_EQ(s.retiring_bytes, 4 * kGranule);
  EXPECT_EQ(s.unmaps_deferred, 4u);
  EXPECT_EQ(s.granules_unmapped, 0u);
  EXPECT_EQ(f.vm->unmapped(), 0u);
  EXPECT_EQ(f.memory.bytes(MemoryCategory::KvCommitted), 5 * kGranule)
      << "retiring granules are still device memory and stay in the ledger";
  EXPECT_EQ(base[250 * 1000 - 1], 0x5A) << "the queued step can still read what it reads";
  EXPECT_EQ(f.kv.budget_available_bytes(), f.memory.available_bytes() + 4 * kGranule)
      << "retiring granules count as room: map_through() waits for them when it needs them";

  EXPECT_EQ(f.kv.reclaim(), 0u) << "the step has not completed";
  f.vm->complete_all();
  EXPECT_EQ(f.kv.reclaim(), 4u);
  s = f.kv.stats();
  EXPECT_EQ(s.retiring_bytes, 0u);
  EXPECT_EQ(s.granules_unmapped, 4u);
  EXPECT_EQ(f.memory.bytes(MemoryCategory::KvCommitted), kGranule);
  EXPECT_EQ(f.vm->violations(), 0u);
  EXPECT_EQ(f.vm->waits(), 0u) << "nothing here needed to block";
}

TEST(KvFence, WithNoWorkInFlightTruncationUnmapsAtOnce) {
  Fixture f(1ull << 30);
  ASSERT_TRUE(f.kv.map_through(1, 250));
  f.vm->queue(f.kv.slot_base(1), f.kv.slot_base(1) + 1000);
  f.vm->complete_all();
  f.kv.release(1);
  EXPECT_EQ(f.vm->unmapped(), 5u);
  EXPECT_EQ(f.kv.stats().retiring_bytes, 0u);
  EXPECT_EQ(f.kv.stats().unmaps_deferred, 0u);
  EXPECT_EQ(f.memory.bytes(MemoryCategory::KvCommitted), 0u);
}

TEST(KvFence, ASlotThatGrowsAgainTakesItsOwnRetiringGranulesBackWithoutMapping) {
  Fixture f(1ull << 30);
  ASSERT_TRUE(f.kv.map_through(0, 250));
  uint8_t* base = f.kv.slot_base(0);
  std::memset(base, 0x11, 250 * 1000);
  f.vm->queue(base, base + 250 * 1000);
  const uint64_t maps_before = f.vm->map_calls();
  f.kv.truncate(0, 10);                   // regenerate: cut back to 10 tokens...
  ASSERT_TRUE(f.kv.map_through(0, 120));  // ...and write again while the old step runs
  EXPECT_EQ(f.vm->map_calls(), maps_before) << "the slot's own granules are still mapped";
  EXPECT_EQ(f.kv.committed_bytes(0), 3 * kGranule);  // 136 tokens of 1000 bytes
  EXPECT_EQ(f.kv.stats().retiring_bytes, 2 * kGranule);
  EXPECT_EQ(base[119 * 1000], 0x11) << "the same physical memory under the same address";
  f.vm->complete_all();
  f.kv.reclaim();
  EXPECT_EQ(f.vm->unmapped(), 2u);
  EXPECT_EQ(f.kv.committed_bytes(0), 3 * kGranule);
  EXPECT_EQ(f.memory.bytes(MemoryCategory::KvCommitted), 3 * kGranule);
  EXPECT_EQ(f.vm->violations(), 0u);
}

TEST(KvFence, ARefusedGrowthLeavesTheSlotAsItWasAndItsRetiringGranulesRetiring) {
  Fixture f(4 * kGranule);
  ASSERT_TRUE(f.kv.map_through(0, 150));  // 166 tokens: 3 granules
  f.vm->queue(f.kv.slot_base(0), f.kv.slot_base(0) + 150 * 1000);
  f.kv.truncate(0, 10);                   // 1 kept, 2 retiring behind the queued work
  ASSERT_TRUE(f.kv.map_through(1, 10));   // the 4th granule of the budget
  // 250 tokens need 4 granules: the 2 retiring ones come back, a 4th does not fit.
  EXPECT_FALSE(f.kv.map_through(0, 250));
  EXPECT_EQ(f.kv.committed_bytes(0), kGranule) << "a refusal changes nothing of the slot";
  EXPECT_EQ(f.kv.stats().retiring_bytes, 2 * kGranule);
  EXPECT_EQ(f.kv.stats().map_refusals, 1u);
  EXPECT_EQ(f.memory.bytes(MemoryCategory::KvCommitted), 4 * kGranule);
  f.vm->complete_all();
  f.kv.reclaim();
  EXPECT_EQ(f.memory.bytes(MemoryCategory::KvCommitted), 2 * kGranule);
  EXPECT_EQ(f.vm->violations(), 0u);
}

TEST(KvFence, MemoryNeededNowWaitsForTheWorkBehindRetiringGranules) {
  Fixture f(5 * kGranule);  // one full slot
  ASSERT_TRUE(f.kv.map_through(0, 250));
  f.vm->queue(f.kv.slot_base(0), f.kv.slot_base(0) + 250 * 1000);
  f.kv.release(0);  // the chat ended while its last step is still queued
  ASSERT_EQ(f.kv.stats().retiring_bytes, 5 * kGranule);
  EXPECT_FALSE(f.kv.map_ahead(1, 250)) << "mapping ahead never blocks on the device";
  EXPECT_EQ(f.vm->waits(), 0u);
  ASSERT_TRUE(f.kv.map_through(1, 250)) << "the budget holds it once the cut is unmapped";
  EXPECT_GT(f.vm->waits(), 0u);
  EXPECT_EQ(f.kv.stats().retiring_bytes, 0u);
  EXPECT_EQ(f.kv.committed_bytes(1), 5 * kGranule);
  EXPECT_EQ(f.vm->violations(), 0u);
}

TEST(KvFence, PoolRefillTakesOnlyGranulesWhoseWorkHasCompleted) {
  Fixture f(1ull << 30);
  f.kv.set_pool_target(8);
  ASSERT_TRUE(f.kv.map_through(2, 250));
  f.vm->queue(f.kv.slot_base(2), f.kv.slot_base(2) + 250 * 1000);
  f.kv.release(2);
  f.kv.refill_pool();  // creates fresh granules; the retiring ones are not touched
  EXPECT_EQ(f.kv.stats().retiring_bytes, 5 * kGranule);
  EXPECT_EQ(f.vm->violations(), 0u);
  f.vm->complete_all();
  f.kv.refill_pool();
  EXPECT_EQ(f.kv.stats().retiring_bytes, 0u);
  EXPECT_EQ(f.memory.bytes(MemoryCategory::KvPool), 8 * kGranule);
  EXPECT_EQ(f.memory.bytes(MemoryCategory::KvCommitted), 0u);
}

TEST(KvFence, ShutdownWaitsForQueuedWorkBeforeUnmapping) {
  auto owned = std::make_unique<QueuedVirtualMemory>();
  QueuedVirtualMemory* vm = owned.get();
  uint64_t violations = 0;
  vm->count_violations_in(&violations);
  MemoryManager memory(1ull << 30);
  {
    KvSpace kv(std::move(owned), geometry(), memory);
    ASSERT_TRUE(kv.map_through(0, 250));
    ASSERT_TRUE(kv.map_through(1, 100));
    vm->queue(kv.slot_base(0), kv.slot_base(1) + 100 * 1000);  // still queued at shutdown
    kv.truncate(0, 5);
    EXPECT_GT(kv.stats().retiring_bytes, 0u);
  }
  EXPECT_EQ(violations, 0u) << "shutdown unmapped under queued work";
  EXPECT_EQ(memory.bytes(MemoryCategory::KvCommitted), 0u);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvReservedVa), 0u);
}

// Steps as an engine runs them against a GPU that lags: every step queues work over each
// live slot's [0, used) and the device completes a random prefix of the queue, so at any
// time several steps are in flight. Slots grow, are cut back and released at random.
void run_randomized(uint64_t pool_target) {
  KvGeometry g;
  g.bytes_per_token = 1536;
  g.max_tokens = 1500;  // 36 granules per slot
  g.slots = 4;
  g.lookahead_tokens = 24;
  const uint64_t bpt = static_cast<uint64_t>(g.bytes_per_token);
  const uint64_t lookahead_bytes = round_up(g.lookahead_tokens * bpt, kGranule);
  auto owned = std::make_unique<QueuedVirtualMemory>();
  QueuedVirtualMemory* vm = owned.get();
  MemoryManager memory(40 * kGranule);
  KvSpace kv(std::move(owned), g, memory);
  kv.set_pool_target(pool_target);
  std::vector<int64_t> used(g.slots, 0);
  std::mt19937_64 rng(20261203);
  int grows = 0, refusals = 0, cuts = 0;

  for (int step = 0; step < 4000; ++step) {
    const auto slot = static_cast<int32_t>(rng() % g.slots);
    const int action = static_cast<int>(rng() % 100);
    if (action < 65) {
      const int64_t add = rng() % 4 == 0 ? 1 + static_cast<int64_t>(rng() % 400) : 1;
      const int64_t target = std::min(g.max_tokens, used[slot] + add);
      if (kv.map_through(slot, target)) {
        std::memset(kv.slot_base(slot) + used[slot] * bpt, slot + 1,
                    static_cast<size_t>((target - used[slot]) * bpt));
        used[slot] = target;
        ++grows;
      } else {
        ++refusals;
        int32_t largest = 0;
        for (int32_t s = 1; s < g.slots; ++s)
          if (used[s] > used[largest]) largest = s;
        kv.release(largest);
        used[largest] = 0;
      }
    } else if (action < 85) {
      const int64_t keep = used[slot] == 0 ? 0 : static_cast<int64_t>(rng() % (used[slot] + 1));
      kv.truncate(slot, keep);
      used[slot] = keep;
      ++cuts;
    } else if (action < 92) {
      kv.release(slot);
      used[slot] = 0;
      ++cuts;
    }
    // The step: work over every live slot's tokens, then the device catches up partly.
    for (int32_t s = 0; s < g.slots; ++s)
      if (used[s] > 0) vm->queue(kv.slot_base(s), kv.slot_base(s) + used[s] * bpt);
    if (vm->queued() > 0 && rng() % 3 == 0)
      vm->complete_through(vm->queued() - rng() % std::min<uint64_t>(vm->queued(), 12));
    kv.refill_pool();

    ASSERT_EQ(vm->violations(), 0u) << "an unmap landed under queued work at step " << step;
    uint64_t committed_sum = 0;
    for (int32_t s = 0; s < g.slots; ++s) {
      const uint64_t used_bytes = static_cast<uint64_t>(used[s]) * bpt;
      const uint64_t committed = kv.committed_bytes(s);
      ASSERT_GE(committed, used_bytes) << "slot " << s << " step " << step;
      ASSERT_LE(committed, round_up(used_bytes, kGranule) + lookahead_bytes)
          << "slot " << s << " step " << step;
      committed_sum += committed;
      // What the slot wrote is still there (its own retiring granules may serve again).
      if (used[s] > 0) ASSERT_EQ(kv.slot_base(s)[used[s] * bpt - 1], s + 1);
    }
    const KvStats stats = kv.stats();
    ASSERT_EQ(memory.bytes(MemoryCategory::KvCommitted), committed_sum + stats.retiring_bytes)
        << "step " << step;
    ASSERT_LE(memory.used_bytes(), memory.budget_bytes()) << "step " << step;
  }
  const KvStats stats = kv.stats();
  EXPECT_GT(grows, 1000);
  EXPECT_GT(refusals, 0);
  EXPECT_GT(cuts, 500);
  EXPECT_GT(stats.unmaps_deferred, 100u) << "the device lagged: many unmaps had to wait";
  EXPECT_GT(vm->waits(), 0u) << "pressure made some mapping wait for retiring granules";
  for (int32_t s = 0; s < g.slots; ++s) kv.release(s);
  vm->complete_all();
  kv.reclaim();
  EXPECT_EQ(memory.bytes(MemoryCategory::KvCommitted), 0u);
  EXPECT_EQ(vm->violations(), 0u);
}

TEST(KvFence, RandomizedStepsAgainstALaggingDeviceNeverUnmapUnderQueuedWork) { run_randomized(0); }

TEST(KvFence, RandomizedStepsWithAPoolNeverUnmapUnderQueuedWork) { run_randomized(6); }

}  // namespace
}  // namespace granule
