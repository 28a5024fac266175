// granule-bench turns: a chat of N turns opened twice, with KV reuse across turns and without;
// each turn submits the conversation so far (prompt and reply tokens) plus a new random user
// message and measures the time from submit() to its first token.
#include "turns_bench.h"

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench_chats.h"
#include "bench_model.h"
#include "granule/engine.h"
#include "granule/error.h"

namespace granule {
namespace {

using Clock = std::chrono::steady_clock;

struct Turn {
  int64_t prompt_tokens = 0;
  double first_token_seconds = 0;
};

// One engine (kv_reuse as given), the whole chat; the same seed gives the same user messages,
// and greedy replies with the same weights give the same history in both runs.
std::vector<Turn> run_chat(const std::filesystem::path& path, const TurnsBenchOptions& o,
                           bool reuse) {
  EngineOptions options;
  options.device = device_kind(o.device);
  options.max_sequences = 2;
  options.context_length =
      o.first_prompt_tokens + (o.turns - 1) * o.message_tokens + int64_t{o.turns} * o.reply_tokens;
  options.kv_reuse = reuse;
  const std::unique_ptr<Engine> engine = Engine::open(path, options);
  if (engine->options().context_length < options.context_length)
    throw UsageError("the chat's " + std::to_string(options.context_length) +
                     " tokens exceed the model's context");
  std::mt19937_64 random(o.seed);
  std::vector<TokenId> history;
  std::vector<Turn> turns;
  for (int32_t t = 0; t < o.turns; ++t) {
    const std::vector<TokenId> message = random_prompt(
        t == 0 ? o.first_prompt_tokens : o.message_tokens, engine->config().n_vocab, random);
    history.insert(history.end(), message.begin(), message.end());
    Request r;
    r.prompt_tokens = history;
    r.session = "turns";
    r.sampling = SamplingParams::greedy();
    r.sampling.max_tokens = o.reply_tokens;
    r.sampling.ignore_eos = true;
    std::vector<TokenId> reply;
    bool first = true, finished = false;
    std::string error;
    Clock::time_point first_token;
    r.sink.on_token = [&](SequenceId, const std::string&, int32_t token) {
      if (token == kNoToken) return;
      if (first) first_token = Clock::now();
      first = false;
      reply.push_back(token);
    };
    r.sink.on_finish = [&](SequenceId, FinishReason reason, const std::string& why) {
      finished = true;
      if (reason == FinishReason::Error) error = why;
    };
    const auto start = Clock::now();
    engine->submit(std::move(r));
    while (!finished) engine->step();
    if (!error.empty()) throw Error("turn " + std::to_string(t + 1) + ": " + error);
    turns.push_back({static_cast<int64_t>(history.size()),
                     std::chrono::duration<double>(first_token - start).count()});
    history.insert(history.end(), reply.begin(), reply.end());
  }
  return turns;
}

}  // namespace

void add_turns_bench_options(CLI::App& command, TurnsBenchOptions& o) {
  command.add_option("-m,--model", o.model_path, "GGUF model file");
  command.add_option("--synthetic", o.synthetic,
                     "synthetic model PRESET:TYPE, e.g. qwen35-9b:Q4_0");
  command.add_option("-t,--turns", o.turns, "turns of the chat")->check(CLI::Range(1, 64));
  command.add_option("-p,--prompt", o.first_prompt_tokens, "the first turn's prompt tokens");
  command.add_option("--message", o.message_tokens, "each later turn's new message tokens");
  command.add_option("-g,--reply", o.reply_tokens, "reply tokens per turn (EOS ignored)");
  command.add_option("--device", o.device, "auto, cpu or cuda");
  command.add_option("--seed", o.seed, "message seed");
  command.add_flag("--json", o.json, "print JSON instead of the table");
}

int run_turns_benchmark(const TurnsBenchOptions& o) {
  try {
    const std::filesystem::path path = bench_model_path(o.model_path, o.synthetic);
    // A short chat first (cuBLAS, graphs, first touches), then the two measured runs.
    TurnsBenchOptions warm = o;
    warm.turns = 2;
    warm.first_prompt_tokens = std::min<int64_t>(o.first_prompt_tokens, 512);
    warm.reply_tokens = 4;
    run_chat(path, warm, true);
    const std::vector<Turn> kept = run_chat(path, o, true);
    const std::vector<Turn> recomputed = run_chat(path, o, false);
    if (o.json) {
      nlohmann::json j;
      j["model"] = o.synthetic.empty() ? path.filename().string() : "synthetic " + o.synthetic;
      for (size_t t = 0; t < kept.size(); ++t)
        j["turns"].push_back({{"turn", t + 1},
                              {"prompt_tokens", kept[t].prompt_tokens},
                              {"ttft_ms_reuse", kept[t].first_token_seconds * 1e3},
                              {"ttft_ms_recompute", recomputed[t].first_token_seconds * 1e3}});
      std::cout << j.dump(2) << "\n";
      return 0;
    }
    std::printf("time to first token per turn (%s), KV reuse (and state snapshot) against none\n",
                o.synthetic.empty() ? path.filename().string().c_str() : o.synthetic.c_str());
    std::printf("| turn | prompt tokens | TTFT reuse ms | TTFT recompute ms |\n");
    std::printf("| ---: | ---: | ---: | ---: |\n");
    for (size_t t = 0; t < kept.size(); ++t)
      std::printf("| %zu | %lld | %.1f | %.1f |\n", t + 1,
                  static_cast<long long>(kept[t].prompt_tokens), kept[t].first_token_seconds * 1e3,
                  recomputed[t].first_token_seconds * 1e3);
    return 0;
  } catch (const Error& e) {
    std::cerr << "granule-bench turns: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace granule
