// Tests for MemoryManager: the budget, the ledger by category, peak tracking, the error a
// refused charge raises, and that reserved address space never counts.
#include "memory/memory_manager.h"

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "granule/error.h"

namespace granule {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

TEST(MemoryManager, ChargesAndReleasesByCategory) {
  MemoryManager memory(100 * kMiB, 200 * kMiB);
  EXPECT_EQ(memory.device_total_bytes(), 200 * kMiB);
  memory.charge(MemoryCategory::WeightsResident, 40 * kMiB);
  EXPECT_TRUE(memory.try_charge(MemoryCategory::KvCommitted, 10 * kMiB));
  EXPECT_TRUE(memory.try_charge(MemoryCategory::Workspace, 5 * kMiB));
  EXPECT_EQ(memory.bytes(MemoryCategory::WeightsResident), 40 * kMiB);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvCommitted), 10 * kMiB);
  EXPECT_EQ(memory.bytes(MemoryCategory::Workspace), 5 * kMiB);
  EXPECT_EQ(memory.used_bytes(), 55 * kMiB);
  EXPECT_EQ(memory.available_bytes(), 45 * kMiB);

  memory.release(MemoryCategory::KvCommitted, 4 * kMiB);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvCommitted), 6 * kMiB);
  EXPECT_EQ(memory.used_bytes(), 51 * kMiB);

  const auto snapshot = memory.snapshot();
  EXPECT_EQ(snapshot[static_cast<int>(MemoryCategory::WeightsResident)], 40 * kMiB);
  EXPECT_EQ(snapshot[static_cast<int>(MemoryCategory::KvCommitted)], 6 * kMiB);
  EXPECT_EQ(snapshot[static_cast<int>(MemoryCategory::Graphs)], 0u);
}

TEST(MemoryManager, TryChargeRefusesOverBudgetAndRecordsNothing) {
  MemoryManager memory(10 * kMiB);
  EXPECT_TRUE(memory.try_charge(MemoryCategory::KvCommitted, 8 * kMiB));
  EXPECT_FALSE(memory.try_charge(MemoryCategory::KvCommitted, 3 * kMiB));
  EXPECT_FALSE(memory.try_charge(MemoryCategory::Other, 3 * kMiB));
  EXPECT_EQ(memory.used_bytes(), 8 * kMiB);
  EXPECT_EQ(memory.bytes(MemoryCategory::Other), 0u);
  // Exactly filling the budget is allowed.
  EXPECT_TRUE(memory.try_charge(MemoryCategory::Other, 2 * kMiB));
  EXPECT_EQ(memory.available_bytes(), 0u);
  EXPECT_FALSE(memory.try_charge(MemoryCategory::Other, 1));
}

TEST(MemoryManager, HugeChargeDoesNotOverflowPastTheCheck) {
  MemoryManager memory(10 * kMiB);
  ASSERT_TRUE(memory.try_charge(MemoryCategory::Other, kMiB));
  EXPECT_FALSE(memory.try_charge(MemoryCategory::Other, UINT64_MAX));
  EXPECT_FALSE(memory.try_charge(MemoryCategory::Other, UINT64_MAX - kMiB + 1));
  EXPECT_EQ(memory.used_bytes(), kMiB);
}

TEST(MemoryManager, ReservedVaIsReportedButNeverCharged) {
  MemoryManager memory(10 * kMiB);
  // Far more address space than the budget: still accepted, and it leaves the budget alone.
  EXPECT_TRUE(memory.try_charge(MemoryCategory::KvReservedVa, 1000 * kMiB));
  memory.charge(MemoryCategory::KvReservedVa, 1000 * kMiB);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvReservedVa), 2000 * kMiB);
  EXPECT_EQ(memory.used_bytes(), 0u);
  EXPECT_EQ(memory.available_bytes(), 10 * kMiB);
  EXPECT_EQ(memory.peak_bytes(), 0u);
  EXPECT_TRUE(memory.try_charge(MemoryCategory::KvCommitted, 10 * kMiB));
  memory.release(MemoryCategory::KvReservedVa, 2000 * kMiB);
  EXPECT_EQ(memory.bytes(MemoryCategory::KvReservedVa), 0u);
  EXPECT_EQ(memory.used_bytes(), 10 * kMiB);
}

