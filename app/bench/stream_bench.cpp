// granule-bench stream: for each budget (a percentage of the model's weight bytes, plus the
// workspace and KV reserve the engine needs) opens the model with the Engine and measures
// batch-1 decode, batched decode and a long prompt's prefill through the public API, with
// the placement, the PCIe bound and the graph counters read from Engine::telemetry().
#include "stream_bench.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench_chats.h"
#include "bench_model.h"
#include "granule/engine.h"
#include "granule/error.h"
#include "granule/log.h"
#include "granule/telemetry_json.h"

namespace granule {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr const char* kDefaultModel = "llama3-8b:Q4_0";
// The CPU plans no KV reserve (its budget is host memory); there the bench adds the KV of
// its largest test plus one host granule (2 MiB) per chat for the KV space's rounding.
constexpr uint64_t kHostGranuleBytes = 2ull << 20;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One test's shape: `chats` chats submitted together, each `prompt` random tokens long,
// generating `generate` greedy tokens with EOS ignored.
struct Shape {
  std::string test;  // "tg64", "decode", "pp512"
  int32_t chats = 1;
  int64_t prompt = 0;
  int32_t generate = 0;
  bool measure_prompt = false;  // else decode
};

struct Measured {
  int64_t tokens = 0;
  double seconds = 0;
  int64_t steps = 0;
  int32_t errors = 0;
  std::string first_error;
  double tokens_per_second() const {
    return seconds > 0 ? static_cast<double>(tokens) / seconds : 0;
  }
};

// Steps the engine until the shape's chats end. Decode: the tokens and time of the steps that
// start with every chat past its prompt and none finished (all of them decode). Prompt:
// every prompt token over the steps until the last chat has its first token.
Measured run_shape(Engine& engine, const Shape& shape, std::mt19937_64& random,
                   TelemetryRecorder* telemetry) {
  ChatsProgress progress;
  submit_random_chats(engine, shape.chats, shape.prompt, shape.generate, random, progress);
  Measured m;
  bool more = true;
  while (more) {
    const bool all_started = progress.started == shape.chats;
    const bool none_finished = progress.finished == 0;
    const int64_t generated_before = progress.generated;
    const auto step_start = Clock::now();
    more = engine.step();
    const double step_seconds = seconds_between(step_start, Clock::now());
    if (telemetry != nullptr && telemetry->due()) telemetry->record(engine.telemetry());
    if (shape.measure_prompt && !all_started) {
      m.seconds += step_seconds;
      ++m.steps;
    } else if (!shape.measure_prompt && all_started && none_finished && more) {
      m.tokens += progress.generated - generated_before;
      m.seconds += step_seconds;
      ++m.steps;
    }
  }
  if (shape.measure_prompt) m.tokens = shape.prompt * shape.chats;
  m.errors = progress.errors;
  m.first_error = progress.first_error;
  return m;
}

struct ShapeResult {
  Shape shape;
  Measured measured;
  double roofline_tokens_per_second = 0;  // 0: nothing streamed, no bound
  int32_t segments_per_step = 0;          // of the last decode step
  uint64_t recaptures = 0;                // graph re-captures during the test
  uint64_t preemptions = 0;               // during the test
  // A mixture-of-experts model's expert choices during the test: served from the device cache
  // (hits) or from host memory (misses); expert_bytes: those copied over PCIe (each distinct
  // missed expert of a layer once a step, however many of the step's tokens chose it).
  uint64_t expert_hits = 0, expert_misses = 0, expert_bytes = 0, expert_tokens = 0;
  uint64_t expert_host = 0;  // of the misses, the choices the host's CPU computed
  double host_share() const {
    return expert_misses > 0
               ? static_cast<double>(expert_host) / static_cast<double>(expert_misses)
               : 0;
  }
  bool has_experts() const { return expert_hits + expert_misses > 0; }
  double hit_rate() const {
    return has_experts()
               ? static_cast<double>(expert_hits) / static_cast<double>(expert_hits + expert_misses)
               : 0;
  }
  double expert_bytes_per_token() const {
    return expert_tokens > 0
               ? static_cast<double>(expert_bytes) / static_cast<double>(expert_tokens)
               : 0;
  }
  double ratio() const {
    return roofline_tokens_per_second > 0
               ? measured.tokens_per_second() / roofline_tokens_per_second
               : 0;
  }
};

struct BudgetRow {
  int32_t percent = 0;
  uint64_t budget_bytes = 0;
  std::string device;  // the engine's, once open
  std::string error;   // the engine did not open with this budget
  int32_t resident_layers = 0, streamed_layers = 0;
  uint64_t streamed_bytes_per_pass = 0;
  // Dense models: the 256ths of each streamed matrix's rows the host computes in decode runs of
  // up to 8 rows (0: none), and what such a pass copies.
  int32_t host_row_share = 0;
  uint64_t split_bytes_per_pass = 0;
  double h2d_bandwidth_bytes_per_second = 0;  // measured at load (telemetry)
  std::vector<ShapeResult> results;
};

// The PCIe bound of a shape: every pass copies the streamed layers once, so `tokens per pass`
// tokens come out per streamed_bytes_per_pass over the bandwidth; a mixture of experts also
// reads the experts its tokens missed in the device cache, expert_bytes_per_token each.
// A decode pass of up to 8 rows with the host's rows copies only the device's rows.
double pcie_roofline(const Shape& shape, const TelemetrySnapshot& t, int64_t prefill_chunk,
                     double expert_bytes_per_token) {
  constexpr int32_t kSplitMaxRows = 8;  // HostRows::kMaxRows
  const bool split =
      t.streaming.host_row_share > 0 && !shape.measure_prompt && shape.chats <= kSplitMaxRows;
  const auto bytes = static_cast<double>(split ? t.streaming.split_bytes_per_pass
                                               : t.streaming.streamed_bytes_per_pass);
  const double bandwidth = t.streaming.h2d_bandwidth_bytes_per_second;
  if ((bytes == 0 && expert_bytes_per_token <= 0) || bandwidth <= 0) return 0;
  double tokens_per_pass = shape.chats;
  if (shape.measure_prompt) {
    const int64_t tokens = shape.prompt * shape.chats;
    const int64_t passes = (tokens + prefill_chunk - 1) / prefill_chunk;
    tokens_per_pass = static_cast<double>(tokens) / static_cast<double>(passes);
  }
  return bandwidth / (bytes / tokens_per_pass + expert_bytes_per_token);
}

// The warm-up and the tests on an open engine, into `row`.
void run_tests(Engine& engine, BudgetRow& row, const std::vector<Shape>& shapes,
               const StreamBenchOptions& o, TelemetryRecorder* telemetry) {
  TelemetrySnapshot t = engine.telemetry();
  std::mt19937_64 random(o.seed);
  // Warm-up at batch 1 and at the full batch: first touches, library handles and the decode
  // graphs of both buckets stay out of the figures.
  for (int32_t chats : {1, o.batch}) {
    run_shape(engine, {"warm-up", chats, std::min<int64_t>(o.short_prompt, 8), 4, false}, random,
              telemetry);
  }
  // And one prompt of the prefill test's length, as granule-bench's own pp warms up, so that a
  // long pass's one-time costs (kernels loaded at their first launch, first touches) stay out of
  // pp whatever the batch: the warm-ups above prefill 8 tokens a chat, so pp at `-b 1` took
  // them where `-b 16` did not (kernels/README.md, the MoE host paragraph).
  run_shape(engine, {"warm-up", 1, o.prompt_tokens, 1, true}, random, telemetry);
  for (const Shape& shape : shapes) {
    const TelemetrySnapshot before = engine.telemetry();
    ShapeResult r;
    r.shape = shape;
    r.measured = run_shape(engine, shape, random, telemetry);
    t = engine.telemetry();
    r.expert_hits = t.experts.hits - before.experts.hits;
    r.expert_misses = t.experts.misses - before.experts.misses;
    r.expert_bytes = t.experts.bytes_streamed - before.experts.bytes_streamed;
    r.expert_host = t.experts.host_computed - before.experts.host_computed;
    r.expert_tokens = t.experts.tokens - before.experts.tokens;
    r.roofline_tokens_per_second =
        pcie_roofline(shape, t, o.prefill_chunk_tokens, r.expert_bytes_per_token());
    r.segments_per_step = t.graphs.segments_per_step;
    r.recaptures = t.graphs.recaptures - before.graphs.recaptures;
    r.preemptions = t.scheduler.preemptions - before.scheduler.preemptions;
    row.results.push_back(std::move(r));
  }
  // A re-plan during the tests shows in the last snapshot.
  row.streamed_bytes_per_pass = t.streaming.streamed_bytes_per_pass;
  row.host_row_share = t.streaming.host_row_share;
  row.split_bytes_per_pass = t.streaming.split_bytes_per_pass;
  if (t.streaming.layers_resident + t.streaming.layers_streamed > 0) {
    row.resident_layers = t.streaming.layers_resident;
    row.streamed_layers = t.streaming.layers_streamed;
  }
  if (telemetry != nullptr) telemetry->record_now(engine.telemetry());
}

BudgetRow run_budget(const std::filesystem::path& path, EngineOptions options, int32_t percent,
                     uint64_t budget_bytes, const std::vector<Shape>& shapes,
                     const StreamBenchOptions& o, TelemetryRecorder* telemetry) {
  BudgetRow row;
  row.percent = percent;
  row.budget_bytes = budget_bytes;
  options.vram_budget_bytes = budget_bytes;
  std::unique_ptr<Engine> engine;
  try {
    engine = Engine::open(path, options);
  } catch (const Error& e) {
    row.error = e.what();
    return row;
  }
  row.device = engine->device_name();
  TelemetrySnapshot t = engine->telemetry();
  row.resident_layers = t.streaming.layers_resident;
  row.streamed_layers = t.streaming.layers_streamed;
  if (row.resident_layers + row.streamed_layers == 0) {
    // A backend that does not place layers (the CPU) holds all of them.
    row.resident_layers = static_cast<int32_t>(engine->config().n_layer);
  }
  row.streamed_bytes_per_pass = t.streaming.streamed_bytes_per_pass;
  row.host_row_share = t.streaming.host_row_share;
  row.split_bytes_per_pass = t.streaming.split_bytes_per_pass;
  row.h2d_bandwidth_bytes_per_second = t.streaming.h2d_bandwidth_bytes_per_second;

  try {
    run_tests(*engine, row, shapes, o, telemetry);
  } catch (const Error& e) {  // a refused request or a lost device: this budget's row says so
    row.error = e.what();
  }
  return row;
}

std::string fixed(double value, int decimals) {
  char text[48];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

void print_table(const StreamBenchOptions& o, const std::string& model_name,
                 const std::string& device, const FitEstimate& fit, uint64_t extras_bytes,
                 const std::vector<BudgetRow>& rows) {
  std::printf("stream benchmark on %s\n", device.c_str());
  std::printf(
      "model: %s (%lld layers), weights %.2f GiB; each budget adds %.2f GiB (workspace "
      "%.2f GiB, KV reserve %.2f GiB)\n",
      model_name.c_str(), static_cast<long long>(fit.config.n_layer),
      static_cast<double>(fit.weights_bytes) / kGiB, static_cast<double>(extras_bytes) / kGiB,
      static_cast<double>(fit.workspace_bytes) / kGiB,
      static_cast<double>(extras_bytes - fit.workspace_bytes) / kGiB);
  std::printf(
      "tests: tg%d (1 chat), decode (%d chats, %d tokens each), pp%lld (prefill chunk "
      "%lld); prompts random, greedy, EOS ignored\n\n",
      o.tokens, o.batch, o.tokens, static_cast<long long>(o.prompt_tokens),
      static_cast<long long>(o.prefill_chunk_tokens));
  std::printf(
      "| %6s | %8s | %9s | %-7s | %5s | %10s | %10s | %6s | %8s | %10s | %7s | %6s | %10s | %6s "
      "|\n",
      "budget", "GiB", "res/str", "test", "batch", "t/s", "PCIe t/s", "ratio", "seg/step",
      "recaptures", "preempt", "hit", "MB/token", "CPU");
  std::printf(
      "|--------|----------|-----------|---------|-------|------------|------------|"
      "--------|----------|------------|---------|--------|------------|--------|\n");
  for (const BudgetRow& row : rows) {
    const std::string percent = std::to_string(row.percent) + "%";
    const std::string gib = fixed(static_cast<double>(row.budget_bytes) / kGiB, 2);
    const std::string layers =
        std::to_string(row.resident_layers) + "/" + std::to_string(row.streamed_layers);
    for (const ShapeResult& r : row.results) {
      const bool bound = r.roofline_tokens_per_second > 0;
      const std::string roofline = bound ? fixed(r.roofline_tokens_per_second, 1) : "-";
      const std::string ratio = bound ? fixed(r.ratio() * 100, 0) + "%" : "-";
      const std::string segments =
          r.shape.measure_prompt ? "-" : std::to_string(r.segments_per_step);
      const std::string hit = r.has_experts() ? fixed(r.hit_rate() * 100, 1) + "%" : "-";
      const std::string per_token =
          r.has_experts() ? fixed(r.expert_bytes_per_token() / 1e6, 2) : "-";
      const std::string host = r.expert_misses > 0 ? fixed(r.host_share() * 100, 1) + "%" : "-";
      std::printf(
          "| %6s | %8s | %9s | %-7s | %5d | %10.1f | %10s | %6s | %8s | %10llu | %7llu | %6s | "
          "%10s | %6s |",
          percent.c_str(), gib.c_str(), layers.c_str(), r.shape.test.c_str(), r.shape.chats,
          r.measured.tokens_per_second(), roofline.c_str(), ratio.c_str(), segments.c_str(),
          static_cast<unsigned long long>(r.recaptures),
          static_cast<unsigned long long>(r.preemptions), hit.c_str(), per_token.c_str(),
          host.c_str());
      if (r.measured.errors > 0) std::printf(" error: %s", r.measured.first_error.c_str());
      std::printf("\n");
    }
    if (row.host_row_share > 0)
      std::printf("| %6s | host rows: %d/256 of each streamed matrix on the CPU (%.1f%%); a pass "
                  "of up to 8 rows copies %.0f MiB of %.0f MiB\n",
                  percent.c_str(), row.host_row_share, row.host_row_share * 100.0 / 256,
                  static_cast<double>(row.split_bytes_per_pass) / (1 << 20),
                  static_cast<double>(row.streamed_bytes_per_pass) / (1 << 20));
    // The budget did not open, or a test failed after the rows above.
    if (!row.error.empty()) {
      std::printf("| %6s | %8s | error: %s\n", percent.c_str(), gib.c_str(), row.error.c_str());
    }
  }
  std::printf(
      "\nbudget: %% of the weight bytes, plus the extras above; res/str: layers resident in\n"
      "  device memory / streamed from pinned host memory every pass;\n"
      "t/s: decode tokens over the steps in which every chat decodes, or the prompt's tokens\n"
      "  over its prefill steps; PCIe t/s: the bound if copying the streamed layers were all\n"
      "  a pass cost (tokens per pass x H2D bandwidth / streamed bytes per pass; '-' when\n"
      "  nothing streams; with host rows, a decode pass of up to 8 rows copies only the\n"
      "  device's rows); ratio = t/s / PCIe t/s; seg/step: host-issued units of the last\n"
      "  decode step; recaptures, preempt: decode graphs captured again and chats preempted\n"
      "  during the test; hit, MB/token (mixtures of experts): expert choices served from the\n"
      "  device cache, and expert bytes copied from host memory per token (an expert several\n"
      "  of a step's tokens chose crosses once), which PCIe t/s adds to the layers'; CPU: of\n"
      "  the choices served from host memory, those the CPU computed (nothing copied).\n");
}

nlohmann::json to_json(const StreamBenchOptions& o, const std::string& model_name,
                       const std::string& device, const FitEstimate& fit, uint64_t extras_bytes,
                       const std::vector<BudgetRow>& rows) {
  nlohmann::json j;
  j["device"] = device;
  j["model"] = model_name;
  j["layers"] = fit.config.n_layer;
  j["weights_bytes"] = fit.weights_bytes;
  j["extras_bytes"] = extras_bytes;
  j["tokens"] = o.tokens;
  j["batch"] = o.batch;
  j["prompt_tokens"] = o.prompt_tokens;
  j["prefill_chunk_tokens"] = o.prefill_chunk_tokens;
  j["budgets"] = nlohmann::json::array();
  for (const BudgetRow& row : rows) {
    nlohmann::json b{{"percent", row.percent}, {"budget_bytes", row.budget_bytes}};
    if (!row.error.empty()) b["error"] = row.error;
    if (!row.error.empty() && row.results.empty()) {
      j["budgets"].push_back(b);
      continue;
    }
    b["resident_layers"] = row.resident_layers;
    b["streamed_layers"] = row.streamed_layers;
    b["streamed_bytes_per_pass"] = row.streamed_bytes_per_pass;
    b["host_row_share"] = row.host_row_share;
    b["split_bytes_per_pass"] = row.split_bytes_per_pass;
    b["h2d_bandwidth_bytes_per_second"] = row.h2d_bandwidth_bytes_per_second;
    b["results"] = nlohmann::json::array();
    for (const ShapeResult& r : row.results) {
      const bool bound = r.roofline_tokens_per_second > 0;
      nlohmann::json x{{"test", r.shape.test},
                       {"batch", r.shape.chats},
                       {"tokens", r.measured.tokens},
                       {"seconds", r.measured.seconds},
                       {"steps", r.measured.steps},
                       {"tokens_per_second", r.measured.tokens_per_second()},
                       {"pcie_roofline_tokens_per_second",
                        bound ? nlohmann::json(r.roofline_tokens_per_second) : nlohmann::json()},
                       {"roofline_ratio", bound ? nlohmann::json(r.ratio()) : nlohmann::json()},
                       {"recaptures", r.recaptures},
                       {"preemptions", r.preemptions},
                       {"errors", r.measured.errors}};
      if (!r.shape.measure_prompt) x["segments_per_step"] = r.segments_per_step;
      if (r.has_experts()) {
        x["expert_hit_rate"] = r.hit_rate();
        x["expert_bytes_per_token"] = r.expert_bytes_per_token();
        x["expert_host_share"] = r.host_share();
      }
      if (r.measured.errors > 0) x["first_error"] = r.measured.first_error;
      b["results"].push_back(x);
    }
    j["budgets"].push_back(b);
  }
  return j;
}

}  // namespace

void add_stream_bench_options(CLI::App& command, StreamBenchOptions& o) {
  command.add_option("-m,--model", o.model_path, "GGUF model file");
  command.add_option("--synthetic", o.synthetic,
                     std::string("synthetic model PRESET[:TYPE] (default ") + kDefaultModel + ")");
  command
      .add_option("--budgets", o.budgets,
                  "budgets in % of the weight bytes (the engine's workspace and KV reserve on top)")
      ->delimiter(',')
      ->check(CLI::Range(1, 1000));
  command.add_option("-n,--tokens", o.tokens, "tokens generated per chat in the decode tests")
      ->check(CLI::Range(2, 1 << 20));
  command.add_option("-b,--batch", o.batch, "chats of the batched decode test")
      ->check(CLI::Range(1, 4096));
  command.add_option("-p,--prompt", o.prompt_tokens, "prompt tokens of the prefill test")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  command.add_option("--device", o.device, "auto, cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  command
      .add_option("--prefill-chunk", o.prefill_chunk_tokens, "prompt tokens per step, all chats")
      ->check(CLI::PositiveNumber);
  command.add_option("--threads", o.cpu_threads, "CPU backend threads (0 = all cores)");
  command.add_option("--host-experts", o.host_expert_share,
                     "mixtures of experts: the 256ths of a decode step's missed experts the CPU "
                     "computes (-1: all of them in steps of 8 or more rows, 160/256 in smaller ones; 0: none)")
      ->check(CLI::Range(-1, 256));
  command.add_option("--host-rows", o.host_row_share,
                     "dense models: the 256ths of each streamed layer's rows the CPU computes in "
                     "decode runs of up to 8 rows (-1: measured at load, 0: none)")
      ->check(CLI::Range(-1, 256));
  command.add_option("--seed", o.seed, "prompt seed");
  command.add_option("--telemetry-out", o.telemetry_out,
                     "record the engine's telemetry to FILE as JSON lines");
  command.add_flag("--json", o.json, "print JSON instead of the table");
}

int run_stream_benchmark(const StreamBenchOptions& o) {
  try {
    if (o.budgets.empty()) throw UsageError("give at least one budget");
    const std::string synthetic =
        o.model_path.empty() && o.synthetic.empty() ? kDefaultModel : o.synthetic;
    const std::filesystem::path path = bench_model_path(o.model_path, synthetic);
    const std::string model_name =
        synthetic.empty() ? path.filename().string() : "synthetic " + synthetic;
    std::unique_ptr<TelemetryRecorder> telemetry;
    if (!o.telemetry_out.empty()) telemetry = std::make_unique<TelemetryRecorder>(o.telemetry_out);

    EngineOptions options;
    options.device = device_kind(o.device);
    options.max_sequences = o.batch;
    options.context_length = std::max<int64_t>(o.short_prompt + o.tokens, o.prompt_tokens + 1);
    options.prefill_chunk_tokens = o.prefill_chunk_tokens;
    options.cpu_threads = o.cpu_threads;
    options.host_expert_share = o.host_expert_share;
    options.host_row_share = o.host_row_share;
    // The weights, workspace and KV reserve do not depend on the budget: any budget will do
    // for reading them (a given budget also lets it plan for a GPU this machine lacks).
    EngineOptions sizing = options;
    sizing.vram_budget_bytes = uint64_t{1} << 40;
    const FitEstimate fit = Engine::estimate(path, sizing);
    // KV for the largest test (each chat rounded up by a granule), or the engine's reserve if
    // larger: a 100% budget then holds every layer and the tests' KV, and smaller budgets
    // differ only in the weights they leave out.
    const int64_t kv_tokens =
        std::max<int64_t>(o.batch * (o.short_prompt + o.tokens), o.prompt_tokens + 1);
    const uint64_t kv_bytes =
        std::max(fit.kv_reserve_bytes, fit.kv_bytes_per_token * static_cast<uint64_t>(kv_tokens) +
                                           kHostGranuleBytes * static_cast<uint64_t>(o.batch));
    const uint64_t extras_bytes = fit.workspace_bytes + kv_bytes;

    const std::vector<Shape> shapes = {
        {"tg" + std::to_string(o.tokens), 1, o.short_prompt, o.tokens, false},
        {"decode", o.batch, o.short_prompt, o.tokens, false},
        {"pp" + std::to_string(o.prompt_tokens), 1, o.prompt_tokens, 1, true},
    };
    std::vector<BudgetRow> rows;
    for (int32_t percent : o.budgets) {
      const auto weights =
          static_cast<uint64_t>(static_cast<double>(fit.weights_bytes) * percent / 100.0);
      rows.push_back(
          run_budget(path, options, percent, weights + extras_bytes, shapes, o, telemetry.get()));
      if (!o.json) std::fprintf(stderr, "budget %d%% done\n", percent);
    }
    if (telemetry) telemetry->close();
    std::string device = fit.device;
    for (const BudgetRow& row : rows) {
      if (!row.device.empty()) {
        device = row.device;
        break;
      }
    }
    if (o.json) {
      std::cout << to_json(o, model_name, device, fit, extras_bytes, rows).dump(2) << "\n";
    } else {
      print_table(o, model_name, device, fit, extras_bytes, rows);
    }
    return 0;
  } catch (const Error& e) {
    std::cerr << "granule-bench stream: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace granule
