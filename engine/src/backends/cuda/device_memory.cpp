// RAII owners of CUDA resources; destructors log instead of throwing.
#include "backends/cuda/device_memory.h"

#include "backends/cuda/cuda_check.h"
#include "granule/error.h"
#include "granule/log.h"

namespace granule::cuda {
namespace {

void log_teardown_error(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    logger("engine.cuda")->warn("{} failed during teardown: {}", what, cudaGetErrorString(status));
}

}  // namespace

DeviceBuffer::DeviceBuffer(MemoryManager& memory, MemoryCategory category, size_t bytes)
    : memory_(&memory), category_(category), bytes_(bytes) {
  if (bytes == 0) return;
  memory.charge(category, bytes);
  const cudaError_t status = cudaMalloc(&ptr_, bytes);
  if (status != cudaSuccess) {
    memory.release(category, bytes);
    ptr_ = nullptr;
    bytes_ = 0;
    throw DeviceError("cannot allocate " + std::to_string(bytes >> 20) + " MiB of GPU memory for " +
                      std::string(memory_category_name(category)) + ": " +
                      cudaGetErrorString(status));
  }
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    memory_ = std::exchange(other.memory_, nullptr);
    category_ = other.category_;
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (ptr_) {
    log_teardown_error(cudaFree(ptr_), "cudaFree");
    memory_->release(category_, bytes_);
  }
  ptr_ = nullptr;
  bytes_ = 0;
}

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  check_cuda(cudaMallocHost(&ptr_, bytes), "cudaMallocHost");
}

void* PinnedBuffer::device_pointer() const {
  void* device = nullptr;
  check_cuda(cudaHostGetDevicePointer(&device, ptr_, 0), "cudaHostGetDevicePointer");
  return device;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void PinnedBuffer::reset() {
  if (ptr_) log_teardown_error(cudaFreeHost(ptr_), "cudaFreeHost");
  ptr_ = nullptr;
  bytes_ = 0;
}

CudaStream::CudaStream(int priority) {
  check_cuda(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority),
             "cudaStreamCreate");
}
CudaStream::~CudaStream() {
  if (stream_) log_teardown_error(cudaStreamDestroy(stream_), "cudaStreamDestroy");
}
void CudaStream::synchronize() const {
  check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

CudaEvent::CudaEvent() { check_cuda(cudaEventCreate(&event_), "cudaEventCreate"); }
CudaEvent::~CudaEvent() {
  if (event_) log_teardown_error(cudaEventDestroy(event_), "cudaEventDestroy");
}

CudaGraph& CudaGraph::operator=(CudaGraph&& other) noexcept {
  if (this != &other) {
    reset();
    graph_ = std::exchange(other.graph_, nullptr);
    exec_ = std::exchange(other.exec_, nullptr);
  }
  return *this;
}

void CudaGraph::reset() {
  if (exec_) log_teardown_error(cudaGraphExecDestroy(exec_), "cudaGraphExecDestroy");
  if (graph_) log_teardown_error(cudaGraphDestroy(graph_), "cudaGraphDestroy");
  exec_ = nullptr;
  graph_ = nullptr;
}

void CudaGraph::launch(cudaStream_t stream) const {
  check_cuda(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
}

size_t CudaGraph::node_count() const {
  size_t n = 0;
  if (graph_) cudaGraphGetNodes(graph_, nullptr, &n);
  return n;
}

}  // namespace granule::cuda
