// granule-bench chats: opens the model with the Engine, then for each chat count N submits N
// greedy chats at once (fixed prompt and answer lengths, seeded random prompts), steps the
// engine until idle and prints prefill and decode throughput, peak committed KV and
// preemptions, measured from the steps themselves and the engine's telemetry.
#include "chats_bench.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench_chats.h"
#include "bench_model.h"
#include "byte_size.h"
#include "granule/engine.h"
#include "granule/error.h"
#include "granule/log.h"
#include "granule/telemetry_json.h"

namespace granule {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kMiB = 1024.0 * 1024.0;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct ChatsResult {
  int32_t chats = 0;
  int64_t prompt_tokens = 0;   // all chats
  double prefill_seconds = 0;  // from submitting to the last chat's first token
  int64_t decode_tokens = 0;   // produced in the decode window
  double decode_seconds = 0;   // the decode window's step time
  int64_t decode_steps = 0;
  bool full_batch_window = true;  // the window held every chat (else: every step after prefill)
  uint64_t peak_kv_bytes = 0;     // committed KV, the most after any step of this run
  uint64_t preemptions = 0;
  int32_t errors = 0;
  std::string first_error;
  // KV mapping, every step of the run: granules mapped, those the step had to create (the
  // pool was empty), and the time spent mapping and unmapping inside the steps.
  int64_t steps = 0;
  uint64_t granules_mapped = 0, granules_created_in_step = 0, granules_ahead = 0;
  double mapping_us = 0, max_mapping_us = 0, refill_us = 0, ahead_us = 0;
  // Structured output (--json-schema), summed over the decode window's steps: the host time
  // the token masks took, the constrained sequences, and those whose token the backend's
  // sampler drew under its mask.
  double mask_us = 0;
  int64_t constrained_sequences = 0, device_masked_sequences = 0;

