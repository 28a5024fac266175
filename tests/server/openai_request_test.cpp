// The OpenAI request parsing, response JSON and /metrics text, without a server.
#include "openai_request.h"

#include <gtest/gtest.h>

#include <string>

#include "prometheus_metrics.h"

namespace granule::server {
namespace {

using nlohmann::json;

ParsedRequest chat(const std::string& body, const RequestLimits& limits = {}) {
  return parse_request(Endpoint::ChatCompletions, body, limits);
}

// The ApiError parse_request throws for a body, or a failed expectation when it throws none.
ApiError chat_error(const std::string& body, Endpoint endpoint = Endpoint::ChatCompletions) {
  try {
    parse_request(endpoint, body, {});
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body;
  return ApiError(0, "");
}

TEST(OpenAiRequest, ChatMessagesWithRolesAndTextParts) {
  const ParsedRequest r = chat(R"({"model":"x","messages":[
      {"role":"developer","content":"Be brief."},
      {"role":"user","content":[{"type":"text","text":"Hello, "},{"type":"text","text":"there"}]},
      {"role":"assistant","content":"Hi."},
      {"role":"user","content":"Bye"}]})");
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");  // developer is the newer name of system
  EXPECT_EQ(r.messages[0].content, "Be brief.");
  EXPECT_EQ(r.messages[1].role, "user");
  EXPECT_EQ(r.messages[1].content, "Hello, there");
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.seeded);
}

TEST(OpenAiRequest, DefaultsAreOpenAisWithTheServersMaxTokens) {
  RequestLimits limits;
  limits.default_max_tokens = 77;
  const ParsedRequest r = chat(R"({"messages":[{"role":"user","content":"hi"}]})", limits);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 1.0f);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.0f);  // OpenAI has none
  EXPECT_EQ(r.sampling.max_tokens, 77);
  EXPECT_TRUE(r.sampling.stop_strings.empty());
}

TEST(OpenAiRequest, SamplingFieldsReachTheEngineParams) {
  const ParsedRequest r = chat(R"({"messages":[{"role":"user","content":"hi"}],
      "max_tokens":10,"max_completion_tokens":12,"temperature":0,"top_p":0.5,"seed":-3,
      "presence_penalty":1.5,"frequency_penalty":-0.5,"top_k":5,"min_p":0.1,"repeat_penalty":1.1,
      "stop":["\n\n","END"],"stream":true,"stream_options":{"include_usage":true},"n":1})");
  EXPECT_EQ(r.sampling.max_tokens, 12);  // max_completion_tokens wins over max_tokens
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_TRUE(r.seeded);
  EXPECT_EQ(r.sampling.seed, static_cast<uint64_t>(int64_t{-3}));
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 1.5f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, -0.5f);
  EXPECT_EQ(r.sampling.top_k, 5);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.1f);
  EXPECT_EQ(r.sampling.stop_strings, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(
      chat(R"({"messages":[{"role":"user","content":"hi"}],"stop":"X"})").sampling.stop_strings,
      std::vector<std::string>{"X"});
}

// The case: every sampling field's accepted values are the engine's range for it
// (kSamplingRanges, which the CLI and the window use too): both ends are taken, a step past
// either is a 400 naming the field.
TEST(OpenAiRequest, SamplingRangesAreTheEngines) {
  const auto body = [](const std::string& field, const json& value) {
    json b = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
    b[field] = value;
    return b.dump();
  };
  const auto check = [&](const std::string& field, const auto& range, auto step) {
    EXPECT_NO_THROW(chat(body(field, range.min))) << field;
    EXPECT_NO_THROW(chat(body(field, range.max))) << field;
    EXPECT_EQ(chat_error(body(field, range.min - step)).param, field);
    EXPECT_EQ(chat_error(body(field, range.max + step)).param, field);
  };
  const SamplingRanges& r = kSamplingRanges;
  check("temperature", r.temperature, 0.01);
  check("top_p", r.top_p, 0.01);
  check("min_p", r.min_p, 0.01);
  check("repeat_penalty", r.repetition_penalty, 0.001);
  check("presence_penalty", r.presence_penalty, 0.01);
  check("frequency_penalty", r.frequency_penalty, 0.01);
  check("top_k", r.top_k, 1);
  check("max_tokens", r.max_tokens, 1);
  EXPECT_EQ(chat(body("temperature", r.temperature.max)).sampling.temperature,
            static_cast<float>(r.temperature.max));
  EXPECT_EQ(RequestLimits{}.max_tokens_cap, r.max_tokens.max);
  EXPECT_EQ(RequestLimits{}.default_max_tokens, r.max_tokens.default_value);
}

