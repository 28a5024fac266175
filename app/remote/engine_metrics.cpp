// Each engine's series for the same quantity. vLLM: its "Production Metrics" page (V1 names,
// with the V0 gauges gpu_cache_usage_perc and gpu_prefix_cache_hit_rate as fallbacks).
// SGLang: its "Production Metrics" page. llama-server: tools/server's /metrics (--metrics).
// Granule: app/server/prometheus_metrics.cpp.
#include "remote/engine_metrics.h"

namespace granule::remote {
namespace {

std::optional<double> first(const PrometheusText& t, std::initializer_list<std::string_view> names,
                            bool mean = false) {
  for (std::string_view name : names) {
    const std::optional<double> v = mean ? t.mean(name) : t.sum(name);
    if (v) return v;
  }
  return std::nullopt;
}

}  // namespace

const char* metrics_dialect_name(MetricsDialect dialect) {
  switch (dialect) {
    case MetricsDialect::None:
      return "none";
    case MetricsDialect::Vllm:
      return "vLLM";
    case MetricsDialect::Sglang:
      return "SGLang";
    case MetricsDialect::LlamaServer:
      return "llama-server";
    case MetricsDialect::Granule:
      return "Granule";
  }
  return "?";
}

EngineMetrics read_engine_metrics(const PrometheusText& t) {
  EngineMetrics m;
  if (t.has_prefix("vllm:")) {
    m.dialect = MetricsDialect::Vllm;
    m.requests_running = t.sum("vllm:num_requests_running");
    m.requests_waiting = t.sum("vllm:num_requests_waiting");
    m.kv_usage_fraction = first(t, {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"}, true);
    m.prompt_tokens_total = t.sum("vllm:prompt_tokens_total");
    m.generation_tokens_total = t.sum("vllm:generation_tokens_total");
    m.prefix_cache_queries_total = t.sum("vllm:prefix_cache_queries_total");
    m.prefix_cache_hits_total = t.sum("vllm:prefix_cache_hits_total");
    m.prefix_cache_hit_fraction = t.mean("vllm:gpu_prefix_cache_hit_rate");
    m.preemptions_total = t.sum("vllm:num_preemptions_total");
  } else if (t.has_prefix("sglang:")) {
    m.dialect = MetricsDialect::Sglang;
    m.requests_running = t.sum("sglang:num_running_reqs");
    m.requests_waiting = t.sum("sglang:num_queue_reqs");
    m.kv_usage_fraction = t.mean("sglang:token_usage");
    m.prompt_tokens_total = t.sum("sglang:prompt_tokens_total");
    m.generation_tokens_total = t.sum("sglang:generation_tokens_total");
    m.prefix_cache_hit_fraction = t.mean("sglang:cache_hit_rate");
    m.generation_tokens_per_second = t.sum("sglang:gen_throughput");
  } else if (t.has_prefix("llamacpp:")) {
    m.dialect = MetricsDialect::LlamaServer;
    m.requests_running = t.sum("llamacpp:requests_processing");
    m.requests_waiting = t.sum("llamacpp:requests_deferred");
    m.kv_usage_fraction = t.mean("llamacpp:kv_cache_usage_ratio");  // older servers only
    m.prompt_tokens_total = t.sum("llamacpp:prompt_tokens_total");
    m.generation_tokens_total = t.sum("llamacpp:tokens_predicted_total");
    m.prompt_tokens_per_second = t.sum("llamacpp:prompt_tokens_seconds");
    m.generation_tokens_per_second = t.sum("llamacpp:predicted_tokens_seconds");
  } else if (t.has_prefix("granule_")) {
    m.dialect = MetricsDialect::Granule;
    m.requests_running = t.sum("granule_chats_running");
    m.requests_waiting = t.sum("granule_chats_waiting");
    m.kv_used_bytes = t.sum("granule_kv_committed_bytes");
    // Granule's KV is committed on demand, not a fixed pool: bytes, no usage fraction. It
    // counts reused prompt tokens but not the prompt tokens computed, so no hit rate.
    m.prefix_cache_hits_total = t.sum("granule_prompt_tokens_reused_total");
    m.generation_tokens_total = t.sum("granule_server_completion_tokens_total");
    m.prompt_tokens_per_second = t.sum("granule_prompt_tokens_per_second");
    m.generation_tokens_per_second = t.sum("granule_decode_tokens_per_second");
    m.preemptions_total = t.sum("granule_preemptions_total");
    m.decode_steps_total = t.sum("granule_decode_steps_total");
    m.decode_step_sequences_total = t.sum("granule_decode_step_sequences_total");
    m.batched_decode_steps_total = t.sum("granule_batched_decode_steps_total");
  }
  return m;
}

EngineRates engine_rates(const EngineMetrics& before, const EngineMetrics& now, double seconds) {
  EngineRates r;
  auto rate = [&](const std::optional<double>& a,
                  const std::optional<double>& b) -> std::optional<double> {
    // A counter that went down means the server restarted: no rate for this interval.
    if (!a || !b || seconds <= 0 || *b < *a) return std::nullopt;
    return (*b - *a) / seconds;
  };
  r.prompt_tokens_per_second = rate(before.prompt_tokens_total, now.prompt_tokens_total);
  if (!r.prompt_tokens_per_second) r.prompt_tokens_per_second = now.prompt_tokens_per_second;
  r.generation_tokens_per_second =
      rate(before.generation_tokens_total, now.generation_tokens_total);
  if (!r.generation_tokens_per_second)
    r.generation_tokens_per_second = now.generation_tokens_per_second;
  const std::optional<double> queries =
      rate(before.prefix_cache_queries_total, now.prefix_cache_queries_total);
  const std::optional<double> hits =
      rate(before.prefix_cache_hits_total, now.prefix_cache_hits_total);
  if (queries && hits && *queries > 0) {
    r.prefix_cache_hit_fraction = *hits / *queries;
  } else {
    r.prefix_cache_hit_fraction = now.prefix_cache_hit_fraction;
  }
  // Batching: the counters' growth over the interval; without decode steps in it, their
  // totals (a restart, or an idle server).
  if (now.decode_steps_total && now.decode_step_sequences_total) {
    double steps = *now.decode_steps_total;
    double sequences = *now.decode_step_sequences_total;
    double batched = now.batched_decode_steps_total.value_or(0);
    const std::optional<double> d_steps = rate(before.decode_steps_total, now.decode_steps_total);
    const std::optional<double> d_sequences =
        rate(before.decode_step_sequences_total, now.decode_step_sequences_total);
    const std::optional<double> d_batched =
        rate(before.batched_decode_steps_total, now.batched_decode_steps_total);
    if (d_steps && d_sequences && *d_steps > 0) {
      steps = *d_steps;
      sequences = *d_sequences;
      batched = d_batched.value_or(0);
    }
    if (steps > 0) {
      r.mean_decode_batch = sequences / steps;
      if (now.batched_decode_steps_total) r.batched_step_fraction = batched / steps;
    }
  }
  return r;
}

}  // namespace granule::remote
