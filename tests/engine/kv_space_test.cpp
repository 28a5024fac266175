// Tests for KvSpace over host virtual memory: granule commit and tail decommit, the ledger,
// budget refusals, stable slot addresses, and a long randomized run that checks the
// design's invariant (committed <= ceil(used / granule) * granule + look-ahead) every step.
#include "memory/kv_space.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "granule/error.h"

namespace granule {
namespace {

constexpr uint64_t kSmallGranule = 64ull << 10;  // a multiple of the 4 KiB page, fast to touch
constexpr uint64_t kGpuGranule = 2ull << 20;

uint64_t round_up(uint64_t bytes, uint64_t granule) {
  return (bytes + granule - 1) / granule * granule;
}

// How many pages of [addr, addr + bytes) are backed by physical memory now.
uint64_t resident_pages(const uint8_t* addr, uint64_t bytes) {
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> flags(bytes / page);
  if (mincore(const_cast<uint8_t*>(addr), bytes, flags.data()) != 0) return UINT64_MAX;
  uint64_t resident = 0;
  for (unsigned char f : flags) resident += f & 1;
  return resident;
}

// The byte every test writes at `offset` of a slot: differs per slot and per position, so
// a misplaced, shifted or zeroed page shows.
uint8_t pattern(int32_t slot, uint64_t offset) {
  const uint64_t x = (offset + 1) * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(slot) << 40);
  return static_cast<uint8_t>(x >> 56);
}

void write_pattern(uint8_t* base, int32_t slot, uint64_t from, uint64_t to) {
  for (uint64_t o = from; o < to; ++o) base[o] = pattern(slot, o);
}

bool pattern_holds(const uint8_t* base, int32_t slot, uint64_t from, uint64_t to) {
  for (uint64_t o = from; o < to; ++o) {
    if (base[o] != pattern(slot, o)) return false;
  }
  return true;
}

KvGeometry small_geometry() {
  KvGeometry g;
  g.bytes_per_token = 1000;  // not a divisor of the granule: tokens straddle granules
  g.max_tokens = 300;        // 300,000 bytes -> 5 granules of 64 KiB per slot
  g.slots = 3;
  g.lookahead_tokens = 16;
  return g;
}

TEST(KvSpace, ReservesAllSlotsOnceAndChargesOnlyAddressSpace) {
  MemoryManager memory(1ull << 30);
  KvSpace kv(make_host_virtual_memory(kSmallGranule), small_geometry(), memory);
  const uint64_t slot_bytes = 5 * kSmallGranule;
  EXPECT_EQ(kv.granule_bytes(), kSmallGranule);
  for (int32_t s = 0; s < 3; ++s) {
    EXPECT_EQ(kv.reserved_bytes(s), slot_bytes);
    EXPECT_EQ(kv.committed_bytes(s), 0u);
    EXPECT_EQ(kv.slot_base(s), kv.slot_base(0) + s * slot_bytes) << "slot " << s;
  }
  EXPECT_EQ(reinterpret_cast<uintptr_t>(kv.slot_base(0)) % kSmallGranule, 0u);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvReservedVa), 3 * slot_bytes);
  EXPECT_EQ(memory.used_bytes(), 0u);
  EXPECT_EQ(kv.stats().reserved_bytes, 3 * slot_bytes);
  EXPECT_EQ(kv.stats().committed_bytes, 0u);
  EXPECT_EQ(resident_pages(kv.slot_base(0), 3 * slot_bytes), 0u);
}