TEST(OpenAiRequest, WrongTypesAndRangesAre400sNamingTheField) {
  const std::string m = R"("messages":[{"role":"user","content":"hi"}])";
  const struct {
    std::string body;
    std::string param;
  } cases[] = {
      {"{\"messages\": [", ""},  // malformed JSON
      {"[1,2]", ""},
      {R"({"messages":"hi"})", "messages"},
      {R"({"messages":[]})", "messages"},
      {R"({})", "messages"},
      {R"({"messages":[{"role":"wizard","content":"hi"}]})", "messages[0].role"},
      {R"({"messages":[{"content":"hi"}]})", "messages[0].role"},
      {R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", "messages[0].content"},
      {"{" + m + R"(,"temperature":"hot"})", "temperature"},
      {"{" + m + R"(,"temperature":2.5})", "temperature"},
      {"{" + m + R"(,"top_p":-0.1})", "top_p"},
      {"{" + m + R"(,"max_tokens":0})", "max_tokens"},
      {"{" + m + R"(,"max_tokens":2.5})", "max_tokens"},
      {"{" + m + R"(,"max_tokens":"5"})", "max_tokens"},
      {"{" + m + R"(,"max_completion_tokens":99999999999})", "max_completion_tokens"},
      {"{" + m + R"(,"stop":5})", "stop"},
      {"{" + m + R"(,"stop":["a",1]})", "stop"},
      {"{" + m + R"(,"seed":"1"})", "seed"},
      {"{" + m + R"(,"stream":"yes"})", "stream"},
      {"{" + m + R"(,"stream_options":{"include_usage":true}})", "stream_options"},
      {"{" + m + R"(,"n":2})", "n"},
      {"{" + m + R"(,"model":3})", "model"},
      {"{" + m + R"(,"presence_penalty":3})", "presence_penalty"},
      {"{" + m + R"(,"logprobs":1})", "logprobs"},
      {"{" + m + R"(,"top_logprobs":3})", "top_logprobs"},
      {"{" + m + R"(,"logprobs":true,"top_logprobs":21})", "top_logprobs"},
  };
  for (const auto& c : cases) {
    const ApiError e = chat_error(c.body);
    EXPECT_EQ(e.status, 400) << c.body;
    EXPECT_EQ(e.param, c.param) << c.body;
    EXPECT_EQ(e.type, "invalid_request_error") << c.body;
    EXPECT_FALSE(std::string(e.what()).empty()) << c.body;
  }
}

TEST(OpenAiRequest, CompletionsTakeOnePrompt) {
  EXPECT_EQ(parse_request(Endpoint::Completions, R"({"prompt":"Once"})", {}).prompt, "Once");
  EXPECT_EQ(parse_request(Endpoint::Completions, R"({"prompt":["Once"]})", {}).prompt, "Once");
  EXPECT_EQ(chat_error(R"({"prompt":["a","b"]})", Endpoint::Completions).param, "prompt");
  EXPECT_EQ(chat_error(R"({"prompt":7})", Endpoint::Completions).param, "prompt");
  // Token ids as OpenAI's array of integers: used as is.
  const ParsedRequest ids = parse_request(Endpoint::Completions, R"({"prompt":[1,15,7]})", {});
  EXPECT_TRUE(ids.prompt.empty());
  EXPECT_EQ(ids.prompt_token_ids, (std::vector<int32_t>{1, 15, 7}));
  EXPECT_EQ(chat_error(R"({"prompt":[1,-2]})", Endpoint::Completions).param, "prompt");
  EXPECT_EQ(chat_error(R"({"prompt":[1,2.5]})", Endpoint::Completions).param, "prompt");
  EXPECT_EQ(chat_error(R"({"prompt":[1,"a"]})", Endpoint::Completions).param, "prompt");
  // Log-probabilities: chat's logprobs + top_logprobs, completions' legacy integer.
  const std::string chat_body = R"({"messages":[{"role":"user","content":"hi"}]})";
  EXPECT_EQ(parse_request(Endpoint::ChatCompletions, chat_body, {}).top_logprobs, -1);
  EXPECT_EQ(parse_request(Endpoint::ChatCompletions,
                          R"({"messages":[{"role":"user","content":"hi"}],"logprobs":true})", {})
                .top_logprobs,
            0);
  EXPECT_EQ(parse_request(Endpoint::ChatCompletions,
                          R"({"messages":[{"role":"user","content":"hi"}],"logprobs":true,)"
                          R"("top_logprobs":4})",
                          {})
                .top_logprobs,
            4);
  EXPECT_EQ(parse_request(Endpoint::Completions, R"({"prompt":"a","logprobs":3})", {}).top_logprobs,
            3);
  EXPECT_EQ(chat_error(R"({"prompt":"a","logprobs":6})", Endpoint::Completions).param, "logprobs");
  // llama-server's ignore_eos extension.
  EXPECT_TRUE(parse_request(Endpoint::Completions, R"({"prompt":"a","ignore_eos":true})", {})
                  .sampling.ignore_eos);
  EXPECT_FALSE(parse_request(Endpoint::Completions, R"({"prompt":"a"})", {}).sampling.ignore_eos);
  EXPECT_EQ(chat_error(R"({"prompt":"a","ignore_eos":1})", Endpoint::Completions).param,
            "ignore_eos");
  EXPECT_EQ(chat_error(R"({"messages":[]})", Endpoint::Completions).param, "prompt");
}

// reasoning_effort and chat_template_kwargs.enable_thinking reach the template's variables;
// any other template variable, and bad values, are 400s naming the field.
TEST(OpenAiRequest, ReasoningEffortAndTemplateKwargs) {
  const std::string m = R"("messages":[{"role":"user","content":"hi"}])";
  EXPECT_FALSE(chat("{" + m + "}").chat_options.enable_thinking.has_value());
  EXPECT_EQ(chat("{" + m + "}").chat_options.reasoning_effort, "");
  const ParsedRequest r = chat(
      "{" + m + R"(,"reasoning_effort":"high","chat_template_kwargs":{"enable_thinking":false}})");
  EXPECT_EQ(r.chat_options.reasoning_effort, "high");
  ASSERT_TRUE(r.chat_options.enable_thinking.has_value());
  EXPECT_FALSE(*r.chat_options.enable_thinking);
  EXPECT_EQ(chat("{" + m + R"(,"chat_template_kwargs":{"reasoning_effort":"low"}})")
                .chat_options.reasoning_effort,
            "low");
  const struct {
    std::string body;
    std::string param;
  } cases[] = {
      {"{" + m + R"(,"reasoning_effort":"extreme"})", "reasoning_effort"},
      {"{" + m + R"(,"reasoning_effort":3})", "reasoning_effort"},
      {"{" + m + R"(,"chat_template_kwargs":[1]})", "chat_template_kwargs"},
      {"{" + m + R"(,"chat_template_kwargs":{"enable_thinking":"no"}})",
       "chat_template_kwargs.enable_thinking"},
      {"{" + m + R"(,"chat_template_kwargs":{"custom_tools":[]}})",
       "chat_template_kwargs.custom_tools"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.body);
    const ApiError e = chat_error(c.body);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, c.param);
  }
}

