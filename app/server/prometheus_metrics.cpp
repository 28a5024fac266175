// The Prometheus text exposition format, version 0.0.4: HELP and TYPE lines, then the sample.
#include "prometheus_metrics.h"

#include <cstdio>

namespace granule::server {
namespace {

void metric(std::string& out, const char* name, const char* type, const char* help, double value) {
  char number[64];
  std::snprintf(number, sizeof number, "%.17g", value);
  out += std::string("# HELP ") + name + " " + help + "\n";
  out += std::string("# TYPE ") + name + " " + type + "\n";
  out += std::string(name) + " " + number + "\n";
}

}  // namespace

std::string prometheus_metrics(const TelemetrySnapshot& t, const ServerCounters& server) {
  std::string out;
  metric(out, "granule_decode_tokens_per_second", "gauge",
         "Decode tokens per second over every decode so far.",
         t.throughput.decode_tokens_per_second);
  metric(out, "granule_prompt_tokens_per_second", "gauge",
         "Prompt (prefill) tokens per second over every prefill so far.",
         t.throughput.prompt_tokens_per_second);
  metric(out, "granule_steps_total", "counter", "Engine steps.",
         static_cast<double>(t.throughput.steps));
  // Batching: rate(granule_decode_step_sequences_total) / rate(granule_decode_steps_total) is
  // the mean decode batch; granule_batched_decode_steps_total counts the steps that decoded
  // several requests (windows, API clients) in one forward pass.
  metric(out, "granule_decode_steps_total", "counter",
         "Engine steps that decoded a token for at least one sequence.",
         static_cast<double>(t.throughput.decode_steps));
  metric(out, "granule_decode_step_sequences_total", "counter",
         "Sequences decoded, summed over the decode steps.",
         static_cast<double>(t.throughput.decode_step_sequences));
  metric(out, "granule_batched_decode_steps_total", "counter",
         "Engine steps that decoded two or more sequences together.",
         static_cast<double>(t.throughput.batched_decode_steps));
  metric(out, "granule_chats_running", "gauge", "Sequences holding a slot and their KV.",
         t.scheduler.running);
  metric(out, "granule_chats_waiting", "gauge", "Sequences queued for a slot and KV.",
         t.scheduler.waiting);
  metric(out, "granule_preemptions_total", "counter",
         "Sequences whose KV was freed to be recomputed.",
         static_cast<double>(t.scheduler.preemptions));
  metric(out, "granule_kv_committed_bytes", "gauge", "KV cache bytes committed, all sequences.",
         static_cast<double>(t.kv.committed_bytes));
  metric(out, "granule_kv_reserved_bytes", "gauge", "KV address space reserved, all sequences.",
         static_cast<double>(t.kv.reserved_bytes));
  // KV reuse (prompt caching): a finished request's KV stays as an idle kept entry until a
  // request with the same prompt prefix continues it, or memory or slots are needed.
  const uint64_t kept = t.scheduler.kept_kv_bytes;
  metric(out, "granule_kv_active_bytes", "gauge",
         "KV cache bytes committed to running sequences (committed minus kept).",
         static_cast<double>(t.kv.committed_bytes > kept ? t.kv.committed_bytes - kept : 0));
  metric(out, "granule_kv_kept_bytes", "gauge",
         "KV cache bytes kept in device memory from finished requests, for prompt reuse.",
         static_cast<double>(kept));
  metric(out, "granule_kv_kept_sequences", "gauge",
         "Finished requests whose KV is kept in device memory.", t.scheduler.kept_chats);
  metric(out, "granule_kv_swapped_bytes", "gauge",
         "Host memory holding kept KV copied out of device memory.",
         static_cast<double>(t.scheduler.swapped_kv_bytes));
  metric(out, "granule_kv_swapped_sequences", "gauge",
         "Finished requests whose kept KV is in host memory.", t.scheduler.swapped_chats);
  metric(out, "granule_prompt_tokens_reused_total", "counter",
         "Prompt tokens not computed because their KV was kept (prompt cache hits).",
         static_cast<double>(t.scheduler.prefix_reused_tokens));
  metric(out, "granule_kv_swap_outs_total", "counter", "Kept KV entries copied device-to-host.",
         static_cast<double>(t.scheduler.kv_swap_outs));
  metric(out, "granule_kv_swap_ins_total", "counter", "Kept KV entries copied back host-to-device.",
         static_cast<double>(t.scheduler.kv_swap_ins));
  metric(out, "granule_kv_kept_dropped_total", "counter",
         "Kept KV entries given up for memory or slots.",
         static_cast<double>(t.scheduler.kept_kv_dropped));
  metric(out, "granule_device_budget_bytes", "gauge", "Device memory the engine may use.",
         static_cast<double>(t.device.budget_bytes));
  metric(out, "granule_device_used_bytes", "gauge", "Device memory charged to the budget.",
         static_cast<double>(t.device.used_bytes));
  metric(out, "granule_h2d_streamed_bytes_total", "counter",
         "Weight bytes streamed host-to-device.", static_cast<double>(t.streaming.h2d_bytes));
  metric(out, "granule_layers_streamed", "gauge", "Layers streamed from host memory each pass.",
         t.streaming.layers_streamed);
  // A mixture of experts' placement and routing (only while one is loaded): the hit rate is
  // rate(granule_expert_hits_total) / rate(granule_expert_choices_total), bytes per token
  // rate(granule_expert_streamed_bytes_total) / rate(granule_expert_tokens_total).
  if (t.experts.n_expert > 0) {
    const ExpertTelemetry& x = t.experts;
    metric(out, "granule_experts", "gauge", "Experts of every layer (layers times experts).",
           static_cast<double>(x.n_layer) * x.n_expert);
    metric(out, "granule_experts_resident", "gauge", "Experts held in device memory.",
           static_cast<double>(x.resident_count()));
    metric(out, "granule_expert_choices_total", "counter",
           "Routing choices (token, expert) made by the routers.",
           static_cast<double>(x.hits + x.misses));
    metric(out, "granule_expert_hits_total", "counter",
           "Routing choices served from experts in device memory.", static_cast<double>(x.hits));
    metric(out, "granule_expert_streamed_bytes_total", "counter",
           "Expert bytes read host-to-device for choices of experts in host memory.",
           static_cast<double>(x.bytes_streamed));
    metric(out, "granule_expert_host_choices_total", "counter",
           "Routing choices of experts in host memory that the CPU computed.",
           static_cast<double>(x.host_computed));
    metric(out, "granule_expert_host_bytes_total", "counter",
           "Expert bytes the CPU read to compute choices of experts in host memory.",
           static_cast<double>(x.bytes_host));
    metric(out, "granule_expert_tokens_total", "counter",
           "Tokens routed through the experts (prompt and generated).",
           static_cast<double>(x.tokens));
    metric(out, "granule_expert_promotions_total", "counter",
           "Experts moved into device memory by re-plans.", static_cast<double>(x.promotions));
    metric(out, "granule_expert_demotions_total", "counter",
           "Experts moved out of device memory by re-plans.", static_cast<double>(x.demotions));
  }
  metric(out, "granule_graph_captures_total", "counter", "CUDA graph captures.",
         static_cast<double>(t.graphs.captures));
  metric(out, "granule_graph_recaptures_total", "counter",
         "CUDA graph captures of a bucket captured before.",
         static_cast<double>(t.graphs.recaptures));
  metric(out, "granule_server_requests_active", "gauge", "Completions in flight.",
         static_cast<double>(server.requests_active));
  metric(out, "granule_server_requests_total", "counter", "Completions accepted.",
         static_cast<double>(server.requests_total));
  metric(out, "granule_server_requests_rejected_total", "counter",
         "Completion requests refused before reaching the engine.",
         static_cast<double>(server.requests_rejected));
  metric(out, "granule_server_completion_tokens_total", "counter",
         "Tokens generated for completions (streamed or not).",
         static_cast<double>(server.completion_tokens));
  return out;
}

}  // namespace granule::server
