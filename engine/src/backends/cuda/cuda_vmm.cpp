// CudaVirtualMemory: a physical granule is one cuMemCreate allocation handle; a table keyed
// by address remembers which handle is mapped where; map() sets access once per run; fences
// are events recorded on the streams whose work may touch the KV.
#include "backends/cuda/cuda_vmm.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/cuda/cuda_check.h"
#include "granule/error.h"
#include "granule/log.h"

namespace granule::cuda {
namespace {

struct DriverVmm {
  decltype(&cuMemGetAllocationGranularity) get_granularity = nullptr;
  decltype(&cuMemAddressReserve) address_reserve = nullptr;
  decltype(&cuMemAddressFree) address_free = nullptr;
  decltype(&cuMemCreate) create = nullptr;
  decltype(&cuMemRelease) release = nullptr;
  decltype(&cuMemMap) map = nullptr;
  decltype(&cuMemUnmap) unmap = nullptr;
  decltype(&cuMemSetAccess) set_access = nullptr;

  static const DriverVmm& get() {
    static DriverVmm vmm;
    static std::once_flag once;
    static std::string error;
    std::call_once(once, [] {
      try {
        vmm.load();
      } catch (const Error& e) {
        error = e.what();
      }
    });
    if (!error.empty()) throw DeviceError(error);
    return vmm;
  }

 private:
  template <typename F>
  static void entry(const char* name, F& fn) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess || !p)
      throw DeviceError(std::string("the CUDA driver has no ") + name +
                        " (virtual memory management)");
    fn = reinterpret_cast<F>(p);
  }
  void load() {
    entry("cuMemGetAllocationGranularity", get_granularity);
    entry("cuMemAddressReserve", address_reserve);
    entry("cuMemAddressFree", address_free);
    entry("cuMemCreate", create);
    entry("cuMemRelease", release);
    entry("cuMemMap", map);
    entry("cuMemUnmap", unmap);
    entry("cuMemSetAccess", set_access);
  }
};

void check_cu(CUresult r, const char* what) {
  if (r == CUDA_ERROR_OUT_OF_MEMORY)
    throw CapacityError(std::string("the GPU has no memory left for KV (") + what + ")");
  if (r == CUDA_SUCCESS) return;
  const std::string message =
      std::string("CUDA driver error ") + std::to_string(static_cast<int>(r)) + " in " + what;
  // The driver's codes for the sticky errors equal the runtime's (700 is an illegal address
  // in both).
  if (is_sticky_error(static_cast<cudaError_t>(r))) {
    note_device_lost(message);
    throw DeviceLostError("the GPU stopped working (" + message + "); reload the model");
  }
  throw DeviceError(message);
}

