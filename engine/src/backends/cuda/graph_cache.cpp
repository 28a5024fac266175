// GraphCache: stream capture into a graph, instantiation, replay and the re-capture counts.
#include "backends/cuda/graph_cache.h"

#include <algorithm>

#include "backends/cuda/cuda_check.h"
#include "granule/log.h"

namespace granule::cuda {

void GraphCache::replay(Key key, cudaStream_t stream) {
  const CapturedStep& step = graphs_.at(key);
  counts_.nodes = step.nodes;
  step.graph.launch(stream);
  ++counts_.replays;
}

void GraphCache::capture(Key key, cudaStream_t s, const std::function<void()>& enqueue) {
  check_cuda(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  cudaGraph_t graph = nullptr;
  try {
    enqueue();
  } catch (...) {
    cudaStreamEndCapture(s, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  check_cuda(cudaStreamEndCapture(s, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  if (status != cudaSuccess) {
    cudaGraphDestroy(graph);
    check_cuda(status, "cudaGraphInstantiate");
  }
  const auto it = graphs_.emplace(key, CapturedStep{CudaGraph(graph, exec), 0}).first;
  ++counts_.captures;
  if (captured_before_[key]++ > 0) {
    ++counts_.recaptures;
    counts_.last_recapture_reason = recapture_reason_.empty() ? "unknown" : recapture_reason_;
  }
  it->second.nodes = static_cast<int32_t>(it->second.graph.node_count());
  logger("engine.graph")
      ->debug("captured the decode step for {} rows ({} nodes)", key.first, it->second.nodes);
}

const CudaGraph* GraphCache::find(Key key) const {
  const auto it = graphs_.find(key);
  return it == graphs_.end() ? nullptr : &it->second.graph;
}

void GraphCache::invalidate(const std::string& reason) {
  graphs_.clear();
  recapture_reason_ = reason;
}

void GraphCache::count_eager(const std::string& reason) {
  counts_.last_fallback_reason = reason;
  ++counts_.eager_steps;
}

void GraphCache::fill_telemetry(GraphTelemetry& g) const {
  g = counts_;
  for (const auto& [key, graph] : graphs_)
    if (std::find(g.buckets.begin(), g.buckets.end(), key.first) == g.buckets.end())
      g.buckets.push_back(key.first);
  std::sort(g.buckets.begin(), g.buckets.end());
}

}  // namespace granule::cuda
