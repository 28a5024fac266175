// granule-bench: llama-bench-style throughput of the CUDA backend on a GGUF file or a
// synthetic model made with the project's writer: prompt processing (pp), single-sequence
// generation (tg) and batched decode, each decode figure also as a fraction of the memory
// roofline (weight bytes read per step over the device-to-device bandwidth measured here).
// `granule-bench kv` runs the KV memory policies benchmark instead (kv_bench.h), and
// `granule-bench chats` concurrent chats through the engine (chats_bench.h), and
// `granule-bench vmm` what each KV granule operation costs (vmm_bench.h), and
// `granule-bench stream` throughput as the VRAM budget forces weight streaming (stream_bench.h),
// and `granule-bench sync` what a phase boundary costs on the device (sync_bench.h), and
// `granule-bench cpu` llama-bench's pp and tg tests on the CPU backend (cpu_bench.h).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "bench_model.h"
#include "chats_bench.h"
#include "cpu_bench.h"
#include "granule/error.h"
#include "granule/gguf.h"
#include "granule/log.h"
#include "granule/model_config.h"
#include "kv_bench.h"
#include "memory/kv_space.h"
#include "memory/memory_manager.h"
#include "runtime/runtime.h"
#include "stream_bench.h"
#include "sync_bench.h"
#include "turns_bench.h"
#include "vmm_bench.h"

#ifdef GRANULE_HAVE_CUDA
#include <cuda_runtime.h>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_memory.h"
#endif

namespace granule {
namespace {

struct Result {
  std::string test;
  int batch = 1;
  double tokens_per_second = 0;
  double ms_per_step = 0;
  double roofline_fraction = -1;  // decode only
  double device_ms = -1;  // decode only: the step's graph alone (Bench::device_step_seconds)
};

std::string human_bytes(double b) {
  char buf[32];
  if (b >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1ull << 30));
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1ull << 20));
  return buf;
}

#ifdef GRANULE_HAVE_CUDA

// Device-to-device copy bandwidth, counting bytes read plus bytes written (GB/s).
double measure_bandwidth_gbs() {
  MemoryManager scratch(uint64_t{1} << 40);
  const size_t bytes = size_t{2} << 30;
  cuda::DeviceBuffer a(scratch, MemoryCategory::Workspace, bytes),
      b(scratch, MemoryCategory::Workspace, bytes);
  cuda::check_cuda(cudaMemset(a.get(), 1, bytes), "cudaMemset");
  cuda::CudaStream stream;
  cuda::CudaEvent start, stop;
  for (int i = 0; i < 3; ++i)
    cuda::check_cuda(
        cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream.get()), "copy");
  std::vector<float> ms;
  for (int i = 0; i < 10; ++i) {
    cudaEventRecord(start.get(), stream.get());
    cuda::check_cuda(
        cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream.get()), "copy");
    cudaEventRecord(stop.get(), stream.get());
    cuda::check_cuda(cudaEventSynchronize(stop.get()), "cudaEventSynchronize");
    float t = 0;
    cudaEventElapsedTime(&t, start.get(), stop.get());
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return 2.0 * static_cast<double>(bytes) / (ms[ms.size() / 2] * 1e-3) / 1e9;
}

class Bench {
 public:
  Bench(const std::filesystem::path& path, int max_batch, int64_t context) {
    file_ = ModelFile::open(path);
    config_ = ModelConfig::from_gguf(*file_);
    weights_ = WeightTable::from_gguf(*file_, config_);
    RuntimeOptions options;
    options.device = DeviceKind::Cuda;
    options.backend.vram_budget_bytes = uint64_t{1} << 40;  // the bench maps what it needs
    options.context_length = context;
    options.slots = max_batch;
    options.kv_pool_granules = 0;
    runtime_ = make_runtime(*file_, config_, weights_, options);
    backend_ = &dynamic_cast<cuda::CudaBackend&>(*runtime_.backend);
    kv_ = runtime_.kv.get();
  }

  const ModelConfig& config() const { return config_; }
  uint64_t file_weight_bytes() const { return weights_.total_bytes(); }
  uint64_t decode_weight_bytes() const { return backend_->decode_weight_bytes(); }
  std::string device() const { return backend_->name(); }

