// granule-bench vmm: times VirtualMemory::create / map / unmap / destroy one granule at a
// time over a few rounds (median and 99th percentile), then on a GPU the same calls each made
// right after launching a long device memset, counting the calls that returned while the
// memset was still running (they did not wait for the GPU).
#include "vmm_bench.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "granule/error.h"
#include "granule/log.h"
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

using Clock = std::chrono::steady_clock;

double us_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

struct Timing {
  std::string call;
  std::vector<double> us;
  int busy_after = -1;  // calls that returned with the GPU still busy (-1: not measured)

  double percentile(double p) const {
    if (us.empty()) return 0;
    std::vector<double> sorted = us;
    std::sort(sorted.begin(), sorted.end());
    const auto i = static_cast<size_t>(p * static_cast<double>(sorted.size() - 1) + 0.5);
    return sorted[std::min(i, sorted.size() - 1)];
  }
};

// Runs one call and records its time (and, with the GPU busy, whether it waited for it).
using TimeCall = std::function<void(Timing&, const std::function<void()>&)>;

// Each round creates n granules, maps them one at a time over a reservation, unmaps them from
// the tail and destroys them; `time_call` runs and times every call alone.
std::vector<Timing> time_calls(VirtualMemory& vm, int32_t n, int32_t rounds,
                               const TimeCall& time_call) {
  Timing create{"create"}, map{"map + access"}, unmap{"unmap"}, destroy{"destroy"};
  const uint64_t g = vm.granule_bytes();
  uint8_t* base = vm.reserve(static_cast<uint64_t>(n) * g);
  for (int32_t r = 0; r < rounds; ++r) {
    std::vector<VirtualMemory::Physical> granules(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i)
      time_call(create, [&] { granules[static_cast<size_t>(i)] = vm.create(); });
    for (int32_t i = 0; i < n; ++i) {
      time_call(map, [&] {
        vm.map(base + static_cast<uint64_t>(i) * g,
               std::span(&granules[static_cast<size_t>(i)], 1));
      });
    }
    std::vector<VirtualMemory::Physical> off;
    for (int32_t i = n; i-- > 0;)
      time_call(unmap, [&] { vm.unmap(base + static_cast<uint64_t>(i) * g, 1, off); });
    for (VirtualMemory::Physical p : off) time_call(destroy, [&] { vm.destroy(p); });
  }
  vm.unreserve(base, static_cast<uint64_t>(n) * g);
  return {create, map, unmap, destroy};
}

std::vector<Timing> time_idle(VirtualMemory& vm, int32_t n, int32_t rounds) {
  return time_calls(vm, n, rounds, [](Timing& t, const std::function<void()>& call) {
    const auto start = Clock::now();
    call();
    t.us.push_back(us_since(start));
  });
}

#ifdef GRANULE_HAVE_CUDA
// Busy: before each call, a memset of busy_bytes is launched; the call is timed, then the
// stream is asked whether the memset is still running. A call that waited for the GPU
// returns only after the memset ends (and takes about as long as it).
std::vector<Timing> time_busy(VirtualMemory& vm, int32_t n, uint64_t busy_bytes,
                              double* memset_us) {
  MemoryManager scratch(std::numeric_limits<uint64_t>::max() / 2);
  cuda::DeviceBuffer buffer(scratch, MemoryCategory::Workspace, busy_bytes);
  cuda::CudaStream stream;
  auto launch = [&] {
    cuda::check_cuda(cudaMemsetAsync(buffer.get(), 1, busy_bytes, stream.get()), "cudaMemsetAsync");
  };
  auto sync = [&] { cuda::check_cuda(cudaStreamSynchronize(stream.get()), "sync"); };
  // How long the memset alone takes.
  launch();
  sync();
  const auto start = Clock::now();
  launch();
  sync();
  *memset_us = us_since(start);

  return time_calls(vm, n, 1, [&](Timing& t, const std::function<void()>& call) {
    launch();
    const auto at = Clock::now();
    call();
    t.us.push_back(us_since(at));
    if (t.busy_after < 0) t.busy_after = 0;
    if (cudaStreamQuery(stream.get()) == cudaErrorNotReady) ++t.busy_after;
    sync();
  });
}
#endif

}  // namespace

