// The values the window's panels draw for a remote engine, read from its Prometheus /metrics:
// vLLM's `vllm:` series, SGLang's `sglang:`, llama-server's `llamacpp:` and Granule's own
// `granule_`. A value the engine does not expose stays unset (shown as unavailable, never 0).
#pragma once
#include <optional>
#include <string>
#include <string_view>

#include "remote/prometheus_text.h"

namespace granule::remote {

enum class MetricsDialect { None, Vllm, Sglang, LlamaServer, Granule };
const char* metrics_dialect_name(MetricsDialect dialect);  // "vLLM", "SGLang", …

// One scrape.
struct EngineMetrics {
  MetricsDialect dialect = MetricsDialect::None;
  std::optional<double> requests_running;
  std::optional<double> requests_waiting;
  std::optional<double> kv_usage_fraction;    // 0..1 of the engine's KV cache in use
  std::optional<double> kv_used_bytes;        // Granule only: bytes, not a fraction
  std::optional<double> prompt_tokens_total;  // counters, for the rates below
  std::optional<double> generation_tokens_total;
  std::optional<double> prefix_cache_queries_total;  // tokens looked up in the prefix cache
  std::optional<double> prefix_cache_hits_total;     // of those, found
  std::optional<double> prefix_cache_hit_fraction;   // an engine's own gauge (SGLang)
  std::optional<double> prompt_tokens_per_second;    // an engine's own gauges, when it has them
  std::optional<double> generation_tokens_per_second;
  std::optional<double> preemptions_total;
  // Granule only: decode batching. Steps that decoded a token for at least one sequence, the
  // sequences those steps decoded, and the steps that decoded two or more together.
  std::optional<double> decode_steps_total;
  std::optional<double> decode_step_sequences_total;
  std::optional<double> batched_decode_steps_total;
};

EngineMetrics read_engine_metrics(const PrometheusText& text);
inline EngineMetrics read_engine_metrics(std::string_view text) {
  return read_engine_metrics(parse_prometheus_text(text));
}

// What a panel shows between two scrapes `seconds` apart: throughputs from the counters'
// growth (else the engine's own gauges), the prefix-cache hit rate over the interval.
struct EngineRates {
  std::optional<double> prompt_tokens_per_second;
  std::optional<double> generation_tokens_per_second;
  std::optional<double> prefix_cache_hit_fraction;
  // Sequences per decode step, and the share of steps that decoded two or more: over the
  // interval when the server decoded in it, else over its life (an idle server still says
  // how it batched).
  std::optional<double> mean_decode_batch;
  std::optional<double> batched_step_fraction;
};
EngineRates engine_rates(const EngineMetrics& before, const EngineMetrics& now, double seconds);

}  // namespace granule::remote