TEST(KvSpace, MapThroughCommitsGranulesForTokensPlusLookahead) {
  MemoryManager memory(1ull << 30);
  KvSpace kv(make_host_virtual_memory(kSmallGranule), small_geometry(), memory);
  ASSERT_TRUE(kv.map_through(0, 10));  // (10 + 16) * 1000 bytes -> 1 granule
  EXPECT_EQ(kv.committed_bytes(0), kSmallGranule);
  EXPECT_EQ(kv.committed_tokens(0), 65);  // 65,536 / 1,000
  ASSERT_TRUE(kv.map_through(0, 49));     // 65,000 bytes: still 1 granule
  EXPECT_EQ(kv.committed_bytes(0), kSmallGranule);
  ASSERT_TRUE(kv.map_through(0, 50));  // 66,000 bytes -> 2 granules
  EXPECT_EQ(kv.committed_bytes(0), 2 * kSmallGranule);
  ASSERT_TRUE(kv.map_through(0, 300));  // clamped to max_tokens: 300,000 -> 5 granules
  EXPECT_EQ(kv.committed_bytes(0), 5 * kSmallGranule);
  EXPECT_EQ(kv.committed_tokens(0), 300);
  // Mapping less than is committed changes nothing.
  ASSERT_TRUE(kv.map_through(0, 3));
  EXPECT_EQ(kv.committed_bytes(0), 5 * kSmallGranule);
  EXPECT_EQ(kv.committed_bytes(1), 0u);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvCommitted), 5 * kSmallGranule);
  const KvStats stats = kv.stats();
  EXPECT_EQ(stats.granules_mapped, 5u);
  EXPECT_EQ(stats.granules_unmapped, 0u);
  EXPECT_EQ(stats.committed_bytes, 5 * kSmallGranule);
  EXPECT_GE(stats.last_mapping_us, 0.0);
}

// The case: what the scheduler asks before admitting a chat — the whole granules that hold
// a number of tokens (clamped to the slot) and what the budget can still charge.
TEST(KvSpace, BytesForTokensAreWholeGranulesWithinTheSlotAndBudgetRoomIsReported) {
  MemoryManager memory(4 * kSmallGranule + 100);
  KvSpace kv(make_host_virtual_memory(kSmallGranule), small_geometry(), memory);
  EXPECT_EQ(kv.bytes_for_tokens(0), 0u);
  EXPECT_EQ(kv.bytes_for_tokens(1), kSmallGranule);
  EXPECT_EQ(kv.bytes_for_tokens(65), kSmallGranule);        // 65,000 bytes
  EXPECT_EQ(kv.bytes_for_tokens(66), 2 * kSmallGranule);    // 66,000 bytes
  EXPECT_EQ(kv.bytes_for_tokens(1000), 5 * kSmallGranule);  // clamped to the 300-token slot
  EXPECT_EQ(kv.budget_available_bytes(), 4 * kSmallGranule + 100);
  ASSERT_TRUE(kv.map_through(1, 60));  // 76,000 bytes with the look-ahead: 2 granules
  EXPECT_EQ(kv.budget_available_bytes(), 2 * kSmallGranule + 100);
}

// The case: the per-step counters (granules mapped and unmapped since reset_step_stats) and
// the peak of committed bytes follow maps and truncations; the cumulative ones keep counting.
TEST(KvSpace, StepCountersAndPeakFollowMapsAndUnmaps) {
  MemoryManager memory(1ull << 30);
  KvSpace kv(make_host_virtual_memory(kSmallGranule), small_geometry(), memory);
  ASSERT_TRUE(kv.map_through(0, 200));  // 216,000 bytes: 4 granules
  ASSERT_TRUE(kv.map_through(1, 10));   // 1 granule
  KvStats s = kv.stats();
  EXPECT_EQ(s.last_granules_mapped, 5u);
  EXPECT_EQ(s.last_granules_unmapped, 0u);
  EXPECT_EQ(s.peak_committed_bytes, 5 * kSmallGranule);
  kv.reset_step_stats();
  kv.truncate(0, 70);  // keeps 70,000 bytes: 2 granules
  kv.release(1);
  s = kv.stats();
  EXPECT_EQ(s.last_granules_mapped, 0u);
  EXPECT_EQ(s.last_granules_unmapped, 3u);
  EXPECT_EQ(s.granules_mapped, 5u);
  EXPECT_EQ(s.granules_unmapped, 3u);
  EXPECT_EQ(s.committed_bytes, 2 * kSmallGranule);
  EXPECT_EQ(s.peak_committed_bytes, 5 * kSmallGranule);  // the peak stays
  kv.reset_step_stats();
  EXPECT_EQ(kv.stats().last_granules_unmapped, 0u);
}

TEST(KvSpace, RejectsBadSlotsTokensAndGeometry) {
  MemoryManager memory(1ull << 30);
  KvSpace kv(make_host_virtual_memory(kSmallGranule), small_geometry(), memory);
  EXPECT_THROW(kv.map_through(3, 1), UsageError);
  EXPECT_THROW(kv.map_through(-1, 1), UsageError);
  EXPECT_THROW(kv.map_through(0, 301), UsageError);
  EXPECT_THROW(kv.map_through(0, -1), UsageError);
  EXPECT_THROW(kv.truncate(0, -1), UsageError);
  EXPECT_THROW(kv.slot_base(7), UsageError);
  KvGeometry bad = small_geometry();
  bad.bytes_per_token = 0;
  EXPECT_THROW(KvSpace(make_host_virtual_memory(kSmallGranule), bad, memory), UsageError);
  EXPECT_THROW(make_host_virtual_memory(1000), UsageError);  // not a page multiple
}

