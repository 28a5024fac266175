// What Gemma 4's layers need beside the layer blobs (cuda_gemma4.cpp): the per-layer embeddings'
// matrices and norms (on the device), their token table (in pinned, mapped host memory), each
// layer's output scale, and the per-layer inputs of a pass.
#pragma once
#include <cstdint>
#include <vector>

#include "backends/cuda/cuda_model.h"

namespace granule::cuda {

// Pinned host memory charged to the ledger's HostPinned category while held (never to the
// device budget): the device reads it in place through its mapped address.
class MappedHostBuffer {
 public:
  MappedHostBuffer() = default;
  MappedHostBuffer(MemoryManager& memory, size_t bytes);
  ~MappedHostBuffer() { reset(); }
  MappedHostBuffer(MappedHostBuffer&& other) noexcept { *this = std::move(other); }
  MappedHostBuffer& operator=(MappedHostBuffer&& other) noexcept;
  MappedHostBuffer(const MappedHostBuffer&) = delete;
  MappedHostBuffer& operator=(const MappedHostBuffer&) = delete;
  void reset();

  uint8_t* host() const { return host_.as<uint8_t>(); }
  const uint8_t* device() const { return device_; }  // the same bytes, as kernels address them
  size_t bytes() const { return host_.bytes(); }

 private:
  MemoryManager* memory_ = nullptr;
  PinnedBuffer host_;
  const uint8_t* device_ = nullptr;
};

struct Gemma4Device {
  DeviceBuffer matrices;  // the per-layer embedding matrices, resident (WeightsResident)
  DeviceBuffer vectors;   // per_layer_proj_norm, then each layer's per_layer_post_norm (f32)
  // The token table (per_layer_token_embd: n_vocab rows of n_layer * n_pl) in pinned, mapped
  // host memory: a pass gathers its tokens' rows through PCIe (a row is a few KiB); none of it
  // takes device memory. table_on_device holds it there instead (a test's resident form).
  MappedHostBuffer table_host;
  DeviceBuffer table_on_device;
  DeviceMatrix token_table;              // its data: table_host's device address or table_on_device
  int64_t slice_row_bytes = 0;           // the bytes of one layer's n_pl values; 0: gathered whole
  DeviceMatrix model_proj;               // per_layer_model_proj: n_embd -> n_layer * n_pl
  std::vector<DeviceMatrix> gate, proj;  // per layer: n_embd -> n_pl, n_pl -> n_embd
  const float* proj_norm = nullptr;
  std::vector<const float*> post_norm;  // per layer
  std::vector<float> out_scale;         // per layer, 1 where the file has none
  // Workspace (the list's "ple_inputs" and "ple_scratch"): a pass's per-layer inputs
  // [rows][n_layer][n_pl], and the gathered table rows (then, per layer, the gate's output) of as
  // many floats.
  DeviceBuffer inputs, scratch;
};

}  // namespace granule::cuda
