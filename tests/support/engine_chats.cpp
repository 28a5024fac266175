// Output sinks, chat requests, run_to_idle and the KV left, for the engine tests.
#include "support/engine_chats.h"

#include <gtest/gtest.h>

#include <utility>

namespace granule::test {

namespace {

// `select(id)` gives the Output a callback records into.
template <typename Select>
TokenSink sink_for(Select select) {
  TokenSink sink;
  sink.on_token = [select](SequenceId id, const std::string& text, int32_t token) {
    Output& out = select(id);
    if (token != kNoToken) out.tokens.push_back(token);
    out.text += text;
  };
  sink.on_finish = [select](SequenceId id, FinishReason reason, const std::string& error) {
    Output& out = select(id);
    out.reason = reason;
    out.error = error;
    ++out.finishes;
  };
  sink.on_prompt = [select](SequenceId id, const PromptInfo& info) {
    Output& out = select(id);
    out.prompt_info = info;
    ++out.prompts;
  };
  return sink;
}

}  // namespace

EngineOptions cpu_engine_options(int64_t context_length, int32_t chats) {
  EngineOptions o;
  o.device = DeviceKind::Cpu;
  o.cpu_threads = 2;
  o.cpu_exact_numerics = true;  // the reference numerics the tests compare
  o.context_length = context_length;
  o.max_sequences = chats;
  return o;
}

TokenSink sink_into(Output& out) {
  return sink_for([&out](SequenceId) -> Output& { return out; });
}

TokenSink sink_into(Outputs& outputs) {
  return sink_for([&outputs](SequenceId id) -> Output& { return outputs[id]; });
}

Request chat_request(const Chat& chat) {
  Request r;
  r.prompt_tokens = chat.prompt;
  r.sampling = chat.sampling;
  r.sampling.max_tokens = chat.max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}

Request chat_request(const Chat& chat, Output& out) {
  Request r = chat_request(chat);
  r.sink = sink_into(out);
  return r;
}

Request chat_request(const Chat& chat, Outputs& outputs) {
  Request r = chat_request(chat);
  r.sink = sink_into(outputs);
  return r;
}

std::vector<std::vector<int32_t>> tokens_alone(const std::filesystem::path& model,
                                               const std::vector<Chat>& chats,
                                               const EngineOptions& options) {
  auto engine = Engine::open(model, options);
  std::vector<std::vector<int32_t>> tokens;
  for (const Chat& c : chats) {
    Output out;
    engine->submit(chat_request(c, out));
    run_to_idle(*engine);
    tokens.push_back(out.tokens);
  }
  return tokens;
}

uint64_t kv_committed(const Engine& engine) {
  return engine.telemetry().device.ledger_bytes(MemoryCategory::KvCommitted);
}

uint64_t kv_committed_after_dropping_kept(Engine& engine) {
  EXPECT_EQ(kv_committed(engine), engine.telemetry().scheduler.kept_kv_bytes);
  engine.drop_kept_kv();
  return kv_committed(engine);
}

void run_to_idle(Engine& engine, int max_steps) {
  for (int i = 0; i < max_steps; ++i) {
    bool more = false;
    ASSERT_NO_THROW(more = engine.step());
    if (!more) break;
  }
  ASSERT_TRUE(engine.idle());
}

}  // namespace granule::test