  double prefill_tokens_per_second() const {
    return prefill_seconds > 0 ? static_cast<double>(prompt_tokens) / prefill_seconds : 0;
  }
  double decode_tokens_per_second() const {
    return decode_seconds > 0 ? static_cast<double>(decode_tokens) / decode_seconds : 0;
  }
};

// Submits `n` chats together and steps the engine until idle. The decode window is the steps
// that start with every chat past its prompt and none finished: all n chats decode in them.
ChatsResult run_chats(Engine& engine, int32_t n, const ChatsBenchOptions& o,
                      const Constraint& constraint, TelemetryRecorder* telemetry,
                      std::ostream* steps_out = nullptr) {
  ChatsResult result;
  result.chats = n;
  result.prompt_tokens = o.prompt_tokens * n;
  ChatsProgress progress;
  const uint64_t preemptions_before = engine.telemetry().scheduler.preemptions;
  std::mt19937_64 random(o.seed);
  const auto start = Clock::now();
  submit_random_chats(engine, n, o.prompt_tokens, o.generate_tokens, random, progress, constraint);

  struct Window {
    int64_t tokens = 0, steps = 0;
    double seconds = 0;
    double mask_us = 0;
    int64_t constrained = 0, device_masked = 0;
  } full_batch, after_prefill;
  bool more = true;
  while (more) {
    const bool all_started = progress.started == n;
    const bool none_finished = progress.finished == 0;
    const int64_t generated_before = progress.generated;
    const auto step_start = Clock::now();
    more = engine.step();
    const auto step_end = Clock::now();
    const int64_t produced = progress.generated - generated_before;
    if (!all_started && progress.started == n)
      result.prefill_seconds = seconds_between(start, step_end);
    const TelemetrySnapshot t = engine.telemetry();
    if (all_started && more) {
      for (Window* w : {&after_prefill, none_finished ? &full_batch : nullptr}) {
        if (!w) continue;
        w->tokens += produced;
        w->seconds += seconds_between(step_start, step_end);
        ++w->steps;
        w->mask_us += t.throughput.last_mask_us;
        w->constrained += t.throughput.constrained_sequences;
        w->device_masked += t.throughput.device_masked_sequences;
      }
    }
    if (telemetry != nullptr) telemetry->record(t);  // at most 10 frames a second
    result.peak_kv_bytes =
        std::max(result.peak_kv_bytes, t.device.ledger_bytes(MemoryCategory::KvCommitted));
    if (steps_out != nullptr) {
      *steps_out << n << ',' << result.steps << ',' << seconds_between(step_start, step_end) * 1e3
                 << ',' << produced << ',' << progress.started << ',' << t.kv.last_mapping_us << ','
                 << t.kv.last_ahead_us << ',' << t.kv.last_refill_us << ','
                 << t.throughput.last_plan_us << ',' << t.throughput.last_launch_us << ','
                 << t.throughput.last_overlap_us << ',' << t.throughput.last_wait_us << ','
                 << t.throughput.last_results_us << ',' << t.graphs.captures << ','
                 << t.throughput.last_mask_us << ',' << t.throughput.device_masked_sequences
                 << '\n';
    }
    ++result.steps;
    result.granules_mapped += t.kv.last_granules_mapped;
    result.granules_created_in_step += t.kv.last_granules_created;
    result.mapping_us += t.kv.last_mapping_us;
    result.max_mapping_us = std::max(result.max_mapping_us, t.kv.last_mapping_us);
    result.refill_us += t.kv.last_refill_us;
    result.granules_ahead += t.kv.last_ahead_granules;
    result.ahead_us += t.kv.last_ahead_us;
  }
  const Window& window = full_batch.steps > 0 ? full_batch : after_prefill;
  result.full_batch_window = full_batch.steps > 0;
  result.decode_tokens = window.tokens;
  result.decode_seconds = window.seconds;
  result.decode_steps = window.steps;
  result.mask_us = window.mask_us;
  result.constrained_sequences = window.constrained;
  result.device_masked_sequences = window.device_masked;
  result.preemptions = engine.telemetry().scheduler.preemptions - preemptions_before;
  result.errors = progress.errors;
  result.first_error = progress.first_error;
  return result;
}

void print_table(const ChatsBenchOptions& o, const Engine& engine, const std::string& model_name,
                 const std::vector<ChatsResult>& results) {
  const ModelConfig& c = engine.config();
  std::printf("chats benchmark on %s\n", engine.device_name().c_str());
  std::printf("model: %s (%lld layers, %lld wide, %lld/%lld heads, vocab %lld)\n",
              model_name.c_str(), static_cast<long long>(c.n_layer),
              static_cast<long long>(c.n_embd), static_cast<long long>(c.n_head),
              static_cast<long long>(c.n_head_kv), static_cast<long long>(c.n_vocab));
  std::printf(
      "each chat: %lld random prompt tokens, %d greedy tokens (EOS ignored); prefill chunk %lld; "
      "budget %s\n\n",
      static_cast<long long>(o.prompt_tokens), o.generate_tokens,
      static_cast<long long>(o.prefill_chunk_tokens),
      o.budget_mib ? (std::to_string(o.budget_mib) + " MiB").c_str() : "the engine's default");
  std::printf("| %5s | %12s | %12s | %12s | %8s | %11s | %11s | %6s |\n", "chats", "prefill t/s",
              "decode t/s", "per chat t/s", "steps", "peak KV MiB", "preemptions", "errors");
  std::printf(
      "|-------|--------------|--------------|--------------|----------|-------------|-------------"
      "|"
      "--------|\n");
  bool partial_window = false;
  for (const ChatsResult& r : results) {
    partial_window = partial_window || !r.full_batch_window;
    std::printf("| %5d | %12.1f | %11.1f%s | %12.2f | %8lld | %11.1f | %11llu | %6d |\n", r.chats,
                r.prefill_tokens_per_second(), r.decode_tokens_per_second(),
                r.full_batch_window ? " " : "*",
                r.decode_tokens_per_second() / std::max(r.chats, 1),
                static_cast<long long>(r.decode_steps), static_cast<double>(r.peak_kv_bytes) / kMiB,
                static_cast<unsigned long long>(r.preemptions), r.errors);
  }
  std::printf(
      "\nprefill t/s: all chats' prompt tokens over the time from submitting them to the last\n"
      "  chat's first token (early chats decode meanwhile: decode-first scheduling);\n"
      "decode t/s: tokens over the time of the steps in which every chat decodes (all prompts\n"
      "  in, none finished) - 'steps' counts them; per chat t/s = decode t/s / chats;\n"
      "peak KV MiB: committed KV, the most after any step of the run; preemptions: chats whose\n"
      "  KV was freed for others and recomputed; errors: chats the budget could not hold alone.\n");
  if (partial_window) {
    std::printf("*: no step had every chat decoding; measured over every step after the prompts\n");
  }
  std::printf("\nKV mapping (pool of %llu pre-created granules%s):\n",
              static_cast<unsigned long long>(engine.telemetry().kv.pool_target_granules),
              o.kv_pool_granules < 0 ? ", sized by the engine" : "");
  std::printf("| %5s | %6s | %14s | %14s | %16s | %16s | %10s | %14s | %14s |\n", "chats", "steps",
              "mapped in step", "mapped ahead", "created in step", "map us/step mean", "map us max",
              "ahead us/step", "refill us/step");
  std::printf(
      "|-------|--------|----------------|----------------|------------------|------------------|"
      "------------|----------------|----------------|\n");
  for (const ChatsResult& r : results) {
    const double steps = static_cast<double>(std::max<int64_t>(r.steps, 1));
    std::printf("| %5d | %6lld | %14llu | %14llu | %16llu | %16.1f | %10.1f | %14.1f | %14.1f |\n",
                r.chats, static_cast<long long>(r.steps),
                static_cast<unsigned long long>(r.granules_mapped),
                static_cast<unsigned long long>(r.granules_ahead),
                static_cast<unsigned long long>(r.granules_created_in_step), r.mapping_us / steps,
                r.max_mapping_us, r.ahead_us / steps, r.refill_us / steps);
  }
  std::printf(
      "mapped in step: granules a step mapped before it could run; mapped ahead: granules mapped\n"
      "  for the next step while one ran (on a GPU, under the step); created in step: granules a\n"
      "  step had to create because the pool was empty; map us: mapping and unmapping inside\n"
      "  the steps (what delays them); ahead us, refill us: mapping ahead and creating pool\n"
      "  granules while a step runs.\n");
  if (!o.json_schema.empty()) {
    std::printf("\nstructured output: every chat constrained by %s\n", o.json_schema.c_str());
    std::printf("| %5s | %8s | %17s | %22s | %24s |\n", "chats", "steps", "mask us/step mean",
                "constrained seqs/step", "device-masked seqs/step");
    std::printf(
        "|-------|----------|-------------------|------------------------|-------------------------"
        "-|\n");
    for (const ChatsResult& r : results) {
      const double steps = static_cast<double>(std::max<int64_t>(r.decode_steps, 1));
      std::printf("| %5d | %8lld | %17.1f | %22.2f | %24.2f |\n", r.chats,
                  static_cast<long long>(r.decode_steps), r.mask_us / steps,
                  static_cast<double>(r.constrained_sequences) / steps,
                  static_cast<double>(r.device_masked_sequences) / steps);
    }
    std::printf(
        "mask us: host time computing the step's token masks (xgrammar), done while the device\n"
        "  runs the step's forward pass; device-masked: sequences whose token the GPU's sampler\n"
        "  drew under its mask (the rest of the constrained ones: logits to the host). Over the\n"
        "  decode window's steps; compare decode t/s with a run without --json-schema.\n");
  }
  for (const ChatsResult& r : results) {
    if (r.errors > 0) std::printf("%d chats: first error: %s\n", r.chats, r.first_error.c_str());
  }
}

void print_json(const ChatsBenchOptions& o, const Engine& engine, const std::string& model_name,
                const std::vector<ChatsResult>& results) {
  nlohmann::json j;
  j["device"] = engine.device_name();
  j["model"] = model_name;
  j["prompt_tokens_per_chat"] = o.prompt_tokens;
  j["generate_tokens_per_chat"] = o.generate_tokens;
  j["prefill_chunk_tokens"] = o.prefill_chunk_tokens;
  j["budget_mib"] = o.budget_mib;
  j["json_schema"] = o.json_schema;
  j["results"] = nlohmann::json::array();
  for (const ChatsResult& r : results) {
    j["results"].push_back(
        {{"chats", r.chats},
         {"prefill_tokens_per_second", r.prefill_tokens_per_second()},
         {"prefill_seconds", r.prefill_seconds},
         {"decode_tokens_per_second", r.decode_tokens_per_second()},
         {"decode_tokens_per_second_per_chat", r.decode_tokens_per_second() / std::max(r.chats, 1)},
         {"decode_tokens", r.decode_tokens},
         {"decode_steps", r.decode_steps},
         {"decode_window_full_batch", r.full_batch_window},
         {"peak_kv_committed_bytes", r.peak_kv_bytes},
         {"preemptions", r.preemptions},
         {"errors", r.errors},
         {"steps", r.steps},
         {"granules_mapped", r.granules_mapped},
         {"granules_mapped_ahead", r.granules_ahead},
         {"mapping_ahead_us_per_step",
          r.ahead_us / static_cast<double>(std::max<int64_t>(r.steps, 1))},
         {"granules_created_in_steps", r.granules_created_in_step},
         {"mapping_us_per_step", r.mapping_us / static_cast<double>(std::max<int64_t>(r.steps, 1))},
         {"mapping_us_max", r.max_mapping_us},
         {"pool_refill_us_per_step",
          r.refill_us / static_cast<double>(std::max<int64_t>(r.steps, 1))},
         {"mask_us_per_step",
          r.mask_us / static_cast<double>(std::max<int64_t>(r.decode_steps, 1))},
         {"constrained_sequences_per_step",
          static_cast<double>(r.constrained_sequences) /
              static_cast<double>(std::max<int64_t>(r.decode_steps, 1))},
         {"device_masked_sequences_per_step",
          static_cast<double>(r.device_masked_sequences) /
              static_cast<double>(std::max<int64_t>(r.decode_steps, 1))}});
  }
  std::cout << j.dump(2) << "\n";
}

}  // namespace