TEST(OpenAiResponse, ReasoningContentBesideTheAnswer) {
  const ResponseHeader h{"chatcmpl-1", 1700000000, "qwen3"};
  const json whole =
      completion_json(Endpoint::ChatCompletions, h, "4.", "stop", Usage{10, 5}, "2+2 is 4.");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "4.");
  EXPECT_EQ(whole["choices"][0]["message"]["reasoning_content"], "2+2 is 4.");
  const json plain = completion_json(Endpoint::ChatCompletions, h, "4.", "stop", Usage{10, 5});
  EXPECT_FALSE(plain["choices"][0]["message"].contains("reasoning_content"));
  const json thinking = chunk_json(Endpoint::ChatCompletions, h, "", "", false, "Hmm");
  EXPECT_EQ(thinking["choices"][0]["delta"]["reasoning_content"], "Hmm");
  EXPECT_FALSE(thinking["choices"][0]["delta"].contains("content"));
}

TEST(OpenAiRequest, ErrorJsonHasOpenAisShape) {
  const json e =
      error_json(ApiError(413, "too big", "invalid_request_error", "", "request_too_large"));
  EXPECT_EQ(e["error"]["message"], "too big");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(e["error"]["param"].is_null());
  EXPECT_EQ(e["error"]["code"], "request_too_large");
}

