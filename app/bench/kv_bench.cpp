// granule-bench kv: builds the seeded chat workload, replays it under each KV policy on host
// memory or the GPU (CUDA VMM for granules, cudaMalloc + device copies for buckets) and prints
// committed bytes, copies, address changes, the per-step cost of mapping, and how the peaks
// compare with each other and with the live KV (the floor no policy can go under).
#include "kv_bench.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "granule/error.h"
#include "granule/log.h"
#include "granule/testkit/kv_benchmark.h"
#include "granule/testkit/synthetic_model.h"
#include "memory/kv_space.h"
#include "memory/memory_manager.h"

#ifdef GRANULE_HAVE_CUDA
#include <cuda_runtime.h>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_vmm.h"
#include "backends/cuda/device_memory.h"
#endif

namespace granule {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// The KV bytes per token of a preset's shape in fp16: layers x (K and V) x kv heads x head dim x 2.
int64_t fp16_kv_bytes_per_token(const std::string& preset) {
  const SyntheticModelSpec spec = SyntheticModelSpec::preset(preset);
  const int64_t head_dim = spec.head_dim > 0 ? spec.head_dim : spec.n_embd / spec.n_head;
  return spec.n_layer * 2 * spec.n_head_kv * head_dim * 2;
}

#ifdef GRANULE_HAVE_CUDA

// cudaMalloc'd through the project's RAII owner, charged to a private ledger (the policy
// keeps the benchmark's own).
class CudaBuffer final : public KvBenchBuffer {
 public:
  CudaBuffer(MemoryManager& ledger, uint64_t bytes)
      : buffer_(ledger, MemoryCategory::Other, static_cast<size_t>(bytes)) {}
  uint8_t* data() const override { return buffer_.as<uint8_t>(); }
  uint64_t bytes() const override { return buffer_.bytes(); }

 private:
  cuda::DeviceBuffer buffer_;
};

class CudaKvBenchMemory final : public KvBenchMemory {
 public:
  explicit CudaKvBenchMemory(int device)
      : device_(device), ledger_(std::numeric_limits<uint64_t>::max() / 2) {
    cuda::check_cuda(cudaSetDevice(device), "cudaSetDevice");
    cudaDeviceProp prop{};
    cuda::check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    name_ = std::string("CUDA ") + prop.name;
  }
  std::string name() const override { return name_; }
  std::unique_ptr<VirtualMemory> make_virtual_memory() override {
    return cuda::make_cuda_virtual_memory(device_);
  }
  std::unique_ptr<KvBenchBuffer> allocate(uint64_t bytes) override {
    return std::make_unique<CudaBuffer>(ledger_, bytes);
  }
  void copy(uint8_t* destination, const uint8_t* source, uint64_t bytes) override {
    // A device-to-device cudaMemcpy may return before the copy ends; the step waits for it.
    cuda::check_cuda(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToDevice, nullptr),
                     "cudaMemcpyAsync (KV bucket copy)");
    cuda::check_cuda(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
  }