void add_chats_bench_options(CLI::App& command, ChatsBenchOptions& o) {
  command.add_option("-m,--model", o.model_path, "GGUF model file");
  command.add_option("--synthetic", o.synthetic,
                     "synthetic model PRESET[:TYPE], e.g. smollm2-135m:Q4_1, llama3-8b:Q4_0");
  command.add_option("-n,--chats", o.chats, "numbers of concurrent chats, one run each")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096));
  command.add_option("-p,--prompt", o.prompt_tokens, "prompt tokens per chat")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  command.add_option("-g,--generate", o.generate_tokens, "generated tokens per chat")
      ->check(CLI::Range(1, 1 << 20));
  command.add_option("--device", o.device, "auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  command
      .add_option("--prefill-chunk", o.prefill_chunk_tokens, "prompt tokens per step, all chats")
      ->check(CLI::PositiveNumber);
  command.add_option("--budget-mib", o.budget_mib,
                     "memory budget in MiB (0 = the engine's default)");
  command.add_option("--vram-budget", o.vram_budget,
                     "memory budget as a size (6GiB, 6144MiB, 6.5GB; a bare number is MiB)");
  command.add_option("--threads", o.cpu_threads, "CPU backend threads (0 = all cores)");
  command.add_option("--seed", o.seed, "prompt seed");
  command
      .add_option("--kv-pool", o.kv_pool_granules,
                  "KV granules created ahead of need (-1 = sized by the engine, 0 = off)")
      ->check(CLI::Range(int64_t{-1}, int64_t{1} << 20));
  command.add_flag("!--no-map-ahead", o.kv_map_ahead,
                   "map each step's KV before it runs instead of while the one before runs");
  command.add_option("--telemetry-out", o.telemetry_out,
                     "record the engine's telemetry to FILE as JSON lines");
  command.add_option("--steps-out", o.steps_out,
                     "write one CSV line per step to FILE (chats, step, ms, tokens produced, "
                     "chats started, mapping us, ahead us, refill us, then the host phases: plan, "
                     "launch, overlap, wait and results us; decode graphs captured so far; token "
                     "mask us and device-masked sequences)");
  command
      .add_option("--json-schema", o.json_schema,
                  "constrain every chat by the JSON Schema in FILE (structured output): the "
                  "table adds the token masks' cost per step")
      ->check(CLI::ExistingFile);
  command.add_flag("--json", o.json, "print JSON instead of the table");
}