TEST(KvSpace, TruncateDecommitsWholeGranulesPastTheKeptTokensAndKeepsTheirData) {
  MemoryManager memory(1ull << 30);
  KvSpace kv(make_host_virtual_memory(kSmallGranule), small_geometry(), memory);
  uint8_t* base = kv.slot_base(1);
  ASSERT_TRUE(kv.map_through(1, 200));  // 216,000 bytes -> 4 granules
  ASSERT_EQ(kv.committed_bytes(1), 4 * kSmallGranule);
  write_pattern(base, 1, 0, 200 * 1000);

  kv.truncate(1, 70);  // 70,000 bytes -> the first 2 granules stay
  EXPECT_EQ(kv.committed_bytes(1), 2 * kSmallGranule);
  EXPECT_TRUE(pattern_holds(base, 1, 0, 70 * 1000));
  // The rest of the last kept granule is not "wholly past" the tokens: it stays intact.
  EXPECT_TRUE(pattern_holds(base, 1, 70 * 1000, 2 * kSmallGranule));
  kv.truncate(1, 66);  // 66,000 bytes still needs 2 granules
  EXPECT_EQ(kv.committed_bytes(1), 2 * kSmallGranule);
  kv.truncate(1, 65);  // 65,000 bytes fits in 1
  EXPECT_EQ(kv.committed_bytes(1), kSmallGranule);
  EXPECT_TRUE(pattern_holds(base, 1, 0, 65 * 1000));
  kv.truncate(1, 200);  // longer than committed: nothing to do
  EXPECT_EQ(kv.committed_bytes(1), kSmallGranule);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvCommitted), kSmallGranule);
  EXPECT_EQ(kv.stats().granules_unmapped, 3u);
  kv.release(1);
  EXPECT_EQ(kv.committed_bytes(1), 0u);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvCommitted), 0u);
}

TEST(KvSpace, DecommittedPagesGoBackToTheSystem) {
  MemoryManager memory(1ull << 30);
  KvSpace kv(make_host_virtual_memory(kSmallGranule), small_geometry(), memory);
  uint8_t* base = kv.slot_base(2);
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  ASSERT_TRUE(kv.map_through(2, 300));
  std::memset(base, 0xAB, 5 * kSmallGranule);
  EXPECT_EQ(resident_pages(base, 5 * kSmallGranule), 5 * kSmallGranule / page);

  kv.truncate(2, 60);  // keeps 1 granule
  EXPECT_EQ(resident_pages(base, kSmallGranule), kSmallGranule / page);
  EXPECT_EQ(resident_pages(base + kSmallGranule, 4 * kSmallGranule), 0u);
  // Committed again, the tail is fresh memory (zeros on the host), not the old bytes.
  ASSERT_TRUE(kv.map_through(2, 280));
  EXPECT_EQ(base[kSmallGranule], 0);
  EXPECT_EQ(base[5 * kSmallGranule - 1], 0);
  EXPECT_EQ(base[kSmallGranule - 1], 0xAB);
}

TEST(KvSpace, TouchingMemoryPastTheCommittedGranulesFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  MemoryManager memory(1ull << 30);
  KvSpace kv(make_host_virtual_memory(kSmallGranule), small_geometry(), memory);
  ASSERT_TRUE(kv.map_through(0, 10));
  uint8_t* base = kv.slot_base(0);
  base[kSmallGranule - 1] = 1;  // the last committed byte is writable
  EXPECT_DEATH({ base[kSmallGranule] = 1; }, "");
  kv.release(0);
  EXPECT_DEATH({ base[0] = 1; }, "");
}

