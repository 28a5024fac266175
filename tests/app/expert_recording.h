// A synthetic recording of a mixture of experts under a VRAM budget, for the expert panel's
// tests and screenshots: qwen3-30b-a3b's shape (48 layers × 128 experts, top-8), routing drawn
// from a Zipf law per layer (each layer its own order of hot experts; exponent 0 is uniform),
// half the experts resident at first spread evenly, then re-planned every second from decayed
// counts by the engine's own plan (memory/expert_placement.h), so hot experts move into device
// memory and the hit rate climbs as a real run's would. Deterministic for a seed.
#pragma once
#include <QByteArray>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "memory/expert_placement.h"
#include "telemetry_json_writer.h"

namespace granule::app::testing {

struct ExpertSessionSpec {
  int n_layer = 48, n_expert = 128, top_k = 8;
  double zipf_exponent = 1.1;  // 0: uniform routing
  double seconds = 20, hz = 10;
  int chats = 4;                      // decode batch: one token per chat per step
  double steps_per_second = 24;       // decode steps
  int prefill_tokens = 512;           // one prompt in the first step
  uint64_t expert_bytes = 3'059'712;  // gate + up + down, Q4_K with a Q6_K down
  double resident_share = 0.5;        // of every expert, what the budget holds
  double h2d_bytes_per_second = 55.4e9;
  int64_t max_promotions_per_replan = 384;
  uint32_t seed = 36;
  double half_life_seconds = 10;  // of the decayed routing counts the re-plans read
  // Of each step's missed experts, the share the CPU computes (the CUDA backend's host experts):
  // their choices count as host_computed and their bytes as bytes_host, not streamed.
  double host_share = 0;
};

inline QByteArray expertSessionJsonl(const ExpertSessionSpec& spec) {
  const int cells = spec.n_layer * spec.n_expert;
  std::mt19937_64 rng(spec.seed);
  // Per layer: a permutation (which expert is the hottest, second hottest, ...) and the Zipf
  // law's cumulative weights over the ranks.
  std::vector<std::vector<int>> order(static_cast<size_t>(spec.n_layer));
  for (auto& o : order) {
    o.resize(static_cast<size_t>(spec.n_expert));
    std::iota(o.begin(), o.end(), 0);
    std::shuffle(o.begin(), o.end(), rng);
  }
  std::vector<double> cumulative(static_cast<size_t>(spec.n_expert));
  double sum = 0;
  for (int r = 0; r < spec.n_expert; ++r) {
    sum += 1.0 / std::pow(r + 1.0, spec.zipf_exponent);
    cumulative[static_cast<size_t>(r)] = sum;
  }
  std::uniform_real_distribution<double> uniform(0.0, sum);
  const auto draw_rank = [&] {
    const double u = uniform(rng);
    return static_cast<int>(std::lower_bound(cumulative.begin(), cumulative.end(), u) -
                            cumulative.begin());
  };

  ExpertPlacementInput in;
  in.n_layer = spec.n_layer;
  in.n_expert = spec.n_expert;
  in.expert_bytes = spec.expert_bytes;
  in.budget_bytes = static_cast<uint64_t>(spec.resident_share * cells) * spec.expert_bytes +
                    spec.expert_bytes / 2;
  in.max_promotions = spec.max_promotions_per_replan;
  ExpertPlacement placement = plan_expert_placement(in, nullptr);  // uniform: no counts yet
  std::vector<uint64_t> decayed;
  std::vector<int32_t> since_replan(static_cast<size_t>(cells), 0);
  const double keep = routing_decay_keep(1.0, spec.half_life_seconds);

  const uint64_t gib = 1ull << 30, mib = 1ull << 20;
  const uint64_t always_resident = 1'340 * mib, workspace = 420 * mib;
  ExpertTelemetry totals;
  totals.n_layer = spec.n_layer;
  totals.n_expert = spec.n_expert;
  totals.expert_bytes = spec.expert_bytes;
  totals.routed.assign(static_cast<size_t>(cells), 0);
  totals.streamed.assign(static_cast<size_t>(cells), 0);
  uint64_t decode_tokens = 0, steps = 0, h2d_total = 0;
  double step_clock = 0, next_replan = 1.0;
  std::vector<int> chosen;
  std::vector<uint8_t> fetched(static_cast<size_t>(cells));

  // One forward pass of `tokens` tokens: each picks top_k distinct experts per layer; a host
  // expert is read over PCIe once for the pass, however many of its tokens chose it.
  const auto run_pass = [&](int tokens) {
    std::fill(fetched.begin(), fetched.end(), 0);
    for (int t = 0; t < tokens; ++t) {
      for (int l = 0; l < spec.n_layer; ++l) {
        chosen.clear();
        while (static_cast<int>(chosen.size()) < spec.top_k) {
          const int e = order[static_cast<size_t>(l)][static_cast<size_t>(draw_rank())];
          if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
        }
        for (int e : chosen) {
          const auto i = static_cast<size_t>(l * spec.n_expert + e);
          ++totals.routed[i];
          ++since_replan[i];
          if (placement.resident[i]) {
            ++totals.hits;
          } else {
            ++totals.misses;
            ++totals.streamed[i];
            if (!fetched[i]) {  // 1: staged over PCIe, 2: computed by the CPU
              const uint64_t pick = (i * 2654435761u + static_cast<uint64_t>(steps)) % 1000;
              fetched[i] = static_cast<double>(pick) < spec.host_share * 1000 ? 2 : 1;
              (fetched[i] == 2 ? totals.bytes_host : totals.bytes_streamed) += spec.expert_bytes;
            }
            if (fetched[i] == 2) ++totals.host_computed;
          }
        }
      }
    }
    totals.tokens += static_cast<uint64_t>(tokens);
    ++steps;
  };

  QByteArray out;
  run_pass(spec.prefill_tokens);
  const int frames = static_cast<int>(spec.seconds * spec.hz);
  uint64_t bytes_at_last_frame = 0, tokens_at_last_frame = 0;
  for (int f = 0; f <= frames; ++f) {
    const double t = f / spec.hz;
    while (step_clock < t) {
      run_pass(spec.chats);
      decode_tokens += static_cast<uint64_t>(spec.chats);
      step_clock += 1.0 / spec.steps_per_second;
    }
    if (t >= next_replan) {  // between steps, once a second, as the engine would
      decay_routing_counts(decayed, since_replan.data(), since_replan.size(), keep);
      std::fill(since_replan.begin(), since_replan.end(), 0);
      in.routing_counts = decayed;
      const ExpertPlacement next = plan_expert_placement(in, &placement);
      const ExpertMoves moves = expert_moves(placement, next);
      totals.promotions += moves.promoted.size();
      totals.demotions += moves.demoted.size();
      h2d_total += moves.promoted.size() * spec.expert_bytes;
      placement = next;
      next_replan += 1.0;
    }
    totals.resident = placement.resident;

    TelemetrySnapshot s;
    s.device.name = "NVIDIA H200";
    s.device.gpu = true;
    s.device.total_bytes = 140 * gib;
    s.device.budget_bytes = always_resident + workspace + in.budget_bytes + 2 * gib;
    auto& ledger = s.device.ledger;
    const uint64_t resident_bytes =
        always_resident + static_cast<uint64_t>(placement.resident_count()) * spec.expert_bytes;
    const uint64_t kv = std::min<uint64_t>(96 * mib + static_cast<uint64_t>(t * 6) * mib, gib);
    ledger[static_cast<size_t>(MemoryCategory::WeightsResident)] = resident_bytes;
    ledger[static_cast<size_t>(MemoryCategory::KvCommitted)] = kv;
    ledger[static_cast<size_t>(MemoryCategory::KvPool)] = 64 * mib;
    ledger[static_cast<size_t>(MemoryCategory::KvReservedVa)] = 16 * gib;
    ledger[static_cast<size_t>(MemoryCategory::Workspace)] = workspace;
    ledger[static_cast<size_t>(MemoryCategory::Graphs)] = 18 * mib;
    for (size_t c = 0; c < ledger.size(); ++c)
      if (static_cast<MemoryCategory>(c) != MemoryCategory::KvReservedVa)
        s.device.used_bytes += ledger[c];
    s.kv.committed_bytes = kv;
    s.kv.pool_bytes = 64 * mib;
    s.scheduler.running = spec.chats;
    s.graphs.buckets = {1, 4, 512};
    s.graphs.nodes = 2210;
    s.graphs.segments_per_step = 3;
    s.graphs.replays = steps;
    s.graphs.captures = 3;
    s.throughput.steps = steps;
    s.throughput.decode_tokens_per_second = spec.chats * spec.steps_per_second;
    s.throughput.prompt_tokens_per_second = 4800;
    auto& st = s.streaming;  // every layer's attention stays resident; experts cross PCIe
    st.layers_resident = spec.n_layer;
    st.layer_streamed.assign(static_cast<size_t>(spec.n_layer), 0);
    st.resident_weight_bytes = resident_bytes;
    const uint64_t frame_bytes = totals.bytes_streamed - bytes_at_last_frame;
    const uint64_t frame_tokens = totals.tokens - tokens_at_last_frame;
    st.h2d_bytes = totals.bytes_streamed + h2d_total;
    st.h2d_bytes_per_second = f == 0 ? 0 : static_cast<double>(frame_bytes) * spec.hz;
    st.h2d_bytes_per_token =
        frame_tokens > 0 ? static_cast<double>(frame_bytes) / static_cast<double>(frame_tokens) : 0;
    st.h2d_bandwidth_bytes_per_second = spec.h2d_bytes_per_second;
    bytes_at_last_frame = totals.bytes_streamed;
    tokens_at_last_frame = totals.tokens;
    s.experts = totals;
    for (int q = 1; q <= spec.chats; ++q) {
      SequenceTelemetry seq;
      seq.id = q;
      seq.tokens = static_cast<int64_t>(decode_tokens / static_cast<uint64_t>(spec.chats)) + 60 * q;
      seq.kv_committed_bytes = kv / static_cast<uint64_t>(spec.chats);
      seq.kv_reserved_bytes = 2 * gib;
      seq.tokens_per_second = spec.steps_per_second;
      s.sequences.push_back(seq);
    }
    out += frameJsonLine(t, s);
  }
  return out;
}

}  // namespace granule::app::testing