 private:
  int device_;
  MemoryManager ledger_;
  std::string name_;
};

#endif  // GRANULE_HAVE_CUDA

std::unique_ptr<KvBenchMemory> make_memory(const KvBenchOptions& o) {
  if (o.device == "host")
    return make_host_kv_bench_memory(o.host_granule_bytes, o.touch_host_pages);
  if (o.device == "cuda") {
#ifdef GRANULE_HAVE_CUDA
    std::string why;
    if (!cuda::cuda_available(&why)) throw DeviceError(why);
    return std::make_unique<CudaKvBenchMemory>(0);
#else
    throw UnsupportedError("this build of granule-bench has no CUDA; use --device host");
#endif
  }
  throw UsageError("unknown device '" + o.device + "' (host or cuda)");
}

const KvPolicyResult* find_policy(const std::vector<KvPolicyResult>& results, KvPolicyKind kind) {
  for (const KvPolicyResult& r : results) {
    if (r.policy == kv_policy_name(kind)) return &r;
  }
  return nullptr;
}

void print_table(const KvBenchOptions& o, const std::string& memory_name, uint64_t granule_bytes,
                 int64_t bytes_per_token, const KvTrace& trace,
                 const std::vector<KvPolicyResult>& results) {
  std::printf("KV benchmark on %s, granule %.1f MiB\n", memory_name.c_str(),
              static_cast<double>(granule_bytes) / kMiB);
  std::printf(
      "shape: %s, %lld bytes/token (fp16), context %lld tokens, look-ahead %lld, first bucket "
      "%lld\n",
      o.bytes_per_token > 0 ? "custom" : o.model.c_str(), static_cast<long long>(bytes_per_token),
      static_cast<long long>(o.context_tokens), static_cast<long long>(o.lookahead_tokens),
      static_cast<long long>(o.min_bucket_tokens));
  std::printf(
      "workload: seed %llu, %d chats, %zu steps, %lld turns, %lld regenerations, %lld edits, "
      "%lld prompt + %lld answer tokens, at most %lld tokens live (%.1f MiB)\n\n",
      static_cast<unsigned long long>(o.seed), trace.chats, trace.steps.size(),
      static_cast<long long>(trace.turns), static_cast<long long>(trace.regenerations),
      static_cast<long long>(trace.edits), static_cast<long long>(trace.prompt_tokens),
      static_cast<long long>(trace.answer_tokens), static_cast<long long>(trace.peak_live_tokens),
      static_cast<double>(trace.peak_live_tokens * bytes_per_token) / kMiB);
  std::printf("| %-16s | %12s | %12s | %12s | %8s | %12s | %12s |\n", "policy", "peak MiB",
              "mean MiB", "copied MiB", "moves", "map us mean", "map us p99");
  std::printf(
      "|------------------|--------------|--------------|--------------|----------|--------------|-"
      "--"
      "-----------|\n");
  for (const KvPolicyResult& r : results) {
    std::printf("| %-16s | %12.1f | %12.1f | %12.1f | %8llu | %12.1f | %12.1f |\n",
                r.policy.c_str(), static_cast<double>(r.peak_committed_bytes) / kMiB,
                r.mean_committed_bytes / kMiB, static_cast<double>(r.copied_bytes) / kMiB,
                static_cast<unsigned long long>(r.address_changes), r.memory_us_mean,
                r.memory_us_p99);
  }
  std::printf(
      "\npeak MiB: the most KV held at any instant (a bucket copy's two buffers included; the\n"
      "  cached buckets count the buffers a caching allocator keeps for reuse; the padded batch\n"
      "  holds every slot at the longest live chat's bucket, the static shape a graph needs);\n"
      "mean MiB: KV held at the end of a step, averaged over the %zu steps;\n"
      "copied MiB: bytes copied from an outgrown bucket into the next;\n"
      "moves: times a live chat's KV changed address (each forces a graph re-capture);\n"
      "map us: time per step in allocate/map/unmap/copy;\n"
      "granules, pooled: the engine's pool of pre-created granules (a prefill chunk's worth plus\n"
      "  one per four slots), refilled while each step runs; its granules count as held\n",
      trace.steps.size());
  const double live = static_cast<double>(trace.peak_live_tokens * bytes_per_token);
  const KvPolicyResult* granules = find_policy(results, KvPolicyKind::Granule);
  const KvPolicyResult* pooled = find_policy(results, KvPolicyKind::GranulePooled);
  std::printf("\nlive KV at its peak: %.1f MiB (no policy can hold less)\n", live / kMiB);
  for (KvPolicyKind baseline :
       {KvPolicyKind::BucketGrowth, KvPolicyKind::BucketGrowthCached, KvPolicyKind::PaddedBatch}) {
    const KvPolicyResult* b = find_policy(results, baseline);
    if (!b || b->peak_committed_bytes == 0) continue;
    const auto peak = static_cast<double>(b->peak_committed_bytes);
    for (const KvPolicyResult* g : {granules, pooled}) {
      if (g) {
        std::printf("%s / %s peak: %.2f; ", g->policy.c_str(), b->policy.c_str(),
                    static_cast<double>(g->peak_committed_bytes) / peak);
      }
    }
    std::printf("live KV / %s peak: %.2f (the best any policy can do)\n", b->policy.c_str(),
                live / peak);
  }
}

void print_json(const KvBenchOptions& o, const std::string& memory_name, uint64_t granule_bytes,
                int64_t bytes_per_token, const KvTrace& trace,
                const std::vector<KvPolicyResult>& results) {
  nlohmann::json j;
  j["device"] = memory_name;
  j["granule_bytes"] = granule_bytes;
  j["model"] = o.bytes_per_token > 0 ? "custom" : o.model;
  j["bytes_per_token"] = bytes_per_token;
  j["context_tokens"] = o.context_tokens;
  j["lookahead_tokens"] = o.lookahead_tokens;
  j["min_bucket_tokens"] = o.min_bucket_tokens;
  j["workload"] = {{"seed", o.seed},
                   {"chats", trace.chats},
                   {"steps", trace.steps.size()},
                   {"turns", trace.turns},
                   {"regenerations", trace.regenerations},
                   {"edits", trace.edits},
                   {"context_full_ends", trace.context_full_ends},
                   {"prompt_tokens", trace.prompt_tokens},
                   {"answer_tokens", trace.answer_tokens},
                   {"peak_live_tokens", trace.peak_live_tokens},
                   {"peak_live_bytes", trace.peak_live_tokens * bytes_per_token}};
  for (const KvPolicyResult& r : results) {
    j["policies"].push_back({{"policy", r.policy},
                             {"peak_committed_bytes", r.peak_committed_bytes},
                             {"mean_committed_bytes", r.mean_committed_bytes},
                             {"final_committed_bytes", r.final_committed_bytes},
                             {"copied_bytes", r.copied_bytes},
                             {"address_changes", r.address_changes},
                             {"memory_us_per_step_mean", r.memory_us_mean},
                             {"memory_us_per_step_p99", r.memory_us_p99},
                             {"memory_us_per_step_max", r.memory_us_max}});
  }
  std::cout << j.dump(2) << "\n";
}

}  // namespace