TEST(KvSpace, BudgetRefusalLeavesEverythingUnchanged) {
  // Budget for 3 granules: slot 0 takes 2, slot 1 can take 1 more but not 2.
  MemoryManager memory(3 * kSmallGranule);
  KvSpace kv(make_host_virtual_memory(kSmallGranule), small_geometry(), memory);
  ASSERT_TRUE(kv.map_through(0, 100));  // 116,000 bytes -> 2 granules
  ASSERT_TRUE(kv.map_through(1, 10));   // 1 granule: budget now full
  const KvStats before = kv.stats();
  EXPECT_FALSE(kv.map_through(1, 70));  // needs a second granule even without look-ahead
  EXPECT_FALSE(kv.map_through(2, 1));
  const KvStats after = kv.stats();
  EXPECT_EQ(kv.committed_bytes(1), kSmallGranule);
  EXPECT_EQ(kv.committed_bytes(2), 0u);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvCommitted), 3 * kSmallGranule);
  EXPECT_EQ(after.granules_mapped, before.granules_mapped);
  EXPECT_EQ(after.committed_bytes, before.committed_bytes);
  EXPECT_EQ(after.map_refusals, before.map_refusals + 2);
  // Freeing one slot lets the other grow.
  kv.release(0);
  EXPECT_TRUE(kv.map_through(1, 70));
  EXPECT_EQ(kv.committed_bytes(1), 2 * kSmallGranule);
}

TEST(KvSpace, LookaheadIsDroppedWhenOnlyTheStepsTokensFit) {
  MemoryManager memory(kSmallGranule);
  KvSpace kv(make_host_virtual_memory(kSmallGranule), small_geometry(), memory);
  // 60 tokens fit in one granule; 60 + 16 look-ahead would need two.
  EXPECT_TRUE(kv.map_through(0, 60));
  EXPECT_EQ(kv.committed_bytes(0), kSmallGranule);
  EXPECT_EQ(kv.stats().map_refusals, 0u);
  EXPECT_FALSE(kv.map_through(0, 66));
  EXPECT_EQ(kv.committed_bytes(0), kSmallGranule);
}

// A VirtualMemory over the host one whose create() fails after a set number of granules,
// to check that KvSpace undoes a half-done commit; it counts what is mapped and what exists.
class FailingVirtualMemory final : public VirtualMemory {
 public:
  explicit FailingVirtualMemory(int creates_before_failure)
      : host_(make_host_virtual_memory(kSmallGranule)), creates_left_(creates_before_failure) {}
  uint64_t granule_bytes() const override { return host_->granule_bytes(); }
  uint8_t* reserve(uint64_t bytes) override { return host_->reserve(bytes); }
  void unreserve(uint8_t* base, uint64_t bytes) override { host_->unreserve(base, bytes); }
  Physical create() override {
    if (creates_left_-- <= 0) throw DeviceError("injected create failure");
    ++existing_;
    return host_->create();
  }
  void destroy(Physical granule) noexcept override {
    --existing_;
    host_->destroy(granule);
  }
  void map(uint8_t* addr, std::span<const Physical> granules) override {
    host_->map(addr, granules);
    committed_ += static_cast<int>(granules.size());
  }
  void unmap(uint8_t* addr, uint64_t count, std::vector<Physical>& out) override {
    host_->unmap(addr, count, out);
    committed_ -= static_cast<int>(count);
  }
  int committed() const { return committed_; }
  int existing() const { return existing_; }
  void allow_creates(int n) { creates_left_ = n; }

 private:
  std::unique_ptr<VirtualMemory> host_;
  int creates_left_;
  int committed_ = 0;
  int existing_ = 0;
};

TEST(KvSpace, FailedCommitIsRolledBackAndUncharged) {
  MemoryManager memory(1ull << 30);
  auto vm = std::make_unique<FailingVirtualMemory>(3);
  FailingVirtualMemory* failing = vm.get();
  KvSpace kv(std::move(vm), small_geometry(), memory);
  ASSERT_TRUE(kv.map_through(0, 10));                 // 1 granule
  EXPECT_THROW(kv.map_through(0, 250), DeviceError);  // wants 5: the 3rd create fails
  EXPECT_EQ(failing->committed(), 1);
  EXPECT_EQ(failing->existing(), 1);
  EXPECT_EQ(kv.committed_bytes(0), kSmallGranule);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvCommitted), kSmallGranule);
  EXPECT_EQ(kv.stats().granules_mapped, 1u);
}

