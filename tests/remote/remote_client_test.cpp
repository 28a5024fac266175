// The remote client's pure parts: the SSE reader, the Prometheus text reader, each engine's
// metrics read from fixtures (tests/remote/data), fault classes and the request body.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "remote/engine_metrics.h"
#include "remote/openai_client.h"
#include "remote/prometheus_text.h"
#include "remote/sse_stream.h"

namespace granule::remote {
namespace {

std::string fixture(const std::string& name) {
  std::ifstream in(std::string(GRANULE_SOURCE_DIR) + "/tests/remote/data/" + name);
  EXPECT_TRUE(in) << name;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<SseEvent> events_of(const std::string& stream, size_t chunk) {
  std::vector<SseEvent> events;
  SseStream sse([&](const SseEvent& e) { events.push_back(e); });
  for (size_t i = 0; i < stream.size(); i += chunk)
    sse.feed(std::string_view(stream).substr(i, chunk));
  return events;
}

TEST(SseStream, SameEventsForEveryChunkingAndLineEnding) {
  const std::string lf =
      ": keep-alive\n\ndata: {\"a\":1}\n\nevent: error\ndata: first\ndata: "
      "second\n\ndata:[DONE]\n\n";
  std::string crlf;
  for (char c : lf) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  for (const std::string& stream : {lf, crlf}) {
    for (size_t chunk : {1, 2, 3, 7, 1000}) {
      const std::vector<SseEvent> e = events_of(stream, chunk);
      ASSERT_EQ(e.size(), 3u) << "chunk " << chunk;
      EXPECT_EQ(e[0].data, "{\"a\":1}");
      EXPECT_EQ(e[1].event, "error");
      EXPECT_EQ(e[1].data, "first\nsecond");
      EXPECT_EQ(e[2].data, "[DONE]");
    }
  }
}

TEST(SseStream, AnEventCutBeforeItsBlankLineIsNotDispatched) {
  std::vector<SseEvent> events;
  SseStream sse([&](const SseEvent& e) { events.push_back(e); });
  sse.feed("data: {\"whole\":1}\n\ndata: {\"cut");
  EXPECT_EQ(events.size(), 1u);
  EXPECT_TRUE(sse.has_partial_event());
}

TEST(PrometheusText, LabelsEscapesSpecialValuesAndBadLines) {
  const PrometheusText t = parse_prometheus_text(
      "# HELP x y\n# TYPE a gauge\na{l=\"q\\\"uo\\\\te\",m=\"2\"} 1.5 1700000000\n"
      "b +Inf\nc NaN\nd{l=\"unterminated} 3\n  e   -2e3  \nnot a sample\n");
  ASSERT_EQ(t.samples.size(), 4u);
  EXPECT_EQ(t.samples[0].name, "a");
  EXPECT_EQ(t.samples[0].labels.at("l"), "q\"uo\\te");
  EXPECT_EQ(t.samples[0].value, 1.5);
  EXPECT_TRUE(std::isinf(t.samples[1].value));
  EXPECT_TRUE(std::isnan(t.samples[2].value));
  EXPECT_EQ(*t.sum("e"), -2000);
  EXPECT_EQ(t.skipped_lines, 2);
  EXPECT_FALSE(t.sum("absent").has_value());
}

TEST(EngineMetrics, VllmV1SumsEnginesAndAveragesUsage) {
  const EngineMetrics m = read_engine_metrics(fixture("vllm_metrics.txt"));
  EXPECT_EQ(m.dialect, MetricsDialect::Vllm);
  EXPECT_EQ(*m.requests_running, 5);
  EXPECT_EQ(*m.requests_waiting, 1);
  EXPECT_DOUBLE_EQ(*m.kv_usage_fraction, 0.375);
  EXPECT_EQ(*m.prompt_tokens_total, 20000);
  EXPECT_EQ(*m.generation_tokens_total, 4000);
  EXPECT_EQ(*m.prefix_cache_queries_total, 20000);
  EXPECT_EQ(*m.prefix_cache_hits_total, 5000);
  EXPECT_EQ(*m.preemptions_total, 4);
  EXPECT_FALSE(m.kv_used_bytes.has_value());
  // The histogram's _sum/_count/_bucket series are not mistaken for the counters.
  EXPECT_FALSE(m.generation_tokens_per_second.has_value());
}

TEST(EngineMetrics, VllmV0GaugesAreTheFallbacks) {
  const EngineMetrics m = read_engine_metrics(fixture("vllm_v0_metrics.txt"));
  EXPECT_EQ(m.dialect, MetricsDialect::Vllm);
  EXPECT_DOUBLE_EQ(*m.kv_usage_fraction, 0.125);
  EXPECT_DOUBLE_EQ(*m.prefix_cache_hit_fraction, 0.75);
  EXPECT_FALSE(m.prefix_cache_queries_total.has_value());
  EXPECT_DOUBLE_EQ(*engine_rates(m, m, 1.0).prefix_cache_hit_fraction, 0.75);
}

TEST(EngineMetrics, Sglang) {
  const EngineMetrics m = read_engine_metrics(fixture("sglang_metrics.txt"));
  EXPECT_EQ(m.dialect, MetricsDialect::Sglang);
  EXPECT_EQ(*m.requests_running, 6);
  EXPECT_EQ(*m.requests_waiting, 2);
  EXPECT_DOUBLE_EQ(*m.kv_usage_fraction, 0.4);
  EXPECT_DOUBLE_EQ(*m.prefix_cache_hit_fraction, 0.3125);
  EXPECT_DOUBLE_EQ(*m.generation_tokens_per_second, 512.5);
  EXPECT_EQ(*m.prompt_tokens_total, 450000);
  EXPECT_FALSE(m.preemptions_total.has_value());
}

TEST(EngineMetrics, LlamaServerHasNoKvUsageInThisRelease) {
  const EngineMetrics m = read_engine_metrics(fixture("llamacpp_metrics.txt"));
  EXPECT_EQ(m.dialect, MetricsDialect::LlamaServer);
  EXPECT_EQ(*m.requests_running, 1);
  EXPECT_EQ(*m.requests_waiting, 0);  // exposed and zero: shown as 0, not unavailable
  EXPECT_EQ(*m.prompt_tokens_total, 96);
  EXPECT_EQ(*m.generation_tokens_total, 64);
  EXPECT_EQ(*m.generation_tokens_per_second, 32);
  EXPECT_FALSE(m.kv_usage_fraction.has_value());  // unavailable, not 0
  EXPECT_FALSE(m.prefix_cache_hit_fraction.has_value());
}

TEST(EngineMetrics, GranuleReportsBytesNotAFraction) {
  const EngineMetrics m = read_engine_metrics(fixture("granule_metrics.txt"));
  EXPECT_EQ(m.dialect, MetricsDialect::Granule);
  EXPECT_EQ(*m.requests_running, 0);
  EXPECT_GT(*m.kv_used_bytes, 0);
  EXPECT_EQ(*m.generation_tokens_total, 20);
  EXPECT_GT(*m.generation_tokens_per_second, 0);
  EXPECT_FALSE(m.kv_usage_fraction.has_value());
  EXPECT_TRUE(m.prefix_cache_hits_total.has_value());
  EXPECT_FALSE(m.prefix_cache_queries_total.has_value());
}

// The batching counters: mean batch and share of batched steps over the interval, over the
// server's life when it decoded nothing in the interval; unavailable for other servers.
TEST(EngineMetrics, GranuleDecodeBatching) {
  const EngineMetrics m = read_engine_metrics(fixture("granule_metrics.txt"));
  EXPECT_EQ(*m.decode_steps_total, 14);
  EXPECT_EQ(*m.decode_step_sequences_total, 20);
  EXPECT_EQ(*m.batched_decode_steps_total, 6);
  EngineRates idle = engine_rates(m, m, 1.0);  // no steps in the interval: the totals
  EXPECT_DOUBLE_EQ(*idle.mean_decode_batch, 20.0 / 14.0);
  EXPECT_DOUBLE_EQ(*idle.batched_step_fraction, 6.0 / 14.0);
  EngineMetrics later = m;
  *later.decode_steps_total += 10;           // 10 steps,
  *later.decode_step_sequences_total += 30;  // three sequences in each,
  *later.batched_decode_steps_total += 10;   // all of them batched
  const EngineRates busy = engine_rates(m, later, 1.0);
  EXPECT_DOUBLE_EQ(*busy.mean_decode_batch, 3.0);
  EXPECT_DOUBLE_EQ(*busy.batched_step_fraction, 1.0);
  const EngineMetrics vllm = read_engine_metrics(fixture("vllm_metrics.txt"));
  EXPECT_FALSE(engine_rates(vllm, vllm, 1.0).mean_decode_batch.has_value());
  EXPECT_FALSE(engine_rates(vllm, vllm, 1.0).batched_step_fraction.has_value());
}

TEST(EngineMetrics, NoKnownSeriesIsNoDialect) {
  const EngineMetrics m = read_engine_metrics("process_cpu_seconds_total 12\n");
  EXPECT_EQ(m.dialect, MetricsDialect::None);
  EXPECT_FALSE(m.requests_running.has_value());
}

TEST(EngineRates, FromCountersAndARestart) {
  EngineMetrics a, b;
  a.prompt_tokens_total = 1000;
  b.prompt_tokens_total = 3000;
  a.generation_tokens_total = 100;
  b.generation_tokens_total = 600;
  a.prefix_cache_queries_total = 1000;
  b.prefix_cache_queries_total = 2000;
  a.prefix_cache_hits_total = 0;
  b.prefix_cache_hits_total = 250;
  EngineRates r = engine_rates(a, b, 2.0);
  EXPECT_DOUBLE_EQ(*r.prompt_tokens_per_second, 1000);
  EXPECT_DOUBLE_EQ(*r.generation_tokens_per_second, 250);
  EXPECT_DOUBLE_EQ(*r.prefix_cache_hit_fraction, 0.25);
  // A counter that went down: the server restarted; no rate rather than a negative one.
  r = engine_rates(b, a, 2.0);
  EXPECT_FALSE(r.prompt_tokens_per_second.has_value());
  EXPECT_FALSE(r.prefix_cache_hit_fraction.has_value());
}

TEST(Fault, ClassesAndMessages) {
  Fault f = http_fault(429, R"({"error":{"message":"slow down","type":"x"}})", 3);
  EXPECT_EQ(f.kind, FaultKind::RateLimited);
  EXPECT_EQ(f.message, "429 Too Many Requests: rate limited (retry after 3 s): slow down");
  EXPECT_TRUE(f.retryable());
  f = http_fault(401, R"({"error":"Unauthorized"})", std::nullopt);
  EXPECT_EQ(f.kind, FaultKind::Unauthorized);
  EXPECT_FALSE(f.retryable());
  EXPECT_EQ(f.message, "401 Unauthorized: the endpoint refused the API key: Unauthorized");
  f = http_fault(503, "upstream\nbusy", std::nullopt);
  EXPECT_EQ(f.kind, FaultKind::ServerError);
  EXPECT_EQ(f.message, "503 Service Unavailable: upstream busy");
  f = http_fault(404, R"({"detail":"The model `x` does not exist."})", std::nullopt);
  EXPECT_EQ(f.kind, FaultKind::Rejected);
  EXPECT_EQ(f.message, "404 Not Found: The model `x` does not exist.");
}

TEST(ChatRequestBody, ExtensionsFollowTheServerAndMessagesStayUnchanged) {
  ChatRequest r;
  r.model = "m";
  r.messages = {{"system", "  be brief\n"}, {"user", "hi\r\n\t"}, {"assistant", "héllo"}};
  r.sampling.temperature = 0.5f;
  r.sampling.top_k = 40;
  r.sampling.min_p = 0.05f;
  r.sampling.repeat_penalty = 1.1f;
  r.sampling.seed = 7;
  r.sampling.max_tokens = 16;
  r.server = ServerKind::Unknown;
  RequestBody b = chat_request_body(r);
  nlohmann::json j = nlohmann::json::parse(b.json);
  EXPECT_EQ(j["messages"][1]["content"], "hi\r\n\t");
  EXPECT_EQ(j["messages"][0]["content"], "  be brief\n");
  EXPECT_EQ(j["seed"], 7);
  EXPECT_EQ(j["max_tokens"], 16);
  EXPECT_TRUE(j["stream"]);
  EXPECT_TRUE(j["stream_options"]["include_usage"]);
  EXPECT_FALSE(j.contains("top_k"));
  EXPECT_EQ(b.not_sent.size(), 3u);
  r.server = ServerKind::Vllm;
  j = nlohmann::json::parse(chat_request_body(r).json);
  EXPECT_EQ(j["top_k"], 40);
  EXPECT_TRUE(j.contains("repetition_penalty"));
  EXPECT_FALSE(j.contains("repeat_penalty"));
  r.server = ServerKind::LlamaServer;
  b = chat_request_body(r);
  j = nlohmann::json::parse(b.json);
  EXPECT_TRUE(j.contains("repeat_penalty"));
  EXPECT_TRUE(b.not_sent.empty());
}

// Two parallel calls whose arguments arrive in fragments, interleaved by index (the OpenAI
// stream format, as vLLM and llama-server send it), after reasoning_content: the same calls,
// reasoning and finish for every split of the bytes.
TEST(ChatStreamReader, ToolCallsReassembledFromSplitDeltas) {
  const std::string stream = fixture("tool_calls_stream.sse");
  for (size_t chunk : {1, 2, 5, 13, 64, 100000}) {
    std::string reasoning;
    ChatStreamReader reader(
        {[](std::string_view) {}, [&](std::string_view text) { reasoning += text; }});
    for (size_t i = 0; i < stream.size(); i += chunk)
      reader.feed(std::string_view(stream).substr(i, chunk));
    reader.finish();
    EXPECT_TRUE(reader.done());
    EXPECT_FALSE(reader.fault());
    const ChatResult& r = reader.result();
    EXPECT_EQ(reasoning, "The user wants two cities.") << "chunk " << chunk;
    EXPECT_EQ(r.reasoning, reasoning);
    EXPECT_EQ(r.content, "");
    EXPECT_EQ(r.finish_reason, "tool_calls");
    ASSERT_EQ(r.tool_calls.size(), 2u) << "chunk " << chunk;
    EXPECT_EQ(r.tool_calls[0].id, "call_abc");
    EXPECT_EQ(r.tool_calls[0].name, "weather");
    EXPECT_EQ(r.tool_calls[0].arguments, R"({"city": "Paris"})");
    EXPECT_EQ(r.tool_calls[1].id, "call_def");
    EXPECT_EQ(r.tool_calls[1].arguments, R"({"city": "Oslo"})");
    for (const RemoteToolCall& c : r.tool_calls)
      EXPECT_TRUE(nlohmann::json::parse(c.arguments).is_object());
    ASSERT_TRUE(r.usage.has_value());
    EXPECT_EQ(r.usage->completion_tokens, 31);
  }
}

// Granule's server sends each call whole in one chunk; a server may send no index, no id,
// or an arguments object rather than its text.
TEST(ChatStreamReader, WholeCallsWithoutIndexOrId) {
  ChatStreamReader reader({});
  reader.feed(
      "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"id\":\"call_1_7_0\","
      "\"type\":\"function\",\"function\":{\"name\":\"add\",\"arguments\":\"{\\\"a\\\": 2}\"}}]},"
      "\"finish_reason\":null}]}\n\n"
      "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"function\":{\"name\":"
      "\"now\",\"arguments\":{\"zone\":\"UTC\"}}},{\"function\":{\"name\":\"ping\"}}]},"
      "\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n");
  reader.finish();
  const ChatResult& r = reader.result();
  ASSERT_EQ(r.tool_calls.size(), 3u);
  EXPECT_EQ(r.tool_calls[0].id, "call_1_7_0");
  EXPECT_EQ(r.tool_calls[0].arguments, R"({"a": 2})");
  EXPECT_EQ(r.tool_calls[1].name, "now");
  EXPECT_EQ(r.tool_calls[1].arguments, R"({"zone":"UTC"})");
  EXPECT_EQ(r.tool_calls[1].id, "");  // none given: the caller names it
  EXPECT_EQ(r.tool_calls[2].arguments, "{}");
}

// A stream that reports an error mid-way has no calls: a call cut short is not one.
TEST(ChatStreamReader, AFaultInTheStreamLeavesNoCalls) {
  ChatStreamReader reader({});
  reader.feed(
      "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c\","
      "\"function\":{\"name\":\"add\",\"arguments\":\"{\\\"a\"}}]}}]}\n\n"
      "data: {\"error\":{\"message\":\"engine died\"}}\n\n");
  reader.finish();
  EXPECT_EQ(reader.fault().kind, FaultKind::ServerError);
  EXPECT_NE(reader.fault().message.find("engine died"), std::string::npos);
  EXPECT_TRUE(reader.result().tool_calls.empty());
}

// Tools, the tool choice, JSON output and the reasoning setting in the body; an assistant
// message's calls and a tool message's id as OpenAI writes them.
TEST(ChatRequestBody, ToolsToolMessagesJsonOutputAndReasoning) {
  ChatRequest r;
  r.model = "m";
  r.server = ServerKind::Granule;
  r.messages = {{"user", "weather in Paris?"},
                {"assistant", "",
                 R"([{"id":"call_1","type":"function","function":{"name":"weather",)"
                 R"("arguments":"{\"city\":\"Paris\"}"}}])"},
                {"tool", "21 °C", "", "call_1", "weather"}};
  r.tools_json =
      R"([{"type":"function","function":{"name":"weather","parameters":{"type":"object",)"
      R"("properties":{"zcity":{"type":"string"},"acountry":{"type":"string"}}}}}])";
  r.tool_choice = "weather";
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(chat_request_body(r).json);
  EXPECT_TRUE(j["messages"][1]["content"].is_null());
  EXPECT_EQ(j["messages"][1]["tool_calls"][0]["function"]["name"], "weather");
  EXPECT_EQ(j["messages"][2]["tool_call_id"], "call_1");
  EXPECT_EQ(j["messages"][2]["name"], "weather");
  EXPECT_EQ(j["messages"][2]["content"], "21 °C");
  EXPECT_FALSE(j["messages"][0].contains("tool_calls"));
  EXPECT_EQ(j["tool_choice"]["function"]["name"], "weather");
  EXPECT_EQ(j["tool_choice"]["type"], "function");
  EXPECT_EQ(j["parallel_tool_calls"], false);  // a forced call is one call
  // The schema's properties keep their order.
  EXPECT_EQ(j["tools"][0]["function"]["parameters"]["properties"].begin().key(), "zcity");
  EXPECT_FALSE(j.contains("response_format"));
  // llama-server takes the choice as a string only: the named function alone, required.
  r.tools_json =
      R"([{"type":"function","function":{"name":"clock","parameters":{"type":"object"}}},)"
      R"({"type":"function","function":{"name":"weather","parameters":{"type":"object"}}}])";
  r.server = ServerKind::LlamaServer;
  j = nlohmann::ordered_json::parse(chat_request_body(r).json);
  EXPECT_EQ(j["tool_choice"], "required");
  ASSERT_EQ(j["tools"].size(), 1u);
  EXPECT_EQ(j["tools"][0]["function"]["name"], "weather");
  EXPECT_EQ(j["parallel_tool_calls"], false);
  r.server = ServerKind::Granule;
  j = nlohmann::ordered_json::parse(chat_request_body(r).json);
  EXPECT_EQ(j["tools"].size(), 2u);
  r.tool_choice = "required";
  j = nlohmann::ordered_json::parse(chat_request_body(r).json);
  EXPECT_EQ(j["tool_choice"], "required");
  r.tool_choice = "auto";
  j = nlohmann::ordered_json::parse(chat_request_body(r).json);
  EXPECT_FALSE(j.contains("parallel_tool_calls"));
  r.tools_json.clear();
  r.response_format = ResponseFormat::JsonSchema;
  r.json_schema =
      R"({"type":"object","properties":{"b":{"type":"string"},"a":{"type":"boolean"}}})";
  r.enable_thinking = false;
  r.reasoning_effort = "low";
  RequestBody b = chat_request_body(r);
  j = nlohmann::ordered_json::parse(b.json);
  EXPECT_FALSE(j.contains("tools"));
  EXPECT_FALSE(j.contains("tool_choice"));
  EXPECT_EQ(j["response_format"]["type"], "json_schema");
  EXPECT_EQ(j["response_format"]["json_schema"]["schema"]["properties"].begin().key(), "b");
  EXPECT_TRUE(j["response_format"]["json_schema"]["strict"]);
  EXPECT_EQ(j["chat_template_kwargs"]["enable_thinking"], false);
  EXPECT_EQ(j["reasoning_effort"], "low");
  EXPECT_TRUE(b.not_sent.empty());
  r.response_format = ResponseFormat::JsonObject;
  r.server = ServerKind::Unknown;
  b = chat_request_body(r);
  j = nlohmann::ordered_json::parse(b.json);
  EXPECT_EQ(j["response_format"]["type"], "json_object");
  EXPECT_FALSE(j.contains("chat_template_kwargs"));  // not known to be taken: said, not sent
  ASSERT_EQ(b.not_sent.size(), 1u);
  EXPECT_NE(b.not_sent[0].find("chat_template_kwargs"), std::string::npos);
}

TEST(OpenAiClient, BaseUrlWithOrWithoutV1) {
  EXPECT_EQ(OpenAiClient({"http://h:8000/"}).api_base(), "http://h:8000/v1");
  EXPECT_EQ(OpenAiClient({"http://h:8000/v1/"}).api_base(), "http://h:8000/v1");
  EXPECT_EQ(OpenAiClient({"http://h:8000/v1"}).server_root(), "http://h:8000");
}

TEST(OpenAiClient, UnreachableIsAFaultNotAnException) {
  Endpoint e;
  e.base_url = "http://127.0.0.1:1";  // nothing listens on port 1
  const ModelList models = OpenAiClient(e).list_models();
  EXPECT_EQ(models.fault.kind, FaultKind::Unreachable);
  EXPECT_NE(models.fault.message.find("cannot reach http://127.0.0.1:1/v1/models"),
            std::string::npos);
}

}  // namespace
}  // namespace granule::remote