TEST(OpenAiResponse, FinishReasonsAreOpenAisNames) {
  EXPECT_EQ(openai_finish_reason(FinishReason::Eos), "stop");
  EXPECT_EQ(openai_finish_reason(FinishReason::StopString), "stop");
  EXPECT_EQ(openai_finish_reason(FinishReason::MaxTokens), "length");
  EXPECT_EQ(openai_finish_reason(FinishReason::Cancelled), "");
  EXPECT_EQ(openai_finish_reason(FinishReason::Error), "");
}

TEST(OpenAiResponse, WholeResponsesAndChunks) {
  const ResponseHeader h{"chatcmpl-1", 1700000000, "smol"};
  const Usage usage{10, 5};
  const json whole = completion_json(Endpoint::ChatCompletions, h, "Paris.", "stop", usage);
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["model"], "smol");
  EXPECT_EQ(whole["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(whole["choices"][0]["message"]["content"], "Paris.");
  EXPECT_EQ(whole["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(whole["usage"]["total_tokens"], 15);

  const json text = completion_json(Endpoint::Completions, h, " Paris", "length", usage);
  EXPECT_EQ(text["object"], "text_completion");
  EXPECT_EQ(text["choices"][0]["text"], " Paris");

  const json first = chunk_json(Endpoint::ChatCompletions, h, "", "", /*role=*/true);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  const json piece = chunk_json(Endpoint::ChatCompletions, h, "Par", "");
  EXPECT_EQ(piece["choices"][0]["delta"]["content"], "Par");
  EXPECT_FALSE(piece["choices"][0]["delta"].contains("role"));
  const json last = chunk_json(Endpoint::ChatCompletions, h, "", "length");
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  const json u = usage_chunk_json(Endpoint::ChatCompletions, h, usage);
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["completion_tokens"], 5);

  const std::string event = sse_event(json{{"a", 1}});
  EXPECT_EQ(event, "data: {\"a\":1}\n\n");
  // Half a UTF-8 character is replaced, not thrown on.
  EXPECT_NO_THROW(sse_event(json{{"t", std::string("\xe2\x82")}}));
}

TEST(Timings, LlamaServerFieldsFromTheServersClock) {
  Usage u;
  u.prompt_tokens = 100;
  u.cached_tokens = 60;
  u.completion_tokens = 11;
  u.prompt_ms = 25.0;
  u.predicted_ms = 200.0;
  const json t = timings_json(u);
  EXPECT_EQ(t["prompt_n"], 40);
  EXPECT_EQ(t["cache_n"], 60);
  EXPECT_DOUBLE_EQ(t["prompt_ms"].get<double>(), 25.0);
  EXPECT_EQ(t["predicted_n"], 11);
  EXPECT_DOUBLE_EQ(t["predicted_per_second"].get<double>(), 50.0);  // 10 intervals in 0.2 s
  // A finished response carries them beside usage once the server timed the request.
  EXPECT_TRUE(completion_json(Endpoint::Completions, {}, "x", "length", u).contains("timings"));
  EXPECT_FALSE(
      completion_json(Endpoint::Completions, {}, "x", "length", Usage{}).contains("timings"));
  EXPECT_EQ(usage_json(u)["prompt_tokens_details"]["cached_tokens"], 60);
}

TEST(PrometheusMetrics, EveryMetricHasHelpTypeAndValue) {
  TelemetrySnapshot t;
  t.throughput.decode_tokens_per_second = 12.5;
  t.scheduler.running = 3;
  t.scheduler.waiting = 2;
  t.kv.committed_bytes = 4194304;
  t.scheduler.kept_chats = 1;
  t.scheduler.kept_kv_bytes = 2097152;
  t.scheduler.prefix_reused_tokens = 300;
  t.streaming.h2d_bytes = 1000;
  t.graphs.recaptures = 7;
  const std::string text = prometheus_metrics(t, ServerCounters{1, 9, 4, 777});
  for (const std::string line :
       {"granule_decode_tokens_per_second 12.5\n", "granule_chats_running 3\n",
        "granule_chats_waiting 2\n", "granule_kv_committed_bytes 4194304\n",
        "granule_h2d_streamed_bytes_total 1000\n", "granule_graph_recaptures_total 7\n",
        "granule_server_requests_active 1\n", "granule_server_requests_total 9\n",
        "granule_server_requests_rejected_total 4\n",
        "granule_server_completion_tokens_total 777\n", "# TYPE granule_kv_committed_bytes gauge\n",
        "# TYPE granule_graph_recaptures_total counter\n",
        // Kept KV (prompt caching) apart from the running requests' KV.
        "granule_kv_active_bytes 2097152\n", "granule_kv_kept_bytes 2097152\n",
        "granule_kv_kept_sequences 1\n", "granule_prompt_tokens_reused_total 300\n",
        "# TYPE granule_prompt_tokens_reused_total counter\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line;
  }
}

TEST(PrometheusMetrics, ExpertMetricsOnlyForAMixtureOfExperts) {
  TelemetrySnapshot t;
  EXPECT_EQ(prometheus_metrics(t, ServerCounters{}).find("granule_expert"), std::string::npos);
  t.experts.n_layer = 2;
  t.experts.n_expert = 4;
  t.experts.resident = {1, 1, 0, 0, 1, 0, 0, 1};
  t.experts.hits = 90;
  t.experts.misses = 10;
  t.experts.bytes_streamed = 5000;
  t.experts.tokens = 25;
  t.experts.promotions = 3;
  const std::string text = prometheus_metrics(t, ServerCounters{});
  for (const std::string line :
       {"granule_experts 8\n", "granule_experts_resident 4\n", "granule_expert_choices_total 100\n",
        "granule_expert_hits_total 90\n", "granule_expert_streamed_bytes_total 5000\n",
        "granule_expert_tokens_total 25\n", "granule_expert_promotions_total 3\n",
        "granule_expert_demotions_total 0\n", "# TYPE granule_experts_resident gauge\n",
        "# TYPE granule_expert_hits_total counter\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line;
  }
}

}  // namespace
}  // namespace granule::server

namespace granule::server {
namespace {
TEST(OpenAiResponses, LogprobsInBothShapes) {
  TokenLogprobs a{{7, "He", -0.25f}, {{7, "He", -0.25f}, {9, "A", -1.5f}}};
  TokenLogprobs b{{3, "llo", -0.5f}, {{3, "llo", -0.5f}, {4, "\xe2", -2.0f}}};
  const auto chat = logprobs_json(Endpoint::ChatCompletions, {a, b});
  ASSERT_EQ(chat["content"].size(), 2u);
  EXPECT_EQ(chat["content"][0]["token"], "He");
  EXPECT_FLOAT_EQ(chat["content"][1]["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(chat["content"][0]["bytes"], nlohmann::json::array({72, 101}));
  EXPECT_EQ(chat["content"][1]["top_logprobs"][1]["bytes"], nlohmann::json::array({226}));
  EXPECT_EQ(chat["content"][0]["top_logprobs"].size(), 2u);
  const auto legacy = logprobs_json(Endpoint::Completions, {a, b}, 10);
  EXPECT_EQ(legacy["tokens"], nlohmann::json::array({"He", "llo"}));
  EXPECT_EQ(legacy["text_offset"], nlohmann::json::array({10, 12}));
  EXPECT_FLOAT_EQ(legacy["top_logprobs"][0]["A"].get<float>(), -1.5f);
  EXPECT_FLOAT_EQ(legacy["token_logprobs"][1].get<float>(), -0.5f);
}
}  // namespace
}  // namespace granule::server