TEST(KvSpace, DestructionReturnsEveryByteAndTheAddressSpace) {
  MemoryManager memory(1ull << 30);
  uint8_t* base = nullptr;
  {
    KvSpace kv(make_host_virtual_memory(kSmallGranule), small_geometry(), memory);
    base = kv.slot_base(0);
    ASSERT_TRUE(kv.map_through(0, 300));
    ASSERT_TRUE(kv.map_through(2, 40));
    EXPECT_GT(memory.used_bytes(), 0u);
  }
  for (uint64_t bytes : memory.snapshot()) EXPECT_EQ(bytes, 0u);
  // mincore fails with ENOMEM on an unmapped range: the reservation is gone.
  EXPECT_EQ(resident_pages(base, kSmallGranule), UINT64_MAX);
}

TEST(KvSpace, TwoMegabyteGranulesForSmolLm2ShapesDecodeOneGranuleAtATime) {
  // SmolLM2-135M in fp16: 30 layers x K,V x 3 kv heads x 64 dims x 2 bytes per token.
  KvGeometry g;
  g.bytes_per_token = 30 * 2 * 3 * 64 * 2;  // 23,040: 91 tokens per 2 MiB granule
  g.max_tokens = 2048;
  g.slots = 2;
  g.lookahead_tokens = 16;
  MemoryManager memory(1ull << 30);
  KvSpace kv(make_host_virtual_memory(kGpuGranule), g, memory);
  uint8_t* base = kv.slot_base(1);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(kv.slot_base(0)) % kGpuGranule, 0u);
  EXPECT_EQ(kv.reserved_bytes(1), round_up(2048ull * 23040, kGpuGranule));
  const uint64_t lookahead_bytes = round_up(16ull * 23040, kGpuGranule);
  for (int64_t token = 0; token < 2048; ++token) {
    ASSERT_TRUE(kv.map_through(1, token + 1));
    write_pattern(base, 1, token * 23040, (token + 1) * 23040);
    const uint64_t used = (token + 1) * 23040;
    ASSERT_LE(kv.committed_bytes(1), round_up(used, kGpuGranule) + lookahead_bytes);
    ASSERT_GE(kv.committed_bytes(1), used);
    ASSERT_EQ(kv.slot_base(1), base);
  }
  EXPECT_TRUE(pattern_holds(base, 1, 0, 2048ull * 23040));
  // 47,185,920 bytes -> 23 granules, each mapped once.
  EXPECT_EQ(kv.stats().granules_mapped, 23u);
  EXPECT_EQ(kv.committed_bytes(1), 23 * kGpuGranule);
  kv.truncate(1, 100);  // 2,304,000 bytes -> 2 granules
  EXPECT_EQ(kv.committed_bytes(1), 2 * kGpuGranule);
  EXPECT_TRUE(pattern_holds(base, 1, 0, 100ull * 23040));
  EXPECT_EQ(resident_pages(base + 2 * kGpuGranule, 21 * kGpuGranule), 0u);
  kv.release(1);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvCommitted), 0u);
  EXPECT_EQ(kv.stats().granules_unmapped, 23u);
}

TEST(KvSpace, StatsCanBeReadWhileAnotherThreadMapsAndTruncates) {
  // Telemetry reads from another thread while the engine thread maps: every snapshot must
  // be self-consistent (committed = mapped - unmapped granules) and within the reservation.
  MemoryManager memory(1ull << 30);
  KvSpace kv(make_host_virtual_memory(kSmallGranule), small_geometry(), memory);
  std::atomic<bool> done{false};
  std::thread engine_thread([&] {
    std::mt19937_64 rng(3);
    for (int i = 0; i < 20000; ++i) {
      const auto slot = static_cast<int32_t>(rng() % 3);
      if (rng() % 3 == 0) {
        kv.truncate(slot, static_cast<int64_t>(rng() % 300));
      } else {
        EXPECT_TRUE(kv.map_through(slot, static_cast<int64_t>(rng() % 301)));
      }
    }
    done = true;
  });
  int snapshots = 0, inconsistent = 0;
  while (!done) {
    const KvStats stats = kv.stats();
    inconsistent += stats.committed_bytes !=
                        (stats.granules_mapped - stats.granules_unmapped) * kSmallGranule ||
                    stats.committed_bytes > stats.reserved_bytes;
    ++snapshots;
  }
  engine_thread.join();
  EXPECT_EQ(inconsistent, 0);
  EXPECT_GT(snapshots, 0);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvCommitted), kv.stats().committed_bytes);
}