  // Seconds for one prefill of n tokens into slot 0 (token ids only come back).
  double prefill_seconds(int n) {
    const std::vector<int32_t> prompt = random_tokens(n, 1);
    map(0, n);
    const auto start = std::chrono::steady_clock::now();
    step({{0, prompt, 0, false}});
    return seconds_since(start);
  }

  // Seconds per decode step for `batch` sequences after a prompt of `depth` tokens each (none:
  // a 1-token start), greedy, the sampled token fed back as the next input (median of `steps`
  // steps after warm-up).
  double decode_step_seconds(int batch, int steps, int depth = 0) {
    std::vector<int32_t> current = random_tokens(batch, 2);
    std::vector<int64_t> position(static_cast<size_t>(batch), depth);
    if (depth > 0) {
      const std::vector<int32_t> prompt = random_tokens(depth, 3);
      for (int s = 0; s < batch; ++s) {
        map(s, depth);
        step({{s, prompt, 0, false}});
      }
    }
    std::vector<double> times;
    for (int i = 0; i < steps + 3; ++i) {
      std::vector<BatchSequence> b;
      for (int s = 0; s < batch; ++s) {
        map(s, position[s] + 1);
        b.push_back({s, std::span<const int32_t>(&current[s], 1), position[s], false});
      }
      const auto start = std::chrono::steady_clock::now();
      const std::vector<int32_t> next = step(b);
      if (i >= 3) times.push_back(seconds_since(start));
      for (int s = 0; s < batch; ++s) {
        current[s] = next[s];
        ++position[s];
      }
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  }

  // The device's time per decode step of `batch` sequences, after decode_step_seconds() ran
  // that batch: the median of 5 runs of 20 back-to-back replays of its captured graph. The
  // difference to decode_step_seconds() is the host's part of a step. -1 without a graph.
  double device_step_seconds(int batch) {
    std::vector<double> t;
    for (int i = 0; i < 5; ++i) t.push_back(backend_->replay_seconds(batch, 20));
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }

 private:
  std::vector<int32_t> random_tokens(int n, uint32_t seed) const {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(config_.n_vocab - 1));
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& x : t) x = dist(rng);
    return t;
  }
  void map(int32_t slot, int64_t tokens) {
    if (!kv_->map_through(slot, tokens))
      throw CapacityError("the KV budget refused the benchmark's sequences");
  }
  std::vector<int32_t> step(const std::vector<BatchSequence>& batch) {
    const std::vector<SamplingParams> params(batch.size(), SamplingParams::greedy());
    const std::vector<uint64_t> draws(batch.size(), 0);
    return backend_->forward_sample(batch, params, {}, draws);
  }
  static double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }

  std::unique_ptr<ModelFile> file_;
  ModelConfig config_;
  WeightTable weights_;
  Runtime runtime_;
  cuda::CudaBackend* backend_ = nullptr;
  KvSpace* kv_ = nullptr;
};

#endif  // GRANULE_HAVE_CUDA