int run_chats_benchmark(const ChatsBenchOptions& o) {
  try {
    if (o.chats.empty()) throw UsageError("give at least one number of chats");
    const std::filesystem::path path = bench_model_path(o.model_path, o.synthetic);
    const std::string model_name =
        o.synthetic.empty() ? path.filename().string() : "synthetic " + o.synthetic;
    std::unique_ptr<TelemetryRecorder> telemetry;
    if (!o.telemetry_out.empty()) telemetry = std::make_unique<TelemetryRecorder>(o.telemetry_out);
    EngineOptions options;
    options.device = device_kind(o.device);
    options.max_sequences = *std::max_element(o.chats.begin(), o.chats.end());
    options.context_length = o.prompt_tokens + o.generate_tokens;
    options.prefill_chunk_tokens = o.prefill_chunk_tokens;
    options.vram_budget_bytes =
        o.vram_budget.empty() ? o.budget_mib << 20 : cli::parse_byte_size(o.vram_budget);
    options.cpu_threads = o.cpu_threads;
    options.kv_pool_granules = o.kv_pool_granules;
    options.kv_map_ahead = o.kv_map_ahead;
    // Every run measures chats computed from scratch: no KV kept from the run before.
    options.kv_reuse = false;
    Constraint constraint;
    if (!o.json_schema.empty()) {
      std::ifstream file(o.json_schema);
      std::ostringstream text;
      text << file.rdbuf();
      if (!file) throw UsageError("cannot read " + o.json_schema);
      constraint = Constraint::json_schema(text.str());
    }
    const std::unique_ptr<Engine> engine = Engine::open(path, options);
    if (engine->options().context_length < options.context_length) {
      throw UsageError("prompt + generated tokens (" + std::to_string(options.context_length) +
                       ") exceed the model's context of " +
                       std::to_string(engine->options().context_length));
    }
    // One short chat first, so one-time costs (first touches, library handles) stay out of
    // the table. Its prompt is a whole prefill chunk when the runs' prompts are that long:
    // a chunk of many rows takes another path than a short prompt (on CUDA the cuBLAS GEMMs,
    // whose library loads at their first use, and the flash-attention prefill).
    ChatsBenchOptions warm_up = o;
    warm_up.prompt_tokens =
        std::min<int64_t>(o.prompt_tokens, engine->options().prefill_chunk_tokens);
    warm_up.generate_tokens = std::min(o.generate_tokens, 4);
    run_chats(*engine, 1, warm_up, constraint, telemetry.get());
    // Then every measured number of chats once with short prompts, so the decode step of
    // that batch is captured as a CUDA graph (a one-time 20-30 ms for an 8B model) before its
    // run rather than inside its decode window.
    // Enough tokens that all of them decode together in some step even when their prompts
    // are admitted over several steps.
    ChatsBenchOptions warm_batch = o;
    warm_batch.prompt_tokens = std::min<int64_t>(o.prompt_tokens, 8);
    warm_batch.generate_tokens = std::min(o.generate_tokens, 16);
    for (int32_t n : o.chats)
      if (n > 1) run_chats(*engine, n, warm_batch, constraint, telemetry.get());

    std::vector<ChatsResult> results;
    std::ofstream steps_file;
    if (!o.steps_out.empty()) {
      steps_file.open(o.steps_out);
      if (!steps_file) throw UsageError("cannot write " + o.steps_out);
      steps_file << "chats,step,ms,produced,started,mapping_us,ahead_us,refill_us,"
                    "plan_us,launch_us,overlap_us,wait_us,results_us,graph_captures,mask_us,"
                    "device_masked\n";
    }
    for (int32_t n : o.chats)
      results.push_back(run_chats(*engine, n, o, constraint, telemetry.get(),
                                  steps_file.is_open() ? &steps_file : nullptr));
    if (telemetry) {
      telemetry->record_now(engine->telemetry());  // the final frame
      telemetry->close();
    }
    if (o.json) {
      print_json(o, *engine, model_name, results);
    } else {
      print_table(o, *engine, model_name, results);
    }
    return 0;
  } catch (const Error& e) {
    std::cerr << "granule-bench chats: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace granule