// The long randomized run: several slots grow by prompt chunks and decode steps, are cut
// back (regenerate, edit) and released, against a budget that cannot hold them all and
// that other charges squeeze. After every step: slot addresses are unchanged, every used
// byte is committed, committed stays within the invariant, the ledger equals the sum of
// committed bytes, and the data written so far is still there (no move, no copy). With a
// pool, it is topped up after every step (as the engine does) and granules cycle through it.
void run_randomized(uint64_t pool_target) {
  KvGeometry g;
  g.bytes_per_token = 1536;  // 42.7 tokens per 64 KiB granule
  g.max_tokens = 1500;       // 36 granules per slot
  g.slots = 4;
  g.lookahead_tokens = 24;
  const uint64_t granule = kSmallGranule;
  const uint64_t bpt = static_cast<uint64_t>(g.bytes_per_token);
  const uint64_t lookahead_bytes = round_up(g.lookahead_tokens * bpt, granule);
  MemoryManager memory(40 * granule);  // well under 4 x 36 granules
  KvSpace kv(make_host_virtual_memory(granule), g, memory);
  kv.set_pool_target(pool_target);

  std::vector<uint8_t*> bases;
  for (int32_t s = 0; s < g.slots; ++s) bases.push_back(kv.slot_base(s));
  std::vector<int64_t> used(g.slots, 0);  // tokens written per slot
  uint64_t other_charge = 0;              // what "weights" hold at the moment
  std::mt19937_64 rng(20261202);
  int grows = 0, refusals = 0, truncations = 0, releases = 0, squeezes = 0;

  for (int step = 0; step < 6000; ++step) {
    const auto slot = static_cast<int32_t>(rng() % g.slots);
    const int action = static_cast<int>(rng() % 100);
    if (action < 70) {
      // Grow: usually a decode step of 1 token, sometimes a prefill chunk.
      const int64_t add = rng() % 4 == 0 ? 1 + static_cast<int64_t>(rng() % 400) : 1;
      const int64_t target = std::min(g.max_tokens, used[slot] + add);
      const uint64_t committed_before = kv.committed_bytes(slot);
      const uint64_t ledger_before = memory.bytes(MemoryCategory::KvCommitted);
      const uint64_t pool_before = memory.bytes(MemoryCategory::KvPool);
      const uint64_t mapped_before = kv.stats().granules_mapped;
      if (kv.map_through(slot, target)) {
        write_pattern(bases[slot], slot, used[slot] * bpt, target * bpt);
        used[slot] = target;
        ++grows;
      } else {
        ++refusals;
        ASSERT_EQ(kv.committed_bytes(slot), committed_before) << "step " << step;
        ASSERT_EQ(memory.bytes(MemoryCategory::KvCommitted), ledger_before) << "step " << step;
        ASSERT_EQ(memory.bytes(MemoryCategory::KvPool), pool_before) << "step " << step;
        ASSERT_EQ(kv.stats().granules_mapped, mapped_before) << "step " << step;
        // A refusal means the pool could not cover the step either.
        ASSERT_LT(kv.stats().pool_bytes, round_up(target * bpt, granule)) << "step " << step;
        // What the caller does when refused: free the slot that holds the most.
        int32_t largest = 0;
        for (int32_t s = 1; s < g.slots; ++s) {
          if (used[s] > used[largest]) largest = s;
        }
        kv.release(largest);
        used[largest] = 0;
      }
    } else if (action < 88) {
      const int64_t keep = used[slot] == 0 ? 0 : static_cast<int64_t>(rng() % (used[slot] + 1));
      kv.truncate(slot, keep);
      used[slot] = keep;
      ++truncations;
    } else if (action < 95) {
      kv.release(slot);
      used[slot] = 0;
      ++releases;
    } else {
      // Something else takes or gives back budget (a layer made resident, a workspace).
      if (other_charge > 0) {
        memory.release(MemoryCategory::WeightsResident, other_charge);
        other_charge = 0;
      } else if (memory.try_charge(MemoryCategory::WeightsResident, 20 * granule)) {
        other_charge = 20 * granule;
        ++squeezes;
      }
    }

    uint64_t committed_sum = 0;
    for (int32_t s = 0; s < g.slots; ++s) {
      const uint64_t used_bytes = used[s] * bpt;
      const uint64_t committed = kv.committed_bytes(s);
      ASSERT_EQ(kv.slot_base(s), bases[s]) << "slot " << s << " moved at step " << step;
      ASSERT_GE(committed, used_bytes) << "slot " << s << " step " << step;
      ASSERT_LE(committed, round_up(used_bytes, granule) + lookahead_bytes)
          << "slot " << s << " step " << step;
      ASSERT_EQ(committed % granule, 0u);
      committed_sum += committed;
      // Spot-check the data each step, all of it now and then.
      if (used_bytes > 0) {
        for (int probe = 0; probe < 8; ++probe) {
          const uint64_t o = rng() % used_bytes;
          ASSERT_EQ(bases[s][o], pattern(s, o)) << "slot " << s << " offset " << o;
        }
        if (step % 500 == 0) ASSERT_TRUE(pattern_holds(bases[s], s, 0, used_bytes));
      }
    }
    ASSERT_EQ(memory.bytes(MemoryCategory::KvCommitted), committed_sum) << "step " << step;
    ASSERT_EQ(kv.stats().committed_bytes, committed_sum) << "step " << step;
    ASSERT_LE(memory.used_bytes(), memory.budget_bytes()) << "step " << step;
    kv.refill_pool();
    const KvStats after = kv.stats();
    ASSERT_EQ(memory.bytes(MemoryCategory::KvPool), after.pool_bytes) << "step " << step;
    ASSERT_LE(after.pool_bytes, pool_target * granule) << "step " << step;
    // The pool is full unless the budget stopped it.
    if (after.pool_bytes < pool_target * granule)
      ASSERT_LT(memory.available_bytes(), granule) << "step " << step;
    ASSERT_EQ(kv.budget_available_bytes(), memory.available_bytes() + after.pool_bytes);
  }
  std::printf("grows %d refusals %d truncations %d releases %d squeezes %d\n", grows, refusals,
              truncations, releases, squeezes);
  // Every kind of event happened, many times.
  EXPECT_GT(grows, 1000);
  EXPECT_GT(refusals, 20);
  EXPECT_GT(truncations, 300);
  EXPECT_GT(releases, 100);
  EXPECT_GT(squeezes, 20);

  for (int32_t s = 0; s < g.slots; ++s) kv.release(s);
  const KvStats stats = kv.stats();
  EXPECT_EQ(stats.committed_bytes, 0u);
  EXPECT_EQ(stats.granules_mapped, stats.granules_unmapped);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvCommitted), 0u);
  EXPECT_EQ(resident_pages(bases[0], g.slots * kv.reserved_bytes(0)), 0u);
  if (pool_target > 0) {
    // Most granules came out of the pool; a step created one only when the pool ran dry.
    std::printf("pool %llu: %llu of %llu granules mapped from the pool, %llu created\n",
                static_cast<unsigned long long>(pool_target),
                static_cast<unsigned long long>(stats.granules_from_pool),
                static_cast<unsigned long long>(stats.granules_mapped),
                static_cast<unsigned long long>(stats.granules_created));
    EXPECT_GT(stats.granules_from_pool, stats.granules_mapped / 2);
    EXPECT_LT(stats.granules_created, stats.granules_mapped);
  } else {
    EXPECT_EQ(stats.granules_from_pool, 0u);
    EXPECT_EQ(stats.granules_created, stats.granules_mapped);
  }
  kv.set_pool_target(0);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvPool), 0u);
  EXPECT_EQ(memory.used_bytes(), other_charge);
}

