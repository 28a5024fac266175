// Tests of the Scheduler's policy on a KvSpace over host memory with a small budget (no
// model): arrival-order admission that a head too big for the budget blocks, preemption of
// the newest running sequence, which then computes all its known tokens again, and sequences
// the budget cannot hold alone reported as oversized. The expected plans follow from the
// geometry by hand: 1 KiB of KV per token in 64 KiB granules is 64 tokens a granule. Also the
// pressure policy: kept KV, then weights (a relief that gives up whole layers), then preemption,
// sized for the step's whole demand and planned ahead of the running chats' growth.
#include "runtime/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "granule/error.h"
#include "memory/kv_space.h"
#include "memory/memory_manager.h"

namespace granule {
namespace {

constexpr uint64_t kGranule = 64ull << 10;
constexpr int64_t kTokensPerGranule = 64;

// A scheduler over `slots` slots of 512 tokens, no look-ahead (so the arithmetic is exact),
// and a budget of `granules` granules.
struct Fixture {
  MemoryManager memory;
  KvSpace kv;
  Scheduler scheduler;

  Fixture(uint64_t granules, int32_t slots, int64_t prefill_chunk_tokens)
      : memory(granules * kGranule),
        kv(make_host_virtual_memory(kGranule), geometry(slots), memory),
        scheduler(kv, prefill_chunk_tokens) {}

  static KvGeometry geometry(int32_t slots) {
    KvGeometry g;
    g.bytes_per_token = 1024;
    g.max_tokens = 512;
    g.slots = slots;
    g.lookahead_tokens = 0;
    return g;
  }

  // Does what the engine does after the backend ran the plan: the planned tokens are
  // computed, and a sequence with all its tokens computed samples one more (token 0).
  StepPlan step() {
    StepPlan plan = scheduler.next_step();
    scheduler.complete(plan);
    for (const ScheduledWork& w : plan.work) {
      Sequence* s = scheduler.find(w.id);
      if (s && s->uncomputed_tokens() == 0) {
        s->tokens.push_back(0);
        ++s->generated;
      }
    }
    return plan;
  }

  void add(SequenceId id, int64_t prompt_tokens, int32_t max_tokens = SamplingParams{}.max_tokens) {
    SamplingParams params;
    params.max_tokens = max_tokens;
    scheduler.add(std::make_unique<Sequence>(
        id, std::vector<TokenId>(static_cast<size_t>(prompt_tokens), 1), params));
  }

  // Prompt + sampled tokens, as the sequence's record holds them.
  int64_t known(SequenceId id) const {
    return static_cast<int64_t>(scheduler.find(id)->tokens.size());
  }