class CudaVirtualMemory final : public VirtualMemory {
 public:
  CudaVirtualMemory(int device, std::vector<cudaStream_t> streams)
      : vmm_(DriverVmm::get()), streams_(std::move(streams)) {
    if (streams_.empty()) streams_.push_back(cudaStreamLegacy);
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = device;
    access_.location = prop_.location;
    access_.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    size_t granularity = 0;
    check_cu(vmm_.get_granularity(&granularity, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
             "cuMemGetAllocationGranularity");
    granule_bytes_ = granularity;
  }

  ~CudaVirtualMemory() override {
    // KvSpace decommits everything before unreserving; anything left is released here, after
    // the work that may touch it.
    if (!handles_.empty()) fence_wait(fence());
    for (auto& [addr, handle] : handles_) {
      vmm_.unmap(addr, granule_bytes_);
      vmm_.release(handle);
    }
    for (const Ticket& t : pending_)
      for (cudaEvent_t e : t.events) cudaEventDestroy(e);
    for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
  }

  uint64_t fence() override {
    Ticket ticket{++last_ticket_, {}};
    for (cudaStream_t stream : streams_) {
      cudaEvent_t event = take_event();
      cudaError_t status = event ? cudaEventRecord(event, stream) : cudaErrorMemoryAllocation;
      if (status != cudaSuccess) {
        // No event to wait on: wait for the device instead. Either its work completes, or
        // the context is lost and nothing more runs; the unmap is safe either way.
        if (event) spare_events_.push_back(event);
        for (cudaEvent_t e : ticket.events) spare_events_.push_back(e);
        const cudaError_t sync = cudaDeviceSynchronize();
        logger("engine.cuda")
            ->warn("recording a KV fence failed ({}); waited for the device instead ({})",
                   cudaGetErrorString(status), cudaGetErrorString(sync));
        cudaGetLastError();  // a non-sticky error must not reach the next unrelated check
        completed_ = std::max(completed_, ticket.id);
        return ticket.id;
      }
      ticket.events.push_back(event);
    }
    pending_.push_back(std::move(ticket));
    return last_ticket_;
  }

  bool fence_passed(uint64_t ticket) override { return settle(ticket, false); }
  void fence_wait(uint64_t ticket) override { settle(ticket, true); }

  uint64_t granule_bytes() const override { return granule_bytes_; }

  uint8_t* reserve(uint64_t bytes) override {
    CUdeviceptr base = 0;
    check_cu(vmm_.address_reserve(&base, bytes, granule_bytes_, 0, 0), "cuMemAddressReserve");
    return reinterpret_cast<uint8_t*>(base);
  }

  void unreserve(uint8_t* base, uint64_t bytes) override {
    const CUresult r = vmm_.address_free(reinterpret_cast<CUdeviceptr>(base), bytes);
    if (r != CUDA_SUCCESS)
      logger("engine.cuda")->warn("cuMemAddressFree failed: {}", static_cast<int>(r));
  }

  Physical create() override {
    CUmemGenericAllocationHandle handle{};
    check_cu(vmm_.create(&handle, granule_bytes_, &prop_, 0), "cuMemCreate");
    return static_cast<Physical>(handle);
  }

  void destroy(Physical granule) noexcept override {
    const CUresult r = vmm_.release(static_cast<CUmemGenericAllocationHandle>(granule));
    if (r != CUDA_SUCCESS)
      logger("engine.cuda")->error("cuMemRelease of a KV granule failed: {}", static_cast<int>(r));
  }

  void map(uint8_t* addr, std::span<const Physical> granules) override {
    const CUdeviceptr start = reinterpret_cast<CUdeviceptr>(addr);
    size_t done = 0;
    try {
      for (; done < granules.size(); ++done) {
        const CUdeviceptr at = start + done * granule_bytes_;
        const auto handle = static_cast<CUmemGenericAllocationHandle>(granules[done]);
        check_cu(vmm_.map(at, granule_bytes_, 0, handle, 0), "cuMemMap");
        handles_[at] = handle;
      }
      // One access call for the whole run of granules.
      check_cu(vmm_.set_access(start, granules.size() * granule_bytes_, &access_, 1),
               "cuMemSetAccess");
    } catch (...) {
      std::vector<Physical> undone;
      try {
        unmap(addr, done, undone);
      } catch (const std::exception& e) {
        logger("engine.cuda")->error("undoing a failed KV map: {}", e.what());
      }
      throw;
    }
  }

  void unmap(uint8_t* addr, uint64_t count, std::vector<Physical>& out) override {
    const CUdeviceptr start = reinterpret_cast<CUdeviceptr>(addr);
    for (uint64_t i = count; i-- > 0;) {
      const CUdeviceptr at = start + i * granule_bytes_;
      auto it = handles_.find(at);
      if (it == handles_.end()) throw UsageError("unmap of a KV granule that is not mapped");
      check_cu(vmm_.unmap(at, granule_bytes_), "cuMemUnmap");
      out.push_back(static_cast<Physical>(it->second));
      handles_.erase(it);
    }
  }

 private:
  struct Ticket {
    uint64_t id = 0;
    std::vector<cudaEvent_t> events;  // one per stream, recorded in fence()
  };

  cudaEvent_t take_event() {
    if (!spare_events_.empty()) {
      cudaEvent_t e = spare_events_.back();
      spare_events_.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    return e;
  }

  // Whether every ticket up to `ticket` has completed, retiring those that have (in order:
  // each ticket's events follow the earlier ones' on every stream). With `wait`, blocks.
  bool settle(uint64_t ticket, bool wait) {
    while (completed_ < ticket && !pending_.empty()) {
      Ticket& front = pending_.front();
      for (cudaEvent_t e : front.events) {
        const cudaError_t status = wait ? cudaEventSynchronize(e) : cudaEventQuery(e);
        if (status == cudaErrorNotReady) return false;
        if (status != cudaSuccess) {
          // An error from earlier device work: a lost context runs nothing more, so nothing
          // can touch the memory any longer.
          if (!reported_error_)
            logger("engine.cuda")
                ->error("device error while waiting for KV work: {}", cudaGetErrorString(status));
          reported_error_ = true;
        }
      }
      completed_ = front.id;
      spare_events_.insert(spare_events_.end(), front.events.begin(), front.events.end());
      pending_.pop_front();
    }
    return true;
  }

  const DriverVmm& vmm_;
  std::vector<cudaStream_t> streams_;
  uint64_t last_ticket_ = 0;
  uint64_t completed_ = 0;  // every ticket up to this one has passed
  std::deque<Ticket> pending_;
  std::vector<cudaEvent_t> spare_events_;
  bool reported_error_ = false;
  CUmemAllocationProp prop_{};
  CUmemAccessDesc access_{};
  uint64_t granule_bytes_ = 0;
  std::unordered_map<CUdeviceptr, CUmemGenericAllocationHandle> handles_;
};

}  // namespace

std::unique_ptr<VirtualMemory> make_cuda_virtual_memory(int device,
                                                        std::vector<cudaStream_t> streams) {
  return std::make_unique<CudaVirtualMemory>(device, std::move(streams));
}

}  // namespace granule::cuda