TEST(KvSpace, RandomizedGrowthTruncationAndReleaseKeepTheInvariantEveryStep) { run_randomized(0); }

TEST(KvSpace, RandomizedRunWithAGranulePoolKeepsTheInvariantAndTheLedger) { run_randomized(6); }

// The pool: granules created ahead of need are charged to KvPool, count as room for KV,
// and map without being created; granules a slot gives back refill it up to its target.
TEST(KvSpace, PooledGranulesMapWithoutBeingCreatedAndComeBackOnTruncation) {
  MemoryManager memory(1ull << 30);
  KvSpace kv(make_host_virtual_memory(kSmallGranule), small_geometry(), memory);
  const uint64_t g = kSmallGranule;
  kv.set_pool_target(4);
  EXPECT_EQ(kv.refill_pool(), 4u);
  EXPECT_EQ(kv.refill_pool(), 0u);  // full
  EXPECT_EQ(memory.bytes(MemoryCategory::KvPool), 4 * g);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvCommitted), 0u);
  EXPECT_EQ(kv.budget_available_bytes(), memory.available_bytes() + 4 * g);

  kv.reset_step_stats();
  ASSERT_TRUE(kv.map_through(0, 150));  // 166 tokens with the look-ahead: 3 granules
  KvStats s = kv.stats();
  EXPECT_EQ(s.last_granules_mapped, 3u);
  EXPECT_EQ(s.last_granules_created, 0u);
  EXPECT_EQ(s.granules_from_pool, 3u);
  EXPECT_EQ(s.pool_bytes, g);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvPool), g);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvCommitted), 3 * g);
  uint8_t* base = kv.slot_base(0);
  write_pattern(base, 0, 0, 150 * 1000);
  EXPECT_TRUE(pattern_holds(base, 0, 0, 150 * 1000));

  // Past what the pool holds: one from the pool, the rest created in the step.
  kv.reset_step_stats();
  ASSERT_TRUE(kv.map_through(1, 300));  // 5 granules
  s = kv.stats();
  EXPECT_EQ(s.last_granules_created, 4u);
  EXPECT_EQ(s.pool_bytes, 0u);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvCommitted), 8 * g);

  // Given back: into the pool up to its target, the rest destroyed.
  kv.release(1);
  EXPECT_EQ(kv.stats().pool_bytes, 4 * g);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvPool), 4 * g);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvCommitted), 3 * g);
  EXPECT_EQ(resident_pages(kv.slot_base(1), kv.reserved_bytes(1)), 0u);
  EXPECT_TRUE(pattern_holds(base, 0, 0, 150 * 1000));  // slot 0 untouched

  kv.trim_pool(1);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvPool), g);
  kv.set_pool_target(0);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvPool), 0u);
  kv.release(0);
  EXPECT_EQ(memory.used_bytes(), 0u);
}