  uint64_t committed_granules() const {
    return memory.bytes(MemoryCategory::KvCommitted) / kGranule;
  }
};

std::vector<SequenceId> ids_of(const std::vector<ScheduledWork>& work) {
  std::vector<SequenceId> ids;
  for (const ScheduledWork& w : work) ids.push_back(w.id);
  return ids;
}

// The case: sequences are admitted in arrival order; a head whose prompt KV the budget cannot
// hold yet blocks a later, smaller one (which would fit), so a long chat is not starved.
TEST(Scheduler, AdmissionIsInArrivalOrderAndAHeadThatDoesNotFitBlocksLaterOnes) {
  Fixture f(/*granules=*/4, /*slots=*/4, /*prefill_chunk_tokens=*/64);
  f.add(1, 100);  // 2 granules, prefilled 64 tokens a step
  f.add(2, 150);  // 3 granules
  f.add(3, 10);   // 1 granule
  StepPlan plan = f.step();
  // 1 is admitted and its first chunk spends the step's 64 prefill tokens.
  EXPECT_EQ(plan.admitted, std::vector<SequenceId>{1});
  EXPECT_EQ(ids_of(plan.work), std::vector<SequenceId>{1});
  EXPECT_EQ(f.scheduler.waiting(), 2u);
  plan = f.step();
  // 1's last 36 prompt tokens take its 2nd granule. 2 needs 3 granules + 1 spare for the
  // running chat's growth and 2 are free: it waits, and so does 3 behind it although 3
  // (1 granule + 1 spare) would fit.
  EXPECT_TRUE(plan.admitted.empty());
  EXPECT_TRUE(f.scheduler.is_waiting(2));
  EXPECT_TRUE(f.scheduler.is_waiting(3));
  EXPECT_EQ(f.committed_granules(), 2u);
  f.scheduler.remove(1);  // 1 finishes: all 4 granules free
  EXPECT_EQ(f.committed_granules(), 0u);
  plan = f.step();
  // 2 is alone, so it needs only its prompt's 3 granules.
  EXPECT_EQ(plan.admitted, std::vector<SequenceId>{2});
  for (int i = 0; i < 5; ++i) f.step();  // 2's prompt, then decodes
  // 3 needs 1 granule + 1 spare for 2's growth; 1 is free: it waits for 2.
  EXPECT_TRUE(f.scheduler.is_waiting(3));
  EXPECT_EQ(f.committed_granules(), 3u);
  f.scheduler.remove(2);
  plan = f.step();
  EXPECT_EQ(plan.admitted, std::vector<SequenceId>{3});
  EXPECT_EQ(f.scheduler.preemptions(), 0u);
}

// The case: when the oldest running sequence needs a granule the budget cannot give, the
// newest running one is preempted: its KV freed, it waits at the front, and when re-admitted
// it prefills every token it knew (prompt + generated) in one go.
TEST(Scheduler, GrowthPreemptsTheNewestWhichLaterPrefillsAllItsTokens) {
  Fixture f(/*granules=*/4, /*slots=*/4, /*prefill_chunk_tokens=*/512);
  f.add(1, 120);  // 2 granules
  f.add(2, 60);   // 1 granule: 2 + 1 spare fit the 2 left
  StepPlan plan = f.step();
  EXPECT_EQ(plan.admitted, (std::vector<SequenceId>{1, 2}));
  EXPECT_EQ(f.committed_granules(), 3u);
  f.add(3, 5);  // arrives later; no room for it while 1 and 2 run
  // Decode steps: 2 crosses 64 tokens on its 5th decode and takes the last granule; 1
  // crosses 128 on its 9th, when the budget is full.
  for (int decode = 1; decode <= 8; ++decode) {
    plan = f.step();
    ASSERT_TRUE(plan.preempted.empty()) << "decode " << decode;
    ASSERT_EQ(ids_of(plan.work), (std::vector<SequenceId>{1, 2})) << "decode " << decode;
  }
  EXPECT_EQ(f.committed_granules(), 4u);
  plan = f.step();
  EXPECT_EQ(plan.preempted, std::vector<SequenceId>{2});
  EXPECT_EQ(ids_of(plan.work), std::vector<SequenceId>{1});
  EXPECT_TRUE(plan.admitted.empty());  // nobody is admitted in a step that preempted
  EXPECT_EQ(f.scheduler.preemptions(), 1u);
  EXPECT_EQ(f.scheduler.preemptions_of(2), 1);
  EXPECT_EQ(f.scheduler.recomputed_tokens(), 68u);  // 2 had 60 prompt + 8 decoded in KV
  EXPECT_TRUE(f.scheduler.is_waiting(2));
  EXPECT_FALSE(f.scheduler.slot_of(2).has_value());
  EXPECT_EQ(f.committed_granules(), 3u);  // 1's three; 2's two went back to the budget

  f.scheduler.remove(1);
  plan = f.step();
  // 2 is ahead of 3 (it arrived first) and prefills its 69 known tokens: the 9th sampled
  // one was not in KV yet, so the prefill's last logits predict the 10th.
  ASSERT_FALSE(plan.admitted.empty());
  EXPECT_EQ(plan.admitted.front(), 2);
  ASSERT_FALSE(plan.work.empty());
  EXPECT_EQ(plan.work.front().id, 2);
  EXPECT_EQ(plan.work.front().start_position, 0);
  EXPECT_EQ(plan.work.front().count, 69);
  EXPECT_FALSE(plan.work.front().decode);  // 69 uncomputed tokens: a chunk
  EXPECT_EQ(f.known(2), 70);               // that prefill sampled the next token
  plan = f.step();
  EXPECT_TRUE(std::any_of(plan.work.begin(), plan.work.end(), [](const ScheduledWork& w) {
    return w.id == 2 && w.decode && w.start_position == 69;
  }));
}

// The case: a prompt whose KV exceeds what the whole budget can hold is reported at once
// (not left waiting), and the next in line is still admitted.
TEST(Scheduler, PromptLargerThanTheBudgetIsOversizedAndOthersRun) {
  Fixture f(/*granules=*/2, /*slots=*/2, /*prefill_chunk_tokens=*/512);
  f.add(1, 200);  // 4 granules
  f.add(2, 30);
  const StepPlan plan = f.step();
  ASSERT_EQ(plan.oversized.size(), 1u);
  EXPECT_EQ(plan.oversized[0].id, 1);
  EXPECT_EQ(plan.oversized[0].needed_bytes, 4 * kGranule);
  EXPECT_EQ(plan.oversized[0].capacity_bytes, 2 * kGranule);
  EXPECT_FALSE(f.scheduler.contains(1));
  EXPECT_EQ(plan.admitted, std::vector<SequenceId>{2});
  EXPECT_EQ(ids_of(plan.work), std::vector<SequenceId>{2});
}

// The case: a running sequence alone in the budget that grows past it is reported oversized
// (not preempted: nothing would ever free room for it), and its KV is freed with it.
TEST(Scheduler, SequenceOutgrowingTheBudgetAloneIsOversizedAndItsKvFreed) {
  Fixture f(/*granules=*/3, /*slots=*/2, /*prefill_chunk_tokens=*/512);
  f.add(1, 125);  // 2 granules; needs a 3rd at 128 tokens and a 4th at 192
  f.add(2, 20);   // 1 granule + 1 spare: does not fit next to 1's 2 of 3
  StepPlan plan = f.step();
  EXPECT_EQ(plan.admitted, std::vector<SequenceId>{1});
  std::vector<SequenceId> preempted;
  for (int i = 0; i < 200 && plan.oversized.empty(); ++i) {
    plan = f.step();
    preempted.insert(preempted.end(), plan.preempted.begin(), plan.preempted.end());
  }
  ASSERT_EQ(plan.oversized.size(), 1u);
  EXPECT_EQ(plan.oversized[0].id, 1);
  EXPECT_EQ(plan.oversized[0].tokens, 193);  // the decode that needed a 4th granule
  EXPECT_EQ(plan.oversized[0].capacity_bytes, 3 * kGranule);
  EXPECT_FALSE(f.scheduler.contains(1));
  EXPECT_TRUE(preempted.empty());  // 2 never ran next to 1: admission kept it out
  // Its granules are back at once, so 2 is admitted in the same step.
  EXPECT_EQ(plan.admitted, std::vector<SequenceId>{2});
  EXPECT_EQ(f.committed_granules(), 1u);
}

// The case: removing a sequence that waits (new, or preempted) takes it out of the queue and
// frees nothing it did not hold; removing a running one frees its KV at once.
TEST(Scheduler, RemovingWaitingAndRunningSequencesFreesTheirPlaces) {
  Fixture f(/*granules=*/4, /*slots=*/4, /*prefill_chunk_tokens=*/512);
  f.add(1, 120);
  f.add(2, 60);
  f.step();
  f.add(3, 5);
  for (int i = 0; i < 9; ++i) f.step();  // 2 is preempted on the 9th decode (as above)
  ASSERT_TRUE(f.scheduler.is_waiting(2));
  ASSERT_EQ(f.scheduler.waiting(), 2u);
  EXPECT_NE(f.scheduler.remove(2), nullptr);  // waiting: its record comes back, no KV
  EXPECT_NE(f.scheduler.remove(3), nullptr);
  EXPECT_EQ(f.scheduler.waiting(), 0u);
  EXPECT_EQ(f.committed_granules(), 3u);
  EXPECT_NE(f.scheduler.remove(1), nullptr);
  EXPECT_EQ(f.committed_granules(), 0u);
  EXPECT_TRUE(f.scheduler.empty());
  EXPECT_TRUE(f.step().work.empty());
}

// One planned item, compared whole.
struct Item {
  SequenceId id;
  int64_t start;
  int64_t count;
  bool decode;
  bool operator==(const Item&) const = default;
};

std::vector<Item> items_of(const std::vector<ScheduledWork>& work) {
  std::vector<Item> items;
  for (const ScheduledWork& w : work) items.push_back({w.id, w.start_position, w.count, w.decode});
  return items;
}

void PrintTo(const Item& i, std::ostream* os) {
  *os << "{" << i.id << " @" << i.start << " x" << i.count << (i.decode ? " decode}" : " chunk}");
}

// The case: a step's prefill chunk budget (64) while another chat decodes. Decoding costs
// none of it (1 gets its token every step); the oldest prefilling chat takes what it needs
// first (2: all 64, then its last 36) and the rest goes to the next (3 is admitted in the
// step 2 leaves 28 tokens of the budget, and gets them); a step whose budget is spent admits
// nobody (3 waits in step 2). Worked out by hand from next_step()'s rules.
TEST(Scheduler, PrefillChunkBudgetIsSharedOldestFirstWhileOthersDecode) {
  Fixture f(/*granules=*/64, /*slots=*/4, /*prefill_chunk_tokens=*/64);
  f.add(1, 10);
  StepPlan plan = f.step();
  EXPECT_EQ(items_of(plan.work), (std::vector<Item>{{1, 0, 10, false}}));
  f.add(2, 100);
  f.add(3, 100);

  plan = f.step();
  EXPECT_EQ(plan.admitted, std::vector<SequenceId>{2});
  EXPECT_EQ(items_of(plan.work), (std::vector<Item>{{1, 10, 1, true}, {2, 0, 64, false}}));
  EXPECT_TRUE(f.scheduler.is_waiting(3));  // the budget was spent: no admission

  plan = f.step();
  EXPECT_EQ(plan.admitted, std::vector<SequenceId>{3});
  EXPECT_EQ(items_of(plan.work),
            (std::vector<Item>{{1, 11, 1, true}, {2, 64, 36, false}, {3, 0, 28, false}}));

  plan = f.step();
  EXPECT_EQ(items_of(plan.work),
            (std::vector<Item>{{1, 12, 1, true}, {2, 100, 1, true}, {3, 28, 64, false}}));
  plan = f.step();
  EXPECT_EQ(items_of(plan.work),
            (std::vector<Item>{{1, 13, 1, true}, {2, 101, 1, true}, {3, 92, 8, false}}));
  plan = f.step();
  EXPECT_EQ(items_of(plan.work),
            (std::vector<Item>{{1, 14, 1, true}, {2, 102, 1, true}, {3, 100, 1, true}}));
  EXPECT_EQ(f.scheduler.preemptions(), 0u);
}

// The case: more sequences than slots with KV to spare. Those without a slot wait however long
// the others run; a finished one's slot goes to the next in arrival order at the next step.
TEST(Scheduler, SequencesBeyondTheSlotsWaitForAFreedSlot) {
  Fixture f(/*granules=*/64, /*slots=*/2, /*prefill_chunk_tokens=*/512);
  f.add(1, 10);
  f.add(2, 10);
  f.add(3, 10);
  f.add(4, 10);
  StepPlan plan = f.step();
  EXPECT_EQ(plan.admitted, (std::vector<SequenceId>{1, 2}));
  for (int i = 0; i < 20; ++i) {
    plan = f.step();
    ASSERT_TRUE(plan.admitted.empty()) << "decode " << i;
    ASSERT_EQ(ids_of(plan.work), (std::vector<SequenceId>{1, 2})) << "decode " << i;
  }
  EXPECT_EQ(f.scheduler.waiting(), 2u);
  EXPECT_EQ(f.scheduler.running(), 2u);
  EXPECT_FALSE(f.scheduler.slot_of(3).has_value());
  const int32_t freed = *f.scheduler.slot_of(1);
  f.scheduler.remove(1);
  plan = f.step();
  EXPECT_EQ(plan.admitted, std::vector<SequenceId>{3});
  EXPECT_EQ(f.scheduler.slot_of(3), freed);
  EXPECT_TRUE(f.scheduler.is_waiting(4));
  f.scheduler.remove(2);
  f.scheduler.remove(3);
  plan = f.step();
  EXPECT_EQ(plan.admitted, std::vector<SequenceId>{4});
  EXPECT_EQ(f.scheduler.preemptions(), 0u);
}

// The case: add() refuses a null record, an empty prompt, an id already queued and an id
// smaller than the last (the order is the priority), each with UsageError and nothing queued.
TEST(Scheduler, AddRefusesBadSequencesWithUsageErrorAndQueuesNothing) {
  Fixture f(/*granules=*/8, /*slots=*/2, /*prefill_chunk_tokens=*/64);
  EXPECT_THROW(f.scheduler.add(nullptr), UsageError);
  EXPECT_THROW(
      f.scheduler.add(std::make_unique<Sequence>(1, std::vector<TokenId>{}, SamplingParams{})),
      UsageError);
  EXPECT_TRUE(f.scheduler.empty());
  f.add(5, 10);
  EXPECT_THROW(f.add(5, 10), UsageError);  // already queued
  EXPECT_THROW(f.add(4, 10), UsageError);  // arrived "before" 5
  EXPECT_EQ(f.scheduler.sequences().size(), 1u);
  EXPECT_EQ(f.scheduler.waiting(), 1u);
  EXPECT_EQ(f.known(5), 10);
  f.add(6, 3);  // a later id is still taken
  EXPECT_EQ(f.scheduler.waiting(), 2u);
  const StepPlan plan = f.step();
  EXPECT_EQ(plan.admitted, (std::vector<SequenceId>{5, 6}));
}

// The weights step of the pressure policy as the CUDA backend takes it: `layers` layers of one
// granule each, charged to the ledger; a relief gives up the fewest whole layers that free what
// it asks, in one re-plan, or none at all when every layer would not be enough.
struct LayerRelief {
  MemoryManager& memory;
  uint64_t resident;
  std::vector<uint64_t> asked;  // the granules each call asked for
  int replans = 0;
  std::vector<std::string>* events = nullptr;

