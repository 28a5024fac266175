// granule-bench cpu (see cpu_bench.h).
#include "cpu_bench.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "backends/backend.h"
#include "bench_model.h"
#include "granule/error.h"
#include "granule/gguf.h"
#include "granule/model_config.h"
#include "memory/kv_space.h"
#include "runtime/runtime.h"

namespace granule {
namespace {

struct Measured {
  std::string test;
  double mean = 0;    // tokens per second
  double stddev = 0;  // over the repetitions
};

class CpuBench {
 public:
  CpuBench(const std::filesystem::path& path, const CpuBenchOptions& o, int64_t context) {
    file_ = ModelFile::open(path);
    config_ = ModelConfig::from_gguf(*file_);
    weights_ = WeightTable::from_gguf(*file_, config_);
    RuntimeOptions options;
    options.device = DeviceKind::Cpu;
    options.backend.cpu_threads = o.threads;
    options.backend.cpu_exact_numerics = o.exact;
    options.backend.max_tokens_per_pass = std::max<int64_t>(o.pp, 1);
    options.context_length = context;
    options.slots = 1;
    options.kv_pool_granules = 0;
    runtime_ = make_runtime(*file_, config_, weights_, options);
  }

  std::string device() const { return runtime_.backend->name(); }

  // Seconds for a pass of n prompt tokens after `depth` tokens of context (not timed).
  double prefill_seconds(int n, int depth) {
    fill(depth);
    const std::vector<int32_t> prompt = random_tokens(n, 1);
    map(depth + n);
    BatchSequence seq{0, prompt, depth, false};
    const auto start = std::chrono::steady_clock::now();
    runtime_.backend->forward(std::span<const BatchSequence>(&seq, 1), logits_);
    return seconds_since(start);
  }

  // Seconds for n decode steps of one token after `depth` tokens of context, each step's
  // greedy token fed to the next (as a chat would; llama-bench feeds fixed tokens).
  double generate_seconds(int n, int depth) {
    fill(depth);
    int32_t token = random_tokens(1, 2)[0];
    map(depth + n);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) {
      BatchSequence seq{0, std::span<const int32_t>(&token, 1), depth + i, false};
      runtime_.backend->forward(std::span<const BatchSequence>(&seq, 1), logits_);
      token =
          static_cast<int32_t>(std::max_element(logits_.begin(), logits_.end()) - logits_.begin());
    }
    return seconds_since(start);
  }

 private:
  void fill(int depth) {
    if (depth <= 0) return;
    const std::vector<int32_t> prompt = random_tokens(depth, 3);
    map(depth);
    // The context in passes of at most 512 tokens (the engine's prefill chunk).
    for (int first = 0; first < depth; first += 512) {
      const int count = std::min(512, depth - first);
      BatchSequence seq{0, std::span<const int32_t>(prompt.data() + first, count), first, false};
      runtime_.backend->forward(std::span<const BatchSequence>(&seq, 1), logits_);
    }
  }
  std::vector<int32_t> random_tokens(int n, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(config_.n_vocab - 1));
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& x : t) x = dist(rng);
    return t;
  }
  void map(int64_t tokens) {
    if (!runtime_.kv->map_through(0, tokens))
      throw CapacityError("the KV budget refused the benchmark's sequence");
  }
  static double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }

  std::unique_ptr<ModelFile> file_;
  ModelConfig config_;
  WeightTable weights_;
  Runtime runtime_;
  std::vector<float> logits_;
};

Measured summarise(std::string test, int tokens, const std::vector<double>& seconds) {
  Measured m{std::move(test)};
  std::vector<double> rates;
  for (double s : seconds) rates.push_back(tokens / s);
  for (double r : rates) m.mean += r / static_cast<double>(rates.size());
  for (double r : rates) m.stddev += (r - m.mean) * (r - m.mean);
  m.stddev = rates.size() > 1 ? std::sqrt(m.stddev / static_cast<double>(rates.size() - 1)) : 0;
  return m;
}

}  // namespace

void add_cpu_bench_options(CLI::App& command, CpuBenchOptions& o) {
  command.add_option("-m,--model", o.model_path, "GGUF model file");
  command.add_option("--synthetic", o.synthetic,
                     "synthetic model PRESET:TYPE, e.g. smollm2-135m:Q4_1");
  command.add_option("-p,--pp", o.pp, "prompt tokens of the prefill test (0 = skip)")
      ->check(CLI::Range(0, 1 << 16));
  command.add_option("-n,--tg", o.tg, "generated tokens of the generation test (0 = skip)")
      ->check(CLI::Range(0, 1 << 16));
  command.add_option("-d,--depth", o.depths, "tokens of context before each test, a list")
      ->delimiter(',')
      ->check(CLI::Range(0, 1 << 20));
  command.add_option("-r,--repetitions", o.repetitions, "repetitions of each test")
      ->check(CLI::Range(1, 100));
  command.add_option("-t,--threads", o.threads, "CPU backend threads (0 = all cores)");
  command.add_flag("--exact", o.exact, "the exact f32 matmuls (the reference numerics)");
  command.add_flag("--json", o.json, "print JSON instead of the table");
}

int run_cpu_benchmark(const CpuBenchOptions& o) {
  const std::filesystem::path path = bench_model_path(o.model_path, o.synthetic);
  int max_depth = 0;
  for (int d : o.depths) max_depth = std::max(max_depth, d);
  CpuBench bench(path, o, max_depth + std::max(o.pp, o.tg) + 16);
  std::vector<Measured> results;
  for (int depth : o.depths) {
    const std::string at = depth > 0 ? " @ d" + std::to_string(depth) : "";
    if (o.pp > 0) {
      bench.prefill_seconds(o.pp, depth);  // warm-up
      std::vector<double> s;
      for (int i = 0; i < o.repetitions; ++i) s.push_back(bench.prefill_seconds(o.pp, depth));
      results.push_back(summarise("pp" + std::to_string(o.pp) + at, o.pp, s));
    }
    if (o.tg > 0) {
      bench.generate_seconds(1, depth);  // warm-up
      std::vector<double> s;
      for (int i = 0; i < o.repetitions; ++i) s.push_back(bench.generate_seconds(o.tg, depth));
      results.push_back(summarise("tg" + std::to_string(o.tg) + at, o.tg, s));
    }
  }
  const std::string model = o.synthetic.empty() ? path.filename().string() : o.synthetic;
  if (o.json) {
    nlohmann::json j;
    j["model"] = model;
    j["device"] = bench.device();
    for (const Measured& m : results)
      j["results"].push_back(
          {{"test", m.test}, {"tokens_per_second", m.mean}, {"stddev", m.stddev}});
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("device: %s\n\n", bench.device().c_str());
  std::printf("| %-36s | %-14s | %20s |\n", "model", "test", "t/s");
  std::printf("|%s|%s|%s|\n", std::string(38, '-').c_str(), std::string(16, '-').c_str(),
              std::string(22, '-').c_str());
  for (const Measured& m : results)
    std::printf("| %-36s | %-14s | %12.2f ± %5.2f |\n", model.substr(0, 36).c_str(), m.test.c_str(),
                m.mean, m.stddev);
  return 0;
}

}  // namespace granule