TEST(KvSpace, ThePoolStaysWithinTheBudgetAndItsBytesServeKv) {
  const uint64_t g = kSmallGranule;
  MemoryManager memory(4 * g);
  KvSpace kv(make_host_virtual_memory(g), small_geometry(), memory);
  kv.set_pool_target(8);
  EXPECT_EQ(kv.refill_pool(), 4u);  // the budget holds 4
  EXPECT_EQ(memory.available_bytes(), 0u);
  EXPECT_EQ(kv.budget_available_bytes(), 4 * g);
  EXPECT_FALSE(memory.try_charge(MemoryCategory::Workspace, g));
  // KV still gets all of it: the pool is KV's room, not a competitor.
  ASSERT_TRUE(kv.map_through(0, 250));  // 4 granules: no room for the look-ahead's fifth
  EXPECT_EQ(memory.bytes(MemoryCategory::KvCommitted), 4 * g);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvPool), 0u);
  EXPECT_FALSE(kv.map_through(1, 10));  // nothing left
  kv.release(0);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvPool), 4 * g);  // back in the pool, not freed
  kv.trim_pool(0);
  EXPECT_EQ(memory.used_bytes(), 0u);
}

TEST(KvSpace, ADeviceThatRefusesPoolGranulesLeavesTheLedgerBalanced) {
  MemoryManager memory(1ull << 30);
  auto vm = std::make_unique<FailingVirtualMemory>(2);
  FailingVirtualMemory* failing = vm.get();
  KvSpace kv(std::move(vm), small_geometry(), memory);
  kv.set_pool_target(5);
  EXPECT_EQ(kv.refill_pool(), 2u);  // the third create fails: logged, not thrown
  EXPECT_EQ(memory.bytes(MemoryCategory::KvPool), 2 * kSmallGranule);
  EXPECT_EQ(failing->existing(), 2);
  // A map that needs more than the pool and cannot create: nothing changes.
  EXPECT_THROW(kv.map_through(0, 250), DeviceError);
  EXPECT_EQ(failing->committed(), 0);
  EXPECT_EQ(failing->existing(), 2);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvPool), 2 * kSmallGranule);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvCommitted), 0u);
  // Within the pool it still works.
  ASSERT_TRUE(kv.map_through(0, 50));  // 66 tokens: 2 granules
  EXPECT_EQ(failing->committed(), 2);
  failing->allow_creates(100);
  kv.release(0);
  kv.set_pool_target(0);
  EXPECT_EQ(failing->existing(), 0);
  EXPECT_EQ(memory.used_bytes(), 0u);
}

}  // namespace
}  // namespace granule
