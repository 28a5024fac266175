// KvSpace over the CUDA driver's virtual memory (cuMemAddressReserve / cuMemCreate /
// cuMemMap), the long randomized run of tests/engine/kv_space_test.cpp on the device: slots
// grow by decode steps and prompt chunks, are cut back (regenerate, edit) and released,
// against a budget that cannot hold them all and that other charges squeeze. After every
// step: slot addresses are unchanged, committed >= used and <= ceil(used / granule) *
// granule + look-ahead, the ledger equals the sum of committed bytes, and bytes written
// through the device (one value per slot and write) are still there, read back through
// cudaMemcpy. At the end everything is released and committed is zero.
// Every write is queued on a stream behind a long memset of a scratch buffer, and slots are
// cut and released right after, without waiting: the KvSpace must defer those unmaps until
// the queued work has completed (unmapping under it poisons the context). The H200 runner
// also runs this test in several processes at once beside a process that keeps the GPU
// busy, where queued work waits far longer (tests/gpu/run_on_h200.sh contention).
#include <cuda_runtime.h>

#include <algorithm>
#include <iostream>
#include <random>
#include <stdexcept>
#include <vector>

#include "backends/cuda/cuda_vmm.h"
#include "gpu_test_support.h"
#include "memory/kv_space.h"
#include "memory/memory_manager.h"

