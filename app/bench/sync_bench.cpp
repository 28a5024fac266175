// granule-bench sync (sync_bench.h). Each variant is captured as one graph of `phases` steps
// and one of a single step; the cost of a boundary is the difference of their median replay
// times over phases - 1, so the graph's own launch does not count.
#include "sync_bench.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "granule/error.h"
#include "granule/log.h"

#ifdef GRANULE_HAVE_CUDA
#include <cuda_runtime.h>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device_memory.h"
#include "memory/memory_manager.h"
#include "sync_probe.cuh"
#endif

namespace granule {

void add_sync_bench_options(CLI::App& command, SyncBenchOptions& o) {
  command.add_option("--phases", o.phases, "dependent steps per timed graph")
      ->check(CLI::Range(2, 4096));
  command.add_option("--replays", o.replays, "graph replays per variant (median)")
      ->check(CLI::Range(5, 100000));
  command.add_flag("--json", o.json, "print JSON instead of the table");
}

#ifdef GRANULE_HAVE_CUDA
namespace {

struct Variant {
  const char* name;
  kernels::SyncProbe kind;
  bool early_launch;
};

constexpr Variant kVariants[] = {
    {"kernels, PDL", kernels::SyncProbe::kChain, true},
    {"kernels, plain", kernels::SyncProbe::kChain, false},
    {"grid barrier", kernels::SyncProbe::kBarrier, false},
    {"grid barrier, backoff", kernels::SyncProbe::kBarrierBackoff, false},
};

// Median replay time (µs) of a graph holding one launch_sync_probe.
double time_graph(const Variant& v, int blocks, int threads, int phases, int replays,
                  const kernels::SyncProbeBuffers& buffers, cudaStream_t stream) {
  // The barrier's counter stays a multiple of the grid's blocks only among launches of one
  // grid size (grid_sync.cuh), so each graph starts it from zero.
  cuda::check_cuda(cudaMemsetAsync(buffers.counter, 0, sizeof(unsigned long long), stream),
                   "cudaMemsetAsync");
  cuda::check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  kernels::KernelConfig config;
  config.early_launch = v.early_launch;
  cuda::check_cuda(kernels::fit_to_device(config), "fit_to_device");
  cuda::check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                   "cudaStreamBeginCapture");
  const cudaError_t launched =
      kernels::launch_sync_probe(v.kind, blocks, threads, phases, buffers, config, stream);
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  cuda::check_cuda(launched, "launch_sync_probe");
  cuda::check_cuda(ended, "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  cuda::check_cuda(instantiated, "cudaGraphInstantiate");
  cuda::CudaEvent start, stop;
  std::vector<float> ms;
  for (int i = 0; i < replays + 5; ++i) {
    cudaEventRecord(start.get(), stream);
    cudaGraphLaunch(exec, stream);
    cudaEventRecord(stop.get(), stream);
    const cudaError_t done = cudaEventSynchronize(stop.get());
    if (done != cudaSuccess) {
      cudaGraphExecDestroy(exec);
      cuda::check_cuda(done, "graph replay");
    }
    float t = 0;
    cudaEventElapsedTime(&t, start.get(), stop.get());
    if (i >= 5) ms.push_back(t);  // the first replays upload the graph
  }
  cudaGraphExecDestroy(exec);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1e3;
}

struct Row {
  int blocks = 0, threads = 0;
  std::vector<double> us;  // per variant, µs per boundary; < 0: not run (too many blocks)
};

}  // namespace
#endif

int run_sync_benchmark(const SyncBenchOptions& o) {
#ifndef GRANULE_HAVE_CUDA
  (void)o;
  std::cerr << "granule-bench sync: this build has no CUDA backend\n";
  return 1;
#else
  try {
    std::string why;
    if (!cuda::cuda_available(&why)) throw DeviceError(why);
    cudaDeviceProp prop{};
    cuda::check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    const int sms = prop.multiProcessorCount;
    MemoryManager scratch(uint64_t{1} << 30);
    const size_t floats = static_cast<size_t>(sms) * 64;
    cuda::DeviceBuffer a(scratch, MemoryCategory::Workspace, floats * sizeof(float)),
        b(scratch, MemoryCategory::Workspace, floats * sizeof(float)),
        counter(scratch, MemoryCategory::Workspace, sizeof(unsigned long long));
    cuda::check_cuda(cudaMemset(a.get(), 0, floats * sizeof(float)), "cudaMemset");
    cuda::check_cuda(cudaMemset(counter.get(), 0, sizeof(unsigned long long)), "cudaMemset");
    const kernels::SyncProbeBuffers buffers{static_cast<float*>(a.get()),
                                            static_cast<float*>(b.get()),
                                            static_cast<unsigned long long*>(counter.get())};
    cuda::CudaStream stream;
    const std::pair<int, int> shapes[] = {{1, 128}, {1, 256}, {1, 1024}, {2, 256}, {4, 256}};
    std::vector<Row> rows;
    for (const auto& [per_sm, threads] : shapes) {
      Row row{sms * per_sm, threads, {}};
      for (const Variant& v : kVariants) {
        if (v.kind != kernels::SyncProbe::kChain &&
            row.blocks > kernels::sync_probe_resident_blocks(threads)) {
          row.us.push_back(-1);
          continue;
        }
        const double many =
            time_graph(v, row.blocks, threads, o.phases, o.replays, buffers, stream.get());
        const double one = time_graph(v, row.blocks, threads, 1, o.replays, buffers, stream.get());
        row.us.push_back((many - one) / (o.phases - 1));
      }
      rows.push_back(row);
    }
    if (o.json) {
      nlohmann::json j;
      j["device"] = prop.name;
      j["phases"] = o.phases;
      for (const Row& r : rows) {
        nlohmann::json jr{{"blocks", r.blocks}, {"threads", r.threads}};
        for (size_t i = 0; i < r.us.size(); ++i)
          jr[kVariants[i].name] = r.us[i] < 0 ? nlohmann::json() : nlohmann::json(r.us[i]);
        j["rows"].push_back(jr);
      }
      std::cout << j.dump(2) << "\n";
      return 0;
    }
    std::printf("device: %s, %d SMs; µs per dependent phase boundary (median of %d replays of %d "
                "phases, less one phase)\n\n",
                prop.name, sms, o.replays, o.phases);
    std::printf("| %6s | %7s |", "blocks", "threads");
    for (const Variant& v : kVariants) std::printf(" %21s |", v.name);
    std::printf("\n|--------|---------|");
    for (size_t i = 0; i < std::size(kVariants); ++i) std::printf("-----------------------|");
    std::printf("\n");
    for (const Row& r : rows) {
      std::printf("| %6d | %7d |", r.blocks, r.threads);
      for (double us : r.us) {
        if (us < 0)
          std::printf(" %21s |", "-");
        else
          std::printf(" %21.2f |", us);
      }
      std::printf("\n");
    }
    return 0;
  } catch (const Error& e) {
    std::cerr << "granule-bench sync: " << e.what() << "\n";
    return 1;
  }
#endif
}

}  // namespace granule