  LayerRelief(Fixture& f, uint64_t layers) : memory(f.memory), resident(layers) {
    memory.charge(MemoryCategory::WeightsResident, layers * kGranule);
    f.scheduler.set_pressure_relief([this](uint64_t bytes) { return relieve(bytes); });
  }
  uint64_t relieve(uint64_t bytes) {
    const uint64_t layers = (bytes + kGranule - 1) / kGranule;
    asked.push_back(layers);
    if (layers > resident) return 0;
    resident -= layers;
    memory.release(MemoryCategory::WeightsResident, layers * kGranule);
    ++replans;
    if (events) events->push_back("weights");
    return layers * kGranule;
  }
};

// The case: one pressure policy frees memory in one order. Idle KV (a finished chat's kept
// entry) leaves first, swapped to host memory; weights move next; running chats are preempted
// only once no layer is left to move. Budget: 3 granules of KV and 2 one-granule layers.
TEST(SchedulerPressure, IdleKvGivesWayFirstThenWeightsThenRunningChats) {
  Fixture f(/*granules=*/5, /*slots=*/4, /*prefill_chunk_tokens=*/512);
  std::vector<std::string> events;
  KvCopier copier;
  copier.to_host = [&events](int32_t, int64_t, uint64_t, void*) {
    events.push_back("idle kv");
    return true;
  };
  f.scheduler.set_kv_reuse(true, 1ull << 30, copier);
  LayerRelief weights(f, 2);
  weights.events = &events;
  SamplingParams one_token;
  one_token.max_tokens = 1;
  // Tokens none of the later prompts begins with: its KV serves none of them.
  f.scheduler.add(std::make_unique<Sequence>(1, std::vector<TokenId>(60, 7), one_token));
  f.step();
  f.scheduler.retire(1);  // its 60 tokens' KV stays in its slot: one granule
  ASSERT_EQ(f.scheduler.kept().size(), 1u);
  ASSERT_EQ(f.committed_granules(), 1u);
  f.add(2, 100, /*max_tokens=*/1000);  // grows through the slot's 8 granules
  f.add(3, 10, /*max_tokens=*/1000);   // newer: the one preempted
  std::vector<SequenceId> preempted;
  for (int i = 0; i < 400 && preempted.empty(); ++i) {
    const StepPlan plan = f.step();
    for (SequenceId id : plan.preempted) {
      events.push_back("preempt");
      preempted.push_back(id);
    }
    ASSERT_TRUE(plan.oversized.empty());
  }
  ASSERT_EQ(preempted, std::vector<SequenceId>{3});
  // 3's admission needed its granule and one for 2 to grow into: the kept entry gave its
  // granule, a layer the other. 2's growth took the second layer, then 3's KV.
  EXPECT_EQ(events, (std::vector<std::string>{"idle kv", "weights", "weights", "preempt"}));
  EXPECT_EQ(f.scheduler.swap_outs(), 1u);
  EXPECT_EQ(weights.resident, 0u);
  // Every call asked for the whole demand first: the running chats' KV to the end of their
  // generation (2's slot, 8 granules, and 3's), refused, and then what the step needed.
  ASSERT_GE(weights.asked.size(), 2u);
  EXPECT_GT(weights.asked.front(), 2u);
}

// The case: a step whose chats all need more KV at once (two running chats growing to the end
// of their generation, and a third admitted) is relieved by one call for all of it, which moves
// every layer needed in one re-plan; nothing re-plans again however long they run.
TEST(SchedulerPressure, OneReliefFreesTheWholeStepsDemandInOneRePlan) {
  Fixture f(/*granules=*/3 + 16, /*slots=*/4, /*prefill_chunk_tokens=*/512);
  LayerRelief weights(f, 16);
  // Each: 60 prompt tokens and 99 more KV tokens (the 100th sampled has none): 3 granules.
  f.add(1, 60, /*max_tokens=*/100);
  f.add(2, 60, /*max_tokens=*/100);
  f.add(3, 60, /*max_tokens=*/100);
  StepPlan plan = f.step();
  EXPECT_EQ(plan.admitted, (std::vector<SequenceId>{1, 2, 3}));
  // 3's admission found 1 granule free of the 3: the one call asked for all three chats'
  // 9 granules less the 2 mapped and the 1 free.
  EXPECT_EQ(weights.asked, std::vector<uint64_t>{6});
  EXPECT_EQ(weights.replans, 1);
  for (int i = 0; i < 99; ++i) {
    plan = f.step();
    ASSERT_TRUE(plan.preempted.empty()) << "step " << i;
    ASSERT_EQ(plan.work.size(), 3u) << "step " << i;
  }
  EXPECT_EQ(f.known(1), 160);
  EXPECT_EQ(f.committed_granules(), 9u);
  EXPECT_EQ(weights.replans, 1);
  EXPECT_EQ(weights.asked.size(), 1u);  // planned ahead: no step asked again
  EXPECT_EQ(weights.resident, 10u);     // only what the KV needed moved
  EXPECT_EQ(f.scheduler.preemptions(), 0u);
}

// The case: a long generation at a tight budget. The first decode step sees that the chat's
// remaining tokens will not fit and re-plans once with room for all of them; then the chat runs
// to its end without another re-plan (each would re-capture the GPU's decode graphs).
TEST(SchedulerPressure, LongGenerationAtATightBudgetRePlansOnceAheadAndThenNever) {
  Fixture f(/*granules=*/2 + 10, /*slots=*/2, /*prefill_chunk_tokens=*/512);
  LayerRelief weights(f, 10);
  f.add(1, 10, /*max_tokens=*/480);  // KV of 489 tokens at most: 8 granules
  StepPlan plan = f.step();          // the prompt: 1 granule, no pressure yet
  EXPECT_EQ(weights.replans, 0);
  plan = f.step();  // the first decode: planned ahead
  EXPECT_EQ(weights.replans, 1);
  EXPECT_EQ(weights.asked, std::vector<uint64_t>{6});  // 8 granules less the 1 mapped, 1 free
  for (int i = 0; i < 478; ++i) {
    plan = f.step();
    ASSERT_EQ(plan.work.size(), 1u) << "step " << i;
  }
  EXPECT_EQ(f.known(1), 10 + 480);
  EXPECT_EQ(f.committed_granules(), 8u);
  EXPECT_EQ(weights.replans, 1);
  EXPECT_EQ(weights.asked.size(), 1u);
  EXPECT_EQ(f.scheduler.preemptions(), 0u);
}

// The case: KV swapped to host memory comes back as part of the plan. Planning maps the slot
// and hands the host copy over (StepPlan::swap_ins) for the engine to queue ahead of the step;
// nothing is copied while planning, and the counters count it.
TEST(SchedulerPressure, SwappedKvComesBackAsACopyThePlanCarries) {
  Fixture f(/*granules=*/8, /*slots=*/1, /*prefill_chunk_tokens=*/512);
  int copies_out = 0;
  KvCopier copier;
  copier.to_host = [&copies_out](int32_t, int64_t, uint64_t bytes, void* host) {
    std::memset(host, 0xab, bytes);
    ++copies_out;
    return true;
  };
  f.scheduler.set_kv_reuse(true, 1ull << 30, copier);
  SamplingParams one_token;
  one_token.max_tokens = 1;
  f.scheduler.add(std::make_unique<Sequence>(1, std::vector<TokenId>(60, 7), one_token));
  f.step();
  f.scheduler.retire(1);
  f.add(2, 30);  // the only slot: 1's KV goes to host memory
  StepPlan plan = f.step();
  ASSERT_EQ(plan.admitted, std::vector<SequenceId>{2});
  EXPECT_TRUE(plan.swap_ins.empty());
  ASSERT_EQ(copies_out, 1);
  ASSERT_TRUE(f.scheduler.kept().at(0).swapped());
  f.scheduler.remove(2);

  std::vector<TokenId> prompt(60, 7);
  prompt.insert(prompt.end(), 10, 2);  // 1's tokens, then more
  f.scheduler.add(std::make_unique<Sequence>(3, prompt, SamplingParams{}));
  plan = f.step();
  ASSERT_EQ(plan.admitted, std::vector<SequenceId>{3});
  ASSERT_EQ(plan.swap_ins.size(), 1u);
  const KvSwapIn& in = plan.swap_ins[0];
  EXPECT_EQ(in.id, 3);
  EXPECT_EQ(in.slot, *f.scheduler.slot_of(3));
  ASSERT_EQ(in.host.size(), 60u * 1024u);
  EXPECT_EQ(in.host.front(), 0xab);
  EXPECT_EQ(in.host.back(), 0xab);
  EXPECT_EQ(items_of(plan.work), (std::vector<Item>{{3, 60, 10, false}}));
  EXPECT_EQ(f.scheduler.swap_ins(), 1u);
  EXPECT_EQ(f.scheduler.swap_in_bytes(), 60u * 1024u);
  EXPECT_TRUE(f.scheduler.kept().empty());
}

}  // namespace
}  // namespace granule