void add_kv_bench_options(CLI::App& command, KvBenchOptions& o) {
  command.add_option("--chats", o.chats, "chats open at once, one sequence slot each")
      ->check(CLI::Range(1, 4096));
  command.add_option("--turns", o.max_turns, "answers per chat at most (regenerations included)")
      ->check(CLI::Range(1, 1000));
  command.add_option("--seed", o.seed, "workload seed");
  command.add_option("--model", o.model,
                     "synthetic preset whose fp16 KV shape sets the bytes per token "
                     "(smollm2-135m, llama3-8b, ...)");
  command.add_option("--bytes-per-token", o.bytes_per_token,
                     "KV bytes per token (overrides --model)");
  command.add_option("-c,--context", o.context_tokens, "context length in tokens")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 24));
  command
      .add_option("--prefill-chunk", o.prefill_chunk_tokens,
                  "prompt tokens a chat prefills per step")
      ->check(CLI::PositiveNumber);
  command
      .add_option("--lookahead", o.lookahead_tokens, "tokens granules map beyond a step's writes")
      ->check(CLI::NonNegativeNumber);
  command
      .add_option("--first-bucket", o.min_bucket_tokens,
                  "bucket growth's first allocation, in tokens")
      ->check(CLI::PositiveNumber);
  command.add_option("--device", o.device, "host or cuda")->check(CLI::IsMember({"host", "cuda"}));
  command.add_option("--host-granule", o.host_granule_bytes,
                     "host granule in bytes (a page multiple)");
  command.add_flag_callback(
      "--lazy-host-pages", [&o] { o.touch_host_pages = false; },
      "on host, let the kernel back pages on first write instead of at commit");
  command.add_flag("--json", o.json, "print JSON instead of the table");
}

int run_kv_benchmark(const KvBenchOptions& o) {
  try {
    const int64_t bytes_per_token =
        o.bytes_per_token > 0 ? o.bytes_per_token : fp16_kv_bytes_per_token(o.model);

    KvWorkloadOptions workload;
    workload.chats = o.chats;
    workload.max_turns = o.max_turns;
    workload.seed = o.seed;
    workload.max_context_tokens = o.context_tokens;
    workload.prefill_chunk_tokens = o.prefill_chunk_tokens;
    const KvTrace trace = make_kv_workload(workload);

    KvPolicyShape shape;
    shape.bytes_per_token = bytes_per_token;
    shape.max_context_tokens = o.context_tokens;
    shape.slots = o.chats;
    shape.lookahead_tokens = o.lookahead_tokens;
    shape.min_bucket_tokens = o.min_bucket_tokens;
    shape.prefill_chunk_tokens = o.prefill_chunk_tokens;

    std::unique_ptr<KvBenchMemory> memory = make_memory(o);
    const uint64_t granule_bytes = memory->make_virtual_memory()->granule_bytes();
    const std::vector<KvPolicyResult> results = compare_kv_policies(trace, shape, *memory);
    if (o.json) {
      print_json(o, memory->name(), granule_bytes, bytes_per_token, trace, results);
    } else {
      print_table(o, memory->name(), granule_bytes, bytes_per_token, trace, results);
    }
    return 0;
  } catch (const Error& e) {
    std::cerr << "granule-bench kv: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace granule
