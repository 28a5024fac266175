// Tests of the KV benchmark (engine/src/kv_benchmark.h) on host memory with 64 KiB granules:
// the workload generator, each policy's accounting, and the comparison the benchmark reports.
// Expected values are derived in the tests from the trace itself (an independent replay of
// the bucket rule, the KvSpace rounding rule), not from recorded runs.
#include "granule/testkit/kv_benchmark.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <set>

#include "granule/error.h"
#include "memory/kv_space.h"
#include "memory/memory_manager.h"

namespace granule {
namespace {

constexpr uint64_t kGranule = 64u << 10;
constexpr int64_t kBytesPerToken = 1024;  // 64 tokens per granule
constexpr int64_t kContext = 2048;        // a multiple of a granule's tokens

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

KvWorkloadOptions small_workload(uint64_t seed = 7) {
  // More regenerations and edits than a real user makes, so a small trace has several.
  return {.chats = 8,
          .max_turns = 5,
          .seed = seed,
          .max_context_tokens = kContext,
          .prefill_chunk_tokens = 128,
          .arrival_window_steps = 40,
          .prompt_max_tokens = 600,
          .answer_min_tokens = 20,
          .answer_max_tokens = 300,
          .think_min_steps = 2,
          .think_max_steps = 10,
          .regenerate_probability = 0.25,
          .edit_probability = 0.2,
          .end_probability = 0.15};
}

KvPolicyShape small_shape() {
  KvPolicyShape s;
  s.bytes_per_token = kBytesPerToken;
  s.max_context_tokens = kContext;
  s.slots = 8;
  s.lookahead_tokens = 16;
  s.min_bucket_tokens = 64;
  return s;
}

MemoryManager unbudgeted_ledger() {
  return MemoryManager(std::numeric_limits<uint64_t>::max() / 2);
}

TEST(KvWorkload, SameSeedSameTraceOtherSeedAnother) {
  const KvTrace a = make_kv_workload(small_workload(7));
  const KvTrace b = make_kv_workload(small_workload(7));
  const KvTrace c = make_kv_workload(small_workload(8));
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t s = 0; s < a.steps.size(); ++s) {
    ASSERT_EQ(a.steps[s].size(), b.steps[s].size());
    for (size_t i = 0; i < a.steps[s].size(); ++i) {
      EXPECT_EQ(a.steps[s][i].kind, b.steps[s][i].kind);
      EXPECT_EQ(a.steps[s][i].chat, b.steps[s][i].chat);
      EXPECT_EQ(a.steps[s][i].tokens, b.steps[s][i].tokens);
    }
  }
  EXPECT_TRUE(a.steps.size() != c.steps.size() || a.prompt_tokens != c.prompt_tokens ||
              a.answer_tokens != c.answer_tokens);
}

TEST(KvWorkload, ChatsGrowWithinContextRegenerateEditAndAllEnd) {
  const KvWorkloadOptions o = small_workload();
  const KvTrace trace = make_kv_workload(o);
  std::vector<int64_t> tokens(static_cast<size_t>(o.chats), 0);
  std::vector<bool> ended(static_cast<size_t>(o.chats), false);
  int64_t live_peak = 0, truncations = 0;
  for (const auto& step : trace.steps) {
    std::set<int32_t> grown;  // one growth per chat per step
    for (const KvEvent& e : step) {
      ASSERT_GE(e.chat, 0);
      ASSERT_LT(e.chat, o.chats);
      auto& t = tokens[static_cast<size_t>(e.chat)];
      ASSERT_FALSE(ended[static_cast<size_t>(e.chat)]) << "event after the chat ended";
      switch (e.kind) {
        case KvEventKind::Grow:
          EXPECT_TRUE(grown.insert(e.chat).second);
          EXPECT_GT(e.tokens, t);
          EXPECT_LE(e.tokens - t, o.prefill_chunk_tokens);
          EXPECT_LE(e.tokens, o.max_context_tokens);
          break;
        case KvEventKind::Truncate:
          EXPECT_LT(e.tokens, t);
          ++truncations;
          break;
        case KvEventKind::End:
          ended[static_cast<size_t>(e.chat)] = true;
          break;
      }
      t = e.kind == KvEventKind::End ? 0 : e.tokens;
    }
    int64_t live = 0;
    for (int64_t t : tokens) live += t;
    live_peak = std::max(live_peak, live);
  }
  EXPECT_TRUE(std::all_of(ended.begin(), ended.end(), [](bool e) { return e; }));
  EXPECT_EQ(live_peak, trace.peak_live_tokens);
  EXPECT_GT(trace.regenerations, 0);
  EXPECT_GT(trace.edits, 0);
  EXPECT_EQ(truncations, trace.regenerations + trace.edits);
  EXPECT_GE(trace.turns, o.chats);
}

TEST(KvBenchmark, EveryPolicySeesTheSameTokenCountsEveryStep) {
  const KvTrace trace = make_kv_workload(small_workload());
  auto memory = make_host_kv_bench_memory(kGranule, /*touch_pages=*/false);
  std::vector<std::vector<std::vector<int64_t>>> seen(5);
  const std::vector<std::unique_ptr<KvPolicy> (*)(const KvPolicyShape&, KvBenchMemory&,
                                                  MemoryManager&)>
      makers = {make_full_context_policy, make_bucket_growth_policy,
                make_cached_bucket_growth_policy, make_padded_batch_policy, make_granule_policy};
  for (size_t p = 0; p < makers.size(); ++p) {
    MemoryManager ledger = unbudgeted_ledger();
    auto policy = makers[p](small_shape(), *memory, ledger);
    run_kv_policy(*policy, ledger, trace,
                  [&](size_t, const KvPolicy&, const std::vector<int64_t>& tokens) {
                    seen[p].push_back(tokens);
                  });
  }
  ASSERT_EQ(seen[0].size(), trace.steps.size());
  EXPECT_EQ(seen[0], seen[1]);
  EXPECT_EQ(seen[0], seen[2]);
  EXPECT_EQ(seen[0], seen[3]);
  EXPECT_EQ(seen[0], seen[4]);
}

// The padded batch: every slot holds the longest live chat's bucket; outgrowing it moves and
// copies every live chat (their bytes kept), both buffers held during the copy; when the
// longest live chat fits a quarter of the bucket it shrinks; with no chat left it holds 0.
TEST(KvBenchmark, PaddedBatchHoldsEverySlotAtTheLongestChatsBucket) {
  KvPolicyShape shape = small_shape();  // 8 slots, first bucket 64 tokens
  auto memory = make_host_kv_bench_memory(kGranule, /*touch_pages=*/false);
  MemoryManager ledger = unbudgeted_ledger();
  auto policy = make_padded_batch_policy(shape, *memory, ledger);
  const uint64_t slots = static_cast<uint64_t>(shape.slots);
  EXPECT_EQ(ledger.bytes(MemoryCategory::KvCommitted), 0u);
  policy->grow(0, 40);
  policy->grow(5, 10);
  EXPECT_EQ(ledger.bytes(MemoryCategory::KvCommitted), slots * 64 * kBytesPerToken);
  EXPECT_EQ(policy->committed_bytes(2), 64u * kBytesPerToken) << "idle slots are padded too";
  for (uint64_t i = 0; i < 40 * kBytesPerToken; ++i)
    policy->address(0)[i] = static_cast<uint8_t>(i);
  uint8_t* const slot0 = policy->address(0);
  uint8_t* const slot5 = policy->address(5);
  policy->grow(5, 200);  // 64 -> 256 tokens for every slot: both live chats move
  EXPECT_EQ(ledger.bytes(MemoryCategory::KvCommitted), slots * 256 * kBytesPerToken);
  EXPECT_EQ(ledger.peak_bytes(), slots * (64 + 256) * kBytesPerToken);
  EXPECT_EQ(policy->copied_bytes(), (40u + 10u) * kBytesPerToken);
  EXPECT_NE(policy->address(0), slot0);
  EXPECT_NE(policy->address(5), slot5);
  for (uint64_t i = 0; i < 40 * kBytesPerToken; ++i)
    ASSERT_EQ(policy->address(0)[i], static_cast<uint8_t>(i)) << "byte " << i;
  policy->end(5);  // longest live is 40 tokens <= 256 / 4: back to a 64-token bucket
  EXPECT_EQ(ledger.bytes(MemoryCategory::KvCommitted), slots * 64 * kBytesPerToken);
  EXPECT_EQ(policy->copied_bytes(), (40u + 10u + 40u) * kBytesPerToken);
  policy->end(0);
  EXPECT_EQ(ledger.bytes(MemoryCategory::KvCommitted), 0u);
  EXPECT_EQ(policy->address(0), nullptr);
}

TEST(KvBenchmark, GranulesStayWithinTheRoundingBoundNeverMoveAndEndAtZero) {
  const KvPolicyShape shape = small_shape();
  const KvTrace trace = make_kv_workload(small_workload());
  auto memory = make_host_kv_bench_memory(kGranule, /*touch_pages=*/true);
  MemoryManager ledger = unbudgeted_ledger();
  auto policy = make_granule_policy(shape, *memory, ledger);
  std::vector<uint8_t*> bases;
  for (int32_t s = 0; s < shape.slots; ++s) bases.push_back(policy->address(s));

  const KvPolicyResult r = run_kv_policy(
      *policy, ledger, trace,
      [&](size_t step, const KvPolicy& p, const std::vector<int64_t>& tokens) {
        for (int32_t s = 0; s < shape.slots; ++s) {
          const auto t = static_cast<uint64_t>(tokens[static_cast<size_t>(s)]);
          const uint64_t held = ceil_div(t * kBytesPerToken, kGranule) * kGranule;
          const uint64_t with_lookahead =
              ceil_div(std::min<uint64_t>(kContext, t + shape.lookahead_tokens) * kBytesPerToken,
                       kGranule) *
              kGranule;
          ASSERT_GE(p.committed_bytes(s), held) << "step " << step << " slot " << s;
          ASSERT_LE(p.committed_bytes(s), with_lookahead) << "step " << step << " slot " << s;
          ASSERT_EQ(p.address(s), bases[static_cast<size_t>(s)]) << "step " << step;
        }
      });
  EXPECT_EQ(r.copied_bytes, 0u);
  EXPECT_EQ(r.address_changes, 0u);
  EXPECT_EQ(r.final_committed_bytes, 0u);
  EXPECT_EQ(ledger.bytes(MemoryCategory::KvCommitted), 0u);
  EXPECT_GT(r.peak_committed_bytes, 0u);
}

// The bucket rule replayed independently: per chat, capacity starts at the first bucket and
// doubles past the tokens needed; a growth past capacity copies the tokens held before it.
struct BucketExpectation {
  uint64_t copied_bytes = 0;
  uint64_t moves = 0;
};
BucketExpectation replay_buckets(const KvTrace& trace, const KvPolicyShape& shape) {
  BucketExpectation e;
  std::map<int32_t, std::pair<int64_t, int64_t>> chats;  // chat -> (capacity, used)
  for (const auto& step : trace.steps) {
    for (const KvEvent& ev : step) {
      auto& [capacity, used] = chats[ev.chat];
      if (ev.kind == KvEventKind::End) {
        capacity = used = 0;
      } else if (ev.kind == KvEventKind::Truncate) {
        used = std::min(used, ev.tokens);
      } else {
        if (ev.tokens > capacity) {
          if (capacity > 0) {
            ++e.moves;
            e.copied_bytes += static_cast<uint64_t>(used * shape.bytes_per_token);
          }
          int64_t c = capacity > 0 ? capacity : shape.min_bucket_tokens;
          while (c < ev.tokens) c *= 2;
          capacity = std::min(c, shape.max_context_tokens);
        }
        used = ev.tokens;
      }
    }
  }
  return e;
}

TEST(KvBenchmark, BucketGrowthCopiesWhatItHeldAndMovesOnEveryGrowth) {
  const KvPolicyShape shape = small_shape();
  const KvTrace trace = make_kv_workload(small_workload());
  auto memory = make_host_kv_bench_memory(kGranule, /*touch_pages=*/true);
  MemoryManager ledger = unbudgeted_ledger();
  auto policy = make_bucket_growth_policy(shape, *memory, ledger);
  const KvPolicyResult r = run_kv_policy(
      *policy, ledger, trace, [&](size_t, const KvPolicy& p, const std::vector<int64_t>& tokens) {
        for (int32_t s = 0; s < shape.slots; ++s) {
          ASSERT_GE(p.committed_bytes(s),
                    static_cast<uint64_t>(tokens[static_cast<size_t>(s)] * kBytesPerToken));
        }
      });
  const BucketExpectation expected = replay_buckets(trace, shape);
  EXPECT_GT(r.copied_bytes, 0u);
  EXPECT_EQ(r.copied_bytes, expected.copied_bytes);
  EXPECT_EQ(r.address_changes, expected.moves);
  EXPECT_EQ(r.final_committed_bytes, 0u);
}

TEST(KvBenchmark, BucketGrowthKeepsTheBytesItCopies) {
  const KvPolicyShape shape = small_shape();
  auto memory = make_host_kv_bench_memory(kGranule, /*touch_pages=*/false);
  MemoryManager ledger = unbudgeted_ledger();
  auto policy = make_bucket_growth_policy(shape, *memory, ledger);
  policy->grow(3, 50);
  const uint64_t used = 50 * kBytesPerToken;
  for (uint64_t i = 0; i < used; ++i) policy->address(3)[i] = static_cast<uint8_t>(i * 31 + 7);
  uint8_t* before = policy->address(3);
  policy->grow(3, 200);  // 64 -> 256 tokens
  ASSERT_NE(policy->address(3), before);
  EXPECT_EQ(policy->committed_bytes(3), 256u * kBytesPerToken);
  EXPECT_EQ(policy->copied_bytes(), used);
  for (uint64_t i = 0; i < used; ++i) {
    ASSERT_EQ(policy->address(3)[i], static_cast<uint8_t>(i * 31 + 7)) << "byte " << i;
  }
  policy->end(3);
  EXPECT_EQ(ledger.bytes(MemoryCategory::KvCommitted), 0u);
}

// The case: with a caching allocator, an outgrown or ended chat's bucket stays held (and in
// the ledger) and serves the next request of its size, at the same address, with no new
// allocation; a request of another size allocates.
TEST(KvBenchmark, CachedBucketsKeepFreedBuffersAndReuseThemBySize) {
  const KvPolicyShape shape = small_shape();  // first bucket 64 tokens
  auto memory = make_host_kv_bench_memory(kGranule, /*touch_pages=*/false);
  MemoryManager ledger = unbudgeted_ledger();
  auto policy = make_cached_bucket_growth_policy(shape, *memory, ledger);
  const uint64_t bucket_64 = 64 * kBytesPerToken;
  policy->grow(0, 50);
  uint8_t* first = policy->address(0);
  policy->grow(0, 200);  // 64 -> 256 tokens: the 64-token buffer is kept
  EXPECT_EQ(ledger.bytes(MemoryCategory::KvCommitted), bucket_64 + 4 * bucket_64);
  policy->grow(1, 30);  // a 64-token request: the kept buffer, nothing new
  EXPECT_EQ(policy->address(1), first);
  EXPECT_EQ(ledger.bytes(MemoryCategory::KvCommitted), 5 * bucket_64);
  policy->grow(2, 10);  // none kept: allocates
  EXPECT_EQ(ledger.bytes(MemoryCategory::KvCommitted), 6 * bucket_64);
  policy->end(0);
  policy->end(1);
  policy->end(2);
  EXPECT_EQ(ledger.bytes(MemoryCategory::KvCommitted), 6 * bucket_64);  // all kept
  EXPECT_EQ(policy->committed_bytes(0), 0u);                            // none in use
  policy.reset();
  EXPECT_EQ(ledger.bytes(MemoryCategory::KvCommitted), 0u);
}

TEST(KvBenchmark, FullContextCommitsEverySlotsWholeContextThroughout) {
  const KvPolicyShape shape = small_shape();
  const KvTrace trace = make_kv_workload(small_workload());
  auto memory = make_host_kv_bench_memory(kGranule, /*touch_pages=*/false);
  const auto results = compare_kv_policies(trace, shape, *memory, {KvPolicyKind::FullContext});
  ASSERT_EQ(results.size(), 1u);
  const uint64_t all_slots = static_cast<uint64_t>(shape.slots) * kContext * kBytesPerToken;
  EXPECT_EQ(results[0].peak_committed_bytes, all_slots);
  EXPECT_DOUBLE_EQ(results[0].mean_committed_bytes, static_cast<double>(all_slots));
  EXPECT_EQ(results[0].copied_bytes, 0u);
  EXPECT_EQ(results[0].address_changes, 0u);
}

// What the benchmark reports: granules commit less than buckets at peak and on average,
// never copy, and stay within one granule plus the look-ahead of what the chats hold.
TEST(KvBenchmark, GranulesCommitLessThanBucketsAndCopyNothing) {
  const KvPolicyShape shape = small_shape();
  const KvTrace trace = make_kv_workload(small_workload());
  auto memory = make_host_kv_bench_memory(kGranule, /*touch_pages=*/true);
  const auto r = compare_kv_policies(trace, shape, *memory);
  ASSERT_EQ(r.size(), 6u);
  const KvPolicyResult& full = r[0];
  const KvPolicyResult& bucket = r[1];
  const KvPolicyResult& cached = r[2];
  const KvPolicyResult& padded = r[3];
  const KvPolicyResult& granule = r[4];
  const KvPolicyResult& pooled = r[5];
  EXPECT_EQ(full.policy, "full context");
  EXPECT_EQ(bucket.policy, "bucket growth");
  EXPECT_EQ(cached.policy, "bucket, cached");
  EXPECT_EQ(padded.policy, "padded batch");
  EXPECT_EQ(granule.policy, "granules");
  EXPECT_EQ(pooled.policy, "granules, pooled");
  // The padded batch pads every slot to the longest chat: never under per-chat buckets' live
  // share, copies on each resize, and every live chat moves with it.
  EXPECT_LT(granule.peak_committed_bytes, padded.peak_committed_bytes);
  EXPECT_GT(padded.copied_bytes, 0u);
  EXPECT_GT(padded.address_changes, 0u);
  EXPECT_EQ(padded.final_committed_bytes, 0u);
  // The cache holds what bucket growth freed: never less, the same copies and moves.
  EXPECT_GE(cached.peak_committed_bytes, bucket.peak_committed_bytes);
  EXPECT_EQ(cached.copied_bytes, bucket.copied_bytes);
  EXPECT_EQ(cached.address_changes, bucket.address_changes);

  const auto live_peak = static_cast<uint64_t>(trace.peak_live_tokens * kBytesPerToken);
  const uint64_t slack_per_chat =
      kGranule + ceil_div(shape.lookahead_tokens * kBytesPerToken, kGranule) * kGranule;
  EXPECT_GE(granule.peak_committed_bytes, live_peak);
  EXPECT_LE(granule.peak_committed_bytes, live_peak + shape.slots * slack_per_chat);
  EXPECT_GE(bucket.peak_committed_bytes, live_peak);
  EXPECT_LT(granule.peak_committed_bytes, bucket.peak_committed_bytes);
  EXPECT_LT(granule.mean_committed_bytes, bucket.mean_committed_bytes);
  EXPECT_LT(bucket.peak_committed_bytes, full.peak_committed_bytes);
  EXPECT_EQ(granule.copied_bytes, 0u);
  EXPECT_EQ(granule.address_changes, 0u);
  EXPECT_GT(bucket.copied_bytes, 0u);
  EXPECT_GT(bucket.address_changes, 0u);
  EXPECT_EQ(granule.final_committed_bytes, 0u);
  EXPECT_EQ(bucket.final_committed_bytes, 0u);
  // With the engine's pool: the same granules plus at most the pool, which it still holds at
  // the end; nothing copied, nothing moved.
  const uint64_t pool_bytes =
      default_kv_pool_granules(KvGeometry{shape.bytes_per_token, shape.max_context_tokens,
                                          shape.slots, shape.lookahead_tokens},
                               shape.prefill_chunk_tokens, kGranule) *
      kGranule;
  EXPECT_GT(pool_bytes, 0u);
  EXPECT_GE(pooled.peak_committed_bytes, granule.peak_committed_bytes);
  EXPECT_LE(pooled.peak_committed_bytes, granule.peak_committed_bytes + pool_bytes);
  EXPECT_EQ(pooled.final_committed_bytes, pool_bytes);
  EXPECT_EQ(pooled.copied_bytes, 0u);
  EXPECT_EQ(pooled.address_changes, 0u);
}

TEST(KvBenchmark, ShapeSmallerThanTheWorkloadIsRefused) {
  const KvTrace trace = make_kv_workload(small_workload());
  KvPolicyShape shape = small_shape();
  shape.slots = 4;
  auto memory = make_host_kv_bench_memory(kGranule, false);
  EXPECT_THROW(compare_kv_policies(trace, shape, *memory), UsageError);
}

}  // namespace
}  // namespace granule
