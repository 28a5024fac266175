// RAII owners of CUDA resources: device buffers charged to the MemoryManager's ledger by
// category, pinned host buffers, streams, events and instantiated graphs. No raw cudaFree
// (or cudaStreamDestroy, ...) happens outside these.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "memory/memory_manager.h"

namespace granule::cuda {

// Device memory charged to `category`; throws CapacityError when the budget refuses it and
// DeviceError when cudaMalloc fails.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(MemoryManager& memory, MemoryCategory category, size_t bytes);
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void reset();
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  MemoryManager* memory_ = nullptr;
  MemoryCategory category_ = MemoryCategory::Other;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory (uploads and token downloads); not device memory, not charged.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer() { reset(); }
  PinnedBuffer(PinnedBuffer&& other) noexcept { *this = std::move(other); }
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void reset();
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  // The device's address of this memory (mapped under unified addressing), for kernels that read
  // or write host memory in place.
  template <typename T>
  T* device_as() const {
    return static_cast<T*>(device_pointer());
  }
  size_t bytes() const { return bytes_; }

 private:
  void* device_pointer() const;

  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

class CudaStream {
 public:
  // Non-blocking; `priority` as cudaStreamCreateWithPriority takes it (lower runs first; 0 is
  // the default and the least).
  explicit CudaStream(int priority = 0);
  ~CudaStream();
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return stream_; }
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

class CudaEvent {
 public:
  CudaEvent();
  ~CudaEvent();
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// An instantiated graph (from a stream capture); owns the graph and its executable.
class CudaGraph {
 public:
  CudaGraph() = default;
  CudaGraph(cudaGraph_t graph, cudaGraphExec_t exec) : graph_(graph), exec_(exec) {}
  ~CudaGraph() { reset(); }
  CudaGraph(CudaGraph&& other) noexcept { *this = std::move(other); }
  CudaGraph& operator=(CudaGraph&& other) noexcept;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  void reset();
  void launch(cudaStream_t stream) const;
  size_t node_count() const;
  explicit operator bool() const { return exec_ != nullptr; }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace granule::cuda
