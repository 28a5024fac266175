// Telemetry recordings for the app's tests, written by the engine's recorder format
// (granule/telemetry_json.h), which the tests then replay.
#pragma once
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "granule/telemetry.h"
#include "granule/telemetry_json.h"

namespace granule::app::testing {

// The engine's own writer (granule/telemetry_json.h): what granule-cli and granule-bench
// record is what the window's replay reads.
inline QByteArray frameJsonLine(double t, const TelemetrySnapshot& s) {
  return QByteArray::fromStdString(telemetry_to_json(s, t)) + '\n';
}

// A streaming session on an H200-like device: 32 layers, the last ones streamed; after
// `replan_at_s` a smaller budget streams more of them. Host-to-device traffic and decode
// speed wobble around their means, so the plots have a shape.
inline QByteArray streamingSessionJsonl(double seconds, double hz, double replan_at_s) {
  QByteArray out;
  const uint64_t gib = 1ull << 30, mib = 1ull << 20;
  const int layers = 32;
  const uint64_t layer_bytes = 224 * mib, fixed_bytes = 1 * gib;
  uint64_t h2d_total = 0;
  uint64_t replays = 0;
  for (int i = 0; i <= static_cast<int>(seconds * hz); ++i) {
    const double t = i / hz;
    const bool replanned = t >= replan_at_s;
    const int streamed = replanned ? 14 : 8;
    TelemetrySnapshot s;
    s.device.name = "NVIDIA H200";
    s.device.gpu = true;
    s.device.total_bytes = 140 * gib;
    s.device.budget_bytes = replanned ? 8 * gib : 10 * gib;
    auto& ledger = s.device.ledger;
    const uint64_t resident = fixed_bytes + layer_bytes * static_cast<uint64_t>(layers - streamed);
    ledger[static_cast<size_t>(MemoryCategory::WeightsResident)] = resident;
    ledger[static_cast<size_t>(MemoryCategory::WeightsStaging)] = 2 * layer_bytes;
    const uint64_t kv =
        std::min<uint64_t>(64 * mib + static_cast<uint64_t>(t * 40) * mib, 1400 * mib);
    ledger[static_cast<size_t>(MemoryCategory::KvCommitted)] = kv;
    ledger[static_cast<size_t>(MemoryCategory::KvPool)] = 128 * mib;
    ledger[static_cast<size_t>(MemoryCategory::KvReservedVa)] = 32 * gib;
    ledger[static_cast<size_t>(MemoryCategory::Workspace)] = 320 * mib;
    ledger[static_cast<size_t>(MemoryCategory::Graphs)] = 24 * mib;
    for (size_t c = 0; c < ledger.size(); ++c)
      if (static_cast<MemoryCategory>(c) != MemoryCategory::KvReservedVa)
        s.device.used_bytes += ledger[c];
    s.kv.committed_bytes = kv;
    s.kv.pool_bytes = 128 * mib;
    s.kv.granules_mapped = kv / (2 * mib);
    s.kv.last_granules_mapped = 1;
    s.kv.last_mapping_us = 9.5;
    s.scheduler.running = 2;
    const double wobble = 0.5 + 0.5 * std::sin(t * 1.7) * std::cos(t * 0.6);
    const double tokens_per_s = (replanned ? 13.0 : 22.0) * (0.9 + 0.2 * wobble);
    s.throughput.decode_tokens_per_second = tokens_per_s;
    s.throughput.prompt_tokens_per_second = 2100;
    s.throughput.steps = static_cast<uint64_t>(t * 11);
    s.graphs.buckets = {1, 2};
    s.graphs.nodes = 1406;
    s.graphs.segments_per_step = 3;
    replays = static_cast<uint64_t>(t * 11);
    s.graphs.replays = replays;
    s.graphs.captures = replanned ? 4 : 2;
    s.graphs.recaptures = replanned ? 2 : 0;
    if (replanned)
      s.graphs.last_recapture_reason = "the placement changed (14 of 32 layers streamed)";
    s.graphs.eager_steps = 2;
    s.graphs.last_fallback_reason = "first step of bucket 2 (capturing)";
    auto& st = s.streaming;
    st.layers_streamed = streamed;
    st.layers_resident = layers - streamed;
    for (int l = 0; l < layers; ++l) st.layer_streamed.push_back(l >= layers - streamed ? 1 : 0);
    st.resident_weight_bytes = resident;
    st.streamed_bytes_per_pass = layer_bytes * static_cast<uint64_t>(streamed);
    st.staging_slots = 2;
    st.staging_bytes = 2 * layer_bytes;
    st.h2d_bytes_per_token = static_cast<double>(st.streamed_bytes_per_pass) / 2;  // batch 2
    st.h2d_bytes_per_second = st.h2d_bytes_per_token * tokens_per_s;
    h2d_total += static_cast<uint64_t>(st.h2d_bytes_per_second / hz);
    st.h2d_bytes = h2d_total;
    st.h2d_bandwidth_bytes_per_second = 53.7e9;
    st.staging_occupancy = st.h2d_bytes_per_second / st.h2d_bandwidth_bytes_per_second;
    st.replans = replanned ? 1 : 0;
    if (replanned) st.last_replan_reason = "the budget changed from 10240 to 8192 MiB";
    for (int q = 1; q <= 2; ++q) {
      SequenceTelemetry seq;
      seq.id = q;
      seq.tokens = static_cast<int64_t>(t * tokens_per_s / 2) + 40 * q;
      seq.kv_committed_bytes = kv / 2;
      seq.kv_reserved_bytes = 2 * gib;
      seq.tokens_per_second = tokens_per_s / 2;
      s.sequences.push_back(seq);
    }
    out += frameJsonLine(t, s);
  }
  return out;
}

}  // namespace granule::app::testing