void add_vmm_bench_options(CLI::App& command, VmmBenchOptions& o) {
  command.add_option("--device", o.device, "cuda or host")->check(CLI::IsMember({"cuda", "host"}));
  command.add_option("--granules", o.granules, "granules per round")->check(CLI::Range(1, 4096));
  command.add_option("--rounds", o.rounds, "rounds of create/map/unmap/destroy")
      ->check(CLI::Range(1, 1000));
  command.add_option("--busy-mib", o.busy_mib,
                     "device memset per call in the GPU-busy case (0 = skip)");
  command.add_flag("--json", o.json, "print JSON instead of the table");
}

int run_vmm_benchmark(const VmmBenchOptions& o) {
  try {
    std::unique_ptr<VirtualMemory> vm;
    std::string device = "host memory";
    if (o.device == "cuda") {
#ifdef GRANULE_HAVE_CUDA
      std::string why;
      if (!cuda::cuda_available(&why)) throw DeviceError(why);
      cuda::check_cuda(cudaSetDevice(0), "cudaSetDevice");
      cudaDeviceProp prop{};
      cuda::check_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
      device = std::string("CUDA ") + prop.name;
      vm = cuda::make_cuda_virtual_memory(0);
#else
      throw UnsupportedError("this build of granule-bench has no CUDA; use --device host");
#endif
    } else {
      vm = make_host_virtual_memory();
    }
    const std::vector<Timing> idle = time_idle(*vm, o.granules, o.rounds);
    std::vector<Timing> busy;
    double memset_us = 0;
#ifdef GRANULE_HAVE_CUDA
    if (o.device == "cuda" && o.busy_mib > 0)
      busy = time_busy(*vm, o.granules, o.busy_mib << 20, &memset_us);
#endif
    if (o.json) {
      nlohmann::json j;
      j["device"] = device;
      j["granule_bytes"] = vm->granule_bytes();
      for (const Timing& t : idle)
        j["idle"].push_back({{"call", t.call},
                             {"median_us", t.percentile(0.5)},
                             {"p99_us", t.percentile(0.99)},
                             {"calls", t.us.size()}});
      for (const Timing& t : busy)
        j["gpu_busy"].push_back({{"call", t.call},
                                 {"median_us", t.percentile(0.5)},
                                 {"p99_us", t.percentile(0.99)},
                                 {"calls", t.us.size()},
                                 {"returned_while_busy", t.busy_after}});
      j["busy_memset_us"] = memset_us;
      std::cout << j.dump(2) << "\n";
      return 0;
    }
    std::printf("KV granule operations on %s, granule %.1f MiB, %d granules x %d rounds\n\n",
                device.c_str(), static_cast<double>(vm->granule_bytes()) / (1 << 20), o.granules,
                o.rounds);
    std::printf("| %-12s | %10s | %10s |", "call", "median us", "p99 us");
    if (!busy.empty())
      std::printf(" %15s | %15s | %20s |", "GPU busy: median", "GPU busy: p99",
                  "returned while busy");
    std::printf("\n|--------------|------------|------------|%s\n",
                busy.empty() ? "" : "-----------------|-----------------|----------------------|");
    for (size_t i = 0; i < idle.size(); ++i) {
      std::printf("| %-12s | %10.1f | %10.1f |", idle[i].call.c_str(), idle[i].percentile(0.5),
                  idle[i].percentile(0.99));
      if (!busy.empty())
        std::printf(" %16.1f | %15.1f | %14d of %4zu |", busy[i].percentile(0.5),
                    busy[i].percentile(0.99), busy[i].busy_after, busy[i].us.size());
      std::printf("\n");
    }
    const double with_pool = idle[1].percentile(0.5) + idle[2].percentile(0.5);
    const double without = with_pool + idle[0].percentile(0.5) + idle[3].percentile(0.5);
    std::printf(
        "\nper granule on a step's path (medians): %.1f us from the pool (map + unmap), %.1f us "
        "without (create + map + unmap + destroy)\n",
        with_pool, without);
    if (!busy.empty())
      std::printf(
          "GPU busy: each call made right after launching a %llu MiB memset (%.0f us alone); a "
          "call\n"
          "  that returned while the memset still ran did not wait for the GPU.\n",
          static_cast<unsigned long long>(o.busy_mib), memset_us);
    return 0;
  } catch (const Error& e) {
    std::cerr << "granule-bench vmm: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace granule
