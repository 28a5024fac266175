// GraphCache: the CUDA backend's decode steps captured as CUDA graphs, one per key (the
// batch-size bucket and the head), captured on first use and replayed after; a placement
// change drops them all (they hold the old weight addresses). It counts what the graph
// telemetry reports: replays, captures, re-captures of a key captured before (with the reason
// that dropped it) and eager steps (with the reason they were not replayed).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "backends/cuda/device_memory.h"
#include "granule/telemetry.h"

namespace granule::cuda {

// What a step's head leaves on the device: logits, a greedy token, or a sampled token; the
// masked heads draw after the host's token masks (token_masks.h).
enum class StepHead { Logits, Greedy, Sample, MaskedGreedy, MaskedSample };

class GraphCache {
 public:
  using Key = std::pair<int, StepHead>;  // (rows the graph runs, head)

  // The graph of `key`, or null when none is captured.
  const CudaGraph* find(Key key) const;
  // Captures `enqueue` (the step's work, issued on `stream`) as the graph of `key`, which has
  // none; then replay(key) launches it.
  void capture(Key key, cudaStream_t stream, const std::function<void()>& enqueue);
  void replay(Key key, cudaStream_t stream);
  // Every graph is stale (a placement change): the next replay of a key re-captures it and
  // reports `reason`.
  void invalidate(const std::string& reason);
  // A decode step ran eagerly instead of as a replay.
  void count_eager(const std::string& reason);
  void clear() { graphs_.clear(); }
  // Every graph field but segments_per_step (the backend's).
  void fill_telemetry(GraphTelemetry& g) const;

 private:
  struct CapturedStep {
    CudaGraph graph;
    int32_t nodes = 0;
  };
  std::map<Key, CapturedStep> graphs_;
  std::map<Key, int> captured_before_;  // keys ever captured
  std::string recapture_reason_;        // why the graphs were last dropped
  // The counts and reasons the telemetry reports (buckets filled from graphs_ on the way out).
  GraphTelemetry counts_;
};

}  // namespace granule::cuda