namespace granule {
namespace {

uint64_t round_up(uint64_t bytes, uint64_t granule) {
  return (bytes + granule - 1) / granule * granule;
}

// The byte a slot's write number `generation` leaves at every offset it covered.
uint8_t fill_value(int32_t slot, int generation) {
  return static_cast<uint8_t>(17 * slot + 31 * generation + 1);
}

// A stream of the test's own, destroyed after the KvSpace (declared before it).
struct TestStream {
  cudaStream_t stream = nullptr;
  TestStream() {
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
      throw std::runtime_error("cudaStreamCreate failed");
  }
  ~TestStream() { cudaStreamDestroy(stream); }
};

void run_randomized(uint64_t pool_target) {
  TestStream test_stream;
  const cudaStream_t stream = test_stream.stream;
  // Queued before every write: ~0.1 ms of work alone, far longer on a shared GPU.
  constexpr size_t kBusyBytes = 256u << 20;
  gpu_test::DeviceArray<uint8_t> busy(kBusyBytes);
  auto vm = cuda::make_cuda_virtual_memory(0, {stream});
  const uint64_t granule = vm->granule_bytes();  // 2 MiB on current NVIDIA GPUs
  KvGeometry g;
  g.bytes_per_token = 23040;  // SmolLM2-135M's f16 KV per token: ~91 tokens per 2 MiB
  g.max_tokens = 2048;        // 23 granules per slot
  g.slots = 4;
  g.lookahead_tokens = 16;
  const uint64_t bpt = static_cast<uint64_t>(g.bytes_per_token);
  const uint64_t lookahead_bytes = round_up(g.lookahead_tokens * bpt, granule);
  MemoryManager memory(20 * granule);  // under 4 x 23 granules: growth gets refused
  KvSpace kv(std::move(vm), g, memory);
  kv.set_pool_target(pool_target);

  std::vector<uint8_t*> bases;
  for (int32_t s = 0; s < g.slots; ++s) bases.push_back(kv.slot_base(s));
  // Per slot: the writes still (partly) present, as [from, to) byte ranges with their value.
  struct Write {
    uint64_t from, to;
    uint8_t value;
  };
  std::vector<std::vector<Write>> writes(g.slots);
  std::vector<int64_t> used(g.slots, 0);
  std::vector<int> generation(g.slots, 0);
  uint64_t other_charge = 0;
  std::mt19937_64 rng(20261202);
  int grows = 0, refusals = 0, truncations = 0, releases = 0, checks = 0;

  auto cut = [&](int32_t slot, int64_t keep_tokens) {
    const uint64_t keep = static_cast<uint64_t>(keep_tokens) * bpt;
    std::vector<Write>& w = writes[slot];
    for (Write& x : w) x.to = std::min(x.to, keep);
    std::erase_if(w, [](const Write& x) { return x.from >= x.to; });
  };

  for (int step = 0; step < 3000; ++step) {
    const auto slot = static_cast<int32_t>(rng() % g.slots);
    const int action = static_cast<int>(rng() % 100);
    if (action < 70) {
      const int64_t add = rng() % 4 == 0 ? 1 + static_cast<int64_t>(rng() % 300) : 1;
      const int64_t target = std::min(g.max_tokens, used[slot] + add);
      // Live KV: a refused growth may first unmap granules whose work has completed (and
      // pool them), but it never charges more nor touches what the slots use.
      const uint64_t live_before =
          memory.bytes(MemoryCategory::KvCommitted) - kv.stats().retiring_bytes;
      const uint64_t held_before =
          memory.bytes(MemoryCategory::KvCommitted) + memory.bytes(MemoryCategory::KvPool);
      if (kv.map_through(slot, target)) {
        const uint64_t from = static_cast<uint64_t>(used[slot]) * bpt, to = target * bpt;
        if (to > from) {
          const uint8_t value = fill_value(slot, ++generation[slot]);
          CUDA_OK(cudaMemsetAsync(busy.get(), value, kBusyBytes, stream));
          CUDA_OK(cudaMemsetAsync(bases[slot] + from, value, to - from, stream));
          writes[slot].push_back({from, to, value});
        }
        used[slot] = target;
        ++grows;
      } else {
        ++refusals;
        ASSERT_EQ(memory.bytes(MemoryCategory::KvCommitted) - kv.stats().retiring_bytes,
                  live_before)
            << "step " << step;
        ASSERT_LE(memory.bytes(MemoryCategory::KvCommitted) + memory.bytes(MemoryCategory::KvPool),
                  held_before)
            << "step " << step;
        int32_t largest = 0;  // what the scheduler does: free the slot that holds the most
        for (int32_t s = 1; s < g.slots; ++s)
          if (used[s] > used[largest]) largest = s;
        kv.release(largest);
        used[largest] = 0;
        writes[largest].clear();
      }
    } else if (action < 88) {
      const int64_t keep = used[slot] == 0 ? 0 : static_cast<int64_t>(rng() % (used[slot] + 1));
      kv.truncate(slot, keep);
      used[slot] = keep;
      cut(slot, keep);
      ++truncations;
    } else if (action < 95) {
      kv.release(slot);
      used[slot] = 0;
      writes[slot].clear();
      ++releases;
    } else if (other_charge > 0) {
      memory.release(MemoryCategory::WeightsResident, other_charge);
      other_charge = 0;
    } else if (memory.try_charge(MemoryCategory::WeightsResident, 10 * granule)) {
      other_charge = 10 * granule;
    }

    uint64_t committed_sum = 0;
    for (int32_t s = 0; s < g.slots; ++s) {
      const uint64_t used_bytes = static_cast<uint64_t>(used[s]) * bpt;
      const uint64_t committed = kv.committed_bytes(s);
      ASSERT_EQ(kv.slot_base(s), bases[s]) << "slot " << s << " moved at step " << step;
      ASSERT_GE(committed, used_bytes) << "slot " << s << " step " << step;
      ASSERT_LE(committed, round_up(used_bytes, granule) + lookahead_bytes)
          << "slot " << s << " step " << step;
      committed_sum += committed;
    }
    // Granules cut while the stream still had work queued stay mapped, and in the ledger,
    // until it completes.
    ASSERT_EQ(memory.bytes(MemoryCategory::KvCommitted), committed_sum + kv.stats().retiring_bytes)
        << "step " << step;
    ASSERT_LE(memory.used_bytes(), memory.budget_bytes()) << "step " << step;
    kv.refill_pool();
    ASSERT_EQ(memory.bytes(MemoryCategory::KvPool), kv.stats().pool_bytes) << "step " << step;
    ASSERT_LE(kv.stats().pool_bytes, pool_target * granule) << "step " << step;
    // Every 10 steps, read back the first and last byte of every live write of one slot.
    if (step % 10 == 0) {
      const auto s = static_cast<int32_t>(rng() % g.slots);
      for (const Write& w : writes[s]) {
        for (const uint64_t at : {w.from, w.to - 1}) {
          uint8_t got = 0;
          CUDA_OK(cudaMemcpyAsync(&got, bases[s] + at, 1, cudaMemcpyDeviceToHost, stream));
          CUDA_OK(cudaStreamSynchronize(stream));
          ASSERT_EQ(got, w.value) << "slot " << s << " byte " << at << " step " << step;
          ++checks;
        }
      }
    }
  }
  for (int32_t s = 0; s < g.slots; ++s) kv.release(s);
  kv.reclaim(/*wait=*/true);
  CUDA_OK(cudaStreamSynchronize(stream));
  CUDA_OK(cudaGetLastError());
  const KvStats stats = kv.stats();
  EXPECT_EQ(stats.retiring_bytes, 0u);
  EXPECT_GT(stats.unmaps_deferred, 0u) << "no cut found queued work: the test lost its point";
  if (pool_target > 0) {
    EXPECT_GT(stats.granules_from_pool, stats.granules_mapped / 2);
  } else {
    EXPECT_EQ(stats.granules_from_pool, 0u);
  }
  kv.set_pool_target(0);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvPool), 0u);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvCommitted), 0u);
  for (int32_t s = 0; s < g.slots; ++s) EXPECT_EQ(kv.committed_bytes(s), 0u);
  EXPECT_GT(grows, 1000);
  EXPECT_GT(refusals, 0) << "the budget should have refused some growth";
  EXPECT_GT(truncations, 100);
  EXPECT_GT(releases, 50);
  EXPECT_GT(checks, 100);
  std::cout << "[kv-gpu] pool " << pool_target << ", granule " << (granule >> 10)
            << " KiB: " << grows << " grows, " << refusals << " refusals, " << truncations
            << " truncations, " << releases << " releases, " << checks
            << " device bytes read back; mapped " << stats.granules_mapped << " / unmapped "
            << stats.granules_unmapped << " granules, " << stats.granules_from_pool
            << " from the pool, " << stats.granules_created << " created; " << stats.unmaps_deferred
            << " unmaps waited for queued work\n";
}

TEST(KvSpaceGpu, RandomizedGrowthTruncationAndReleaseKeepTheInvariantEveryStep) {
  GRANULE_REQUIRE_GPU();
  run_randomized(0);
}

TEST(KvSpaceGpu, RandomizedRunWithAGranulePoolReusesGranulesAcrossSlots) {
  GRANULE_REQUIRE_GPU();
  run_randomized(6);
}

}  // namespace
}  // namespace granule