int run(int argc, char** argv) {
  CLI::App app{"granule-bench: prompt processing, generation and batched decode on the GPU"};
  std::string model_path, synthetic;
  int pp = 512, tg = 128, repetitions = 3, depth = 0;
  std::vector<int> batches = {1, 2, 4, 8, 16, 32};
  bool json = false;
  app.add_option("-m,--model", model_path, "GGUF model file");
  app.add_option("--synthetic", synthetic,
                 "synthetic model PRESET:TYPE, e.g. llama3-8b:Q4_0, smollm2-135m:Q4_1");
  app.add_option("-p,--pp", pp, "prompt tokens for the prefill test (0 = skip)");
  app.add_option("-n,--tg", tg, "generated tokens for the generation test (0 = skip)");
  app.add_option("-b,--batches", batches, "batch sizes for batched decode")->delimiter(',');
  app.add_option("-d,--depth", depth,
                 "tokens of context each sequence holds before the generation and decode tests")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("-r,--repetitions", repetitions, "repetitions of the prefill test");
  app.add_flag("--json", json, "print JSON instead of the table");
  // `granule-bench kv`: the KV memory policies benchmark (kv_bench.h).
  KvBenchOptions kv_options;
  CLI::App* kv =
      app.add_subcommand("kv", "replay a seeded chat workload under each KV memory policy");
  add_kv_bench_options(*kv, kv_options);
  // `granule-bench chats`: concurrent chats through the engine (chats_bench.h).
  ChatsBenchOptions chats_options;
  CLI::App* chats = app.add_subcommand(
      "chats", "N concurrent greedy chats through the engine: throughput, peak KV, preemptions");
  add_chats_bench_options(*chats, chats_options);
  // `granule-bench vmm`: what each KV granule operation costs (vmm_bench.h).
  VmmBenchOptions vmm_options;
  CLI::App* vmm = app.add_subcommand(
      "vmm", "time KV granule create / map / unmap / destroy, idle and with the GPU busy");
  add_vmm_bench_options(*vmm, vmm_options);
  // `granule-bench stream`: throughput under shrinking VRAM budgets (stream_bench.h).
  StreamBenchOptions stream_options;
  CLI::App* stream =
      app.add_subcommand("stream",
                         "decode and prefill through the engine at VRAM budgets below the weights, "
                         "beside the PCIe bound");
  add_stream_bench_options(*stream, stream_options);
  // `granule-bench sync`: what a phase boundary costs, launches against grid barriers.
  SyncBenchOptions sync_options;
  CLI::App* sync = app.add_subcommand(
      "sync", "time a dependent phase boundary: kernels in a graph against a grid barrier");
  add_sync_bench_options(*sync, sync_options);
  // `granule-bench cpu`: llama-bench's pp and tg tests on the CPU backend (cpu_bench.h).
  CpuBenchOptions cpu_options;
  CLI::App* cpu = app.add_subcommand(
      "cpu", "prompt processing and generation on the CPU backend, at context depths");
  add_cpu_bench_options(*cpu, cpu_options);
  // `granule-bench turns`: time to first token over a chat's turns, KV reuse on and off.
  TurnsBenchOptions turns_options;
  CLI::App* turns = app.add_subcommand(
      "turns", "one chat of several turns: time to first token with and without KV reuse");
  add_turns_bench_options(*turns, turns_options);
  CLI11_PARSE(app, argc, argv);
  set_log_level(spdlog::level::warn);  // every subcommand: the engine's warnings and errors only
  if (kv->parsed()) return run_kv_benchmark(kv_options);
  if (chats->parsed()) return run_chats_benchmark(chats_options);
  if (vmm->parsed()) return run_vmm_benchmark(vmm_options);
  if (stream->parsed()) return run_stream_benchmark(stream_options);
  if (sync->parsed()) return run_sync_benchmark(sync_options);
  if (cpu->parsed()) return run_cpu_benchmark(cpu_options);
  if (turns->parsed()) return run_turns_benchmark(turns_options);

#ifndef GRANULE_HAVE_CUDA
  std::cerr << "granule-bench: this build has no CUDA backend\n";
  return 1;
#else
  std::string why;
  if (!cuda::cuda_available(&why)) {
    std::cerr << "granule-bench: " << why << "\n";
    return 1;
  }
  if (model_path.empty() == synthetic.empty()) {
    std::cerr << "granule-bench: give one of --model or --synthetic\n";
    return 2;
  }
  const std::filesystem::path path =
      synthetic.empty() ? std::filesystem::path(model_path) : synthetic_bench_model(synthetic);
  const int max_batch = std::max(1, *std::max_element(batches.begin(), batches.end()));
  const double bandwidth_gbs = measure_bandwidth_gbs();
  Bench bench(path, max_batch, std::max<int64_t>(pp, int64_t{tg} + depth) + 64);
  const double weight_bytes = static_cast<double>(bench.decode_weight_bytes());
  const double roofline_step_s = weight_bytes / (bandwidth_gbs * 1e9);

  std::vector<Result> results;
  if (pp > 0) {
    bench.prefill_seconds(pp);  // warm-up: cuBLAS, first-touch of the workspace
    std::vector<double> t;
    for (int i = 0; i < repetitions; ++i) t.push_back(bench.prefill_seconds(pp));
    std::sort(t.begin(), t.end());
    const double s = t[t.size() / 2];
    results.push_back({"pp" + std::to_string(pp), 1, pp / s, s * 1e3, -1});
  }
  const std::string at_depth = depth > 0 ? "@d" + std::to_string(depth) : "";
  if (tg > 0) {
    const double s = bench.decode_step_seconds(1, tg, depth);
    results.push_back({"tg" + std::to_string(tg) + at_depth, 1, 1.0 / s, s * 1e3,
                       roofline_step_s / s, bench.device_step_seconds(1) * 1e3});
  }
  for (int b : batches) {
    const double s = bench.decode_step_seconds(b, 32, depth);
    results.push_back({"decode" + at_depth, b, b / s, s * 1e3, roofline_step_s / s,
                       bench.device_step_seconds(b) * 1e3});
  }

  const std::string model_name =
      synthetic.empty() ? path.filename().string() : "synthetic " + synthetic;
  if (json) {
    nlohmann::json j;
    j["model"] = model_name;
    j["device"] = bench.device();
    j["weight_bytes_per_step"] = weight_bytes;
    j["bandwidth_gbs"] = bandwidth_gbs;
    j["roofline_step_ms"] = roofline_step_s * 1e3;
    for (const Result& r : results)
      j["results"].push_back(
          {{"test", r.test},
           {"batch", r.batch},
           {"tokens_per_second", r.tokens_per_second},
           {"ms_per_step", r.ms_per_step},
           {"roofline_fraction",
            r.roofline_fraction < 0 ? nlohmann::json() : nlohmann::json(r.roofline_fraction)},
           {"device_ms_per_step",
            r.device_ms < 0 ? nlohmann::json() : nlohmann::json(r.device_ms)}});
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  const ModelConfig& c = bench.config();
  std::printf("device: %s, measured D2D bandwidth %.0f GB/s (read + write)\n",
              bench.device().c_str(), bandwidth_gbs);
  std::printf(
      "model: %s (%lld layers, %lld wide, %lld/%lld heads, ff %lld, vocab %lld), weights read per "
      "decode step %s, roofline step %.3f ms\n\n",
      model_name.c_str(), static_cast<long long>(c.n_layer), static_cast<long long>(c.n_embd),
      static_cast<long long>(c.n_head), static_cast<long long>(c.n_head_kv),
      static_cast<long long>(c.n_ff), static_cast<long long>(c.n_vocab),
      human_bytes(weight_bytes).c_str(), roofline_step_s * 1e3);
  std::printf("| %-28s | %10s | %-8s | %5s | %12s | %10s | %8s | %10s |\n", "model", "size", "test",
              "batch", "t/s", "ms/step", "roofline", "device ms");
  std::printf(
      "|%s|%s|%s|%s|%s|%s|%s|%s|\n", std::string(30, '-').c_str(), std::string(12, '-').c_str(),
      std::string(10, '-').c_str(), std::string(7, '-').c_str(), std::string(14, '-').c_str(),
      std::string(12, '-').c_str(), std::string(10, '-').c_str(), std::string(12, '-').c_str());
  for (const Result& r : results) {
    char roof[16] = "-", device_ms[16] = "-";
    if (r.roofline_fraction >= 0)
      std::snprintf(roof, sizeof roof, "%.0f%%", r.roofline_fraction * 100);
    if (r.device_ms >= 0) std::snprintf(device_ms, sizeof device_ms, "%.3f", r.device_ms);
    std::printf("| %-28s | %10s | %-8s | %5d | %12.1f | %10.3f | %8s | %10s |\n",
                model_name.substr(0, 28).c_str(),
                human_bytes(static_cast<double>(bench.file_weight_bytes())).c_str(), r.test.c_str(),
                r.batch, r.tokens_per_second, r.ms_per_step, roof, device_ms);
  }
  std::printf(
      "\ndevice ms: the step's captured graph replayed back to back (no upload, download or host "
      "wait); ms/step less it is the host's part of a step\n");
  return 0;
#endif
}

}  // namespace
}  // namespace granule

int main(int argc, char** argv) {
  try {
    return granule::run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "granule-bench: " << e.what() << "\n";
    return 1;
  }
}