TEST(MemoryManager, ChargeThrowsCapacityErrorNamingCategoryAndShortfall) {
  MemoryManager memory(100 * kMiB);
  memory.charge(MemoryCategory::WeightsResident, 90 * kMiB);
  try {
    memory.charge(MemoryCategory::KvCommitted, 25 * kMiB);
    FAIL() << "charge over the budget did not throw";
  } catch (const CapacityError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("kv"), std::string::npos) << message;
    EXPECT_NE(message.find("15.0 MiB short"), std::string::npos) << message;  // 90 + 25 - 100
    EXPECT_NE(message.find("100.0 MiB budget"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
  }
  EXPECT_EQ(memory.bytes(MemoryCategory::KvCommitted), 0u);
  EXPECT_EQ(memory.used_bytes(), 90 * kMiB);
}

TEST(MemoryManager, PeakTracksTheHighestPhysicalTotal) {
  MemoryManager memory(100 * kMiB);
  memory.charge(MemoryCategory::WeightsResident, 30 * kMiB);
  memory.charge(MemoryCategory::KvCommitted, 50 * kMiB);
  memory.release(MemoryCategory::KvCommitted, 50 * kMiB);
  memory.charge(MemoryCategory::Workspace, 10 * kMiB);
  EXPECT_EQ(memory.used_bytes(), 40 * kMiB);
  EXPECT_EQ(memory.peak_bytes(), 80 * kMiB);
  // A refused charge does not move the peak.
  EXPECT_FALSE(memory.try_charge(MemoryCategory::Other, 70 * kMiB));
  EXPECT_EQ(memory.peak_bytes(), 80 * kMiB);
}

TEST(MemoryManager, LoweringTheBudgetBelowUseRefusesNewChargesUntilReleased) {
  MemoryManager memory(100 * kMiB);
  memory.charge(MemoryCategory::WeightsResident, 60 * kMiB);
  memory.set_budget_bytes(50 * kMiB);
  EXPECT_EQ(memory.budget_bytes(), 50 * kMiB);
  EXPECT_EQ(memory.available_bytes(), 0u);
  EXPECT_FALSE(memory.try_charge(MemoryCategory::KvCommitted, 1));
  EXPECT_TRUE(memory.try_charge(MemoryCategory::KvReservedVa, kMiB));
  memory.release(MemoryCategory::WeightsResident, 20 * kMiB);
  EXPECT_EQ(memory.available_bytes(), 10 * kMiB);
  EXPECT_TRUE(memory.try_charge(MemoryCategory::KvCommitted, 10 * kMiB));
}

TEST(MemoryManager, OverReleaseClampsToZeroInsteadOfWrapping) {
  MemoryManager memory(100 * kMiB);
  memory.charge(MemoryCategory::Graphs, kMiB);
  memory.release(MemoryCategory::Graphs, 2 * kMiB);
  EXPECT_EQ(memory.bytes(MemoryCategory::Graphs), 0u);
  EXPECT_EQ(memory.used_bytes(), 0u);
}

TEST(MemoryManager, CategoryNamesAreTheTelemetryKeys) {
  EXPECT_EQ(memory_category_name(MemoryCategory::WeightsResident), "weights");
  EXPECT_EQ(memory_category_name(MemoryCategory::WeightsStaging), "staging");
  EXPECT_EQ(memory_category_name(MemoryCategory::KvCommitted), "kv");
  EXPECT_EQ(memory_category_name(MemoryCategory::KvReservedVa), "kv_reserved_va");
  EXPECT_EQ(memory_category_name(MemoryCategory::Workspace), "workspace");
  EXPECT_EQ(memory_category_name(MemoryCategory::Graphs), "graphs");
  EXPECT_EQ(memory_category_name(MemoryCategory::Other), "other");
}

TEST(MemoryManager, ConcurrentChargesNeverExceedTheBudgetAndBalance) {
  // Four threads charge and release random amounts against a tight budget; every
  // accepted charge is released. The ledger must end at zero and the peak must stay
  // within the budget (a racy check-then-add would overshoot it).
  constexpr uint64_t kBudget = 24 * kMiB;
  MemoryManager memory(kBudget);
  std::atomic<uint64_t> accepted{0}, refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(1234 + t);
      std::vector<std::pair<MemoryCategory, uint64_t>> held;
      for (int i = 0; i < 20000; ++i) {
        const auto category = static_cast<MemoryCategory>(rng() % 7);
        const uint64_t bytes = (rng() % 16 + 1) * kMiB;
        if (held.size() < 4) {
          if (memory.try_charge(category, bytes)) {
            held.emplace_back(category, bytes);
            ++accepted;
          } else {
            ++refused;
          }
        }
        if (!held.empty() && rng() % 2 == 0) {
          memory.release(held.back().first, held.back().second);
          held.pop_back();
        }
      }
      for (const auto& [category, bytes] : held) memory.release(category, bytes);
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_GT(accepted.load(), 0u);
  EXPECT_GT(refused.load(), 0u);
  EXPECT_LE(memory.peak_bytes(), kBudget);
  for (uint64_t bytes : memory.snapshot()) EXPECT_EQ(bytes, 0u);
}

}  // namespace
}  // namespace granule
