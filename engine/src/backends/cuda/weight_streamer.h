// WeightStreamer: where each layer's weights live on the CUDA backend, and the copies that
// bring streamed layers in. A layer is one blob (its seven matrices in the upload layout:
// memory/weight_layout.h's LayerWeightLayout); a resident layer's blob has its own device
// buffer, a streamed layer's blob sits in pinned host memory and is copied, for every forward
// pass, into one of a ring of device staging slots. The copies run on a copy stream and are ordered
// with the compute stream by events only (fork, per-layer "copied" and "slot free", join), so the
// same calls work eagerly and inside a stream capture: a decode graph holds its copies.
// A split pass (HostRows, host_rows.h: the host computes the last rows of a layer's matrices)
// copies only the ranges set for a layer with set_split_copies(), one copy per range.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/device_memory.h"
#include "memory/host_row_split.h"
#include "memory/memory_manager.h"
#include "memory/placement.h"
#include "memory/weight_layout.h"

namespace granule::cuda {

class WeightStreamer {
 public:
  using CopyRange = BlobRange;  // bytes of a layer's blob (memory/host_row_split.h)

  // The layers of `layout` (which outlives the streamer), none placed until apply().
  WeightStreamer(MemoryManager& memory, const WeightLayout& layout);
  ~WeightStreamer();

  // Moves layers to match `plan` (made for these layer sizes): demotions first (device →
  // pinned host, then the device buffer is freed), the staging ring, then promotions. Waits
  // for `compute` and the copy stream first, so nothing in flight reads a moved blob. A
  // promotion the budget refuses leaves that layer streamed. Returns true when anything moved
  // (every captured graph holding the old addresses is then stale).
  bool apply(const PlacementPlan& plan, cudaStream_t compute);

  // The device address of a layer's blob for the kernels: its own buffer, or its staging slot.
  const uint8_t* layer_base(size_t layer) const;
  bool streamed(size_t layer) const { return ordinal_[layer] >= 0; }
  size_t layers() const { return layer_bytes_.size(); }
  const std::vector<uint64_t>& layer_bytes() const { return layer_bytes_; }
  int32_t resident_layers() const;
  int32_t streamed_layers() const { return static_cast<int32_t>(order_.size()); }
  int32_t staging_slots() const { return slots_; }
  uint64_t staging_bytes() const { return staging_.bytes(); }
  uint64_t resident_bytes() const;
  uint64_t streamed_bytes_per_pass() const { return streamed_bytes_; }
  // What a split pass copies: the ranges of the streamed layers that have them, the whole blob
  // of the others.
  uint64_t split_bytes_per_pass() const;
  // The ranges a split pass copies of `layer` (within its blob); empty: the whole blob. Kept
  // across apply(): they take effect while the layer streams.
  void set_split_copies(size_t layer, std::vector<CopyRange> ranges);
  bool split_copies(size_t layer) const { return !split_[layer].empty(); }
  // The plan last applied (max_resident_layers is where pressure has capped it).
  const PlacementPlan& plan() const { return plan_; }

  // One forward pass, issued on `compute` (eagerly or while it is being captured):
  // begin_pass() forks the copy stream and starts the first copies; before_layer() makes the
  // compute stream wait for a streamed layer's copy; after_layer() frees its slot for the
  // copy `slots` layers ahead. The last streamed layer's wait joins the copy stream back.
  // Returns the copies (host-issued operations when eager) this pass queued. `split`: a split
  // pass (set_split_copies' ranges where a layer has them).
  int begin_pass(cudaStream_t compute, bool split = false);
  void before_layer(size_t layer, cudaStream_t compute);
  int after_layer(size_t layer, cudaStream_t compute);

 private:
  int copy(size_t ordinal);
  void upload_resident(size_t layer);

  MemoryManager& memory_;
  const WeightLayout& layout_;
  std::vector<uint64_t> layer_bytes_;
  PlacementPlan plan_;
  std::vector<DeviceBuffer> resident_;         // per layer; empty when streamed
  std::vector<PinnedBuffer> host_;             // per layer; empty when resident
  std::vector<int32_t> ordinal_;               // per layer: index among the streamed, or -1
  std::vector<size_t> order_;                  // streamed layers, ascending
  std::vector<std::vector<CopyRange>> split_;  // per layer: a split pass's ranges
  bool split_pass_ = false;                    // the pass begun last is a split one
  uint64_t streamed_bytes_ = 0;
  DeviceBuffer staging_;
  int32_t slots_ = 0;
  uint64_t slot_bytes_ = 0;
  CudaStream copy_stream_;
  CudaEvent fork_;
  std::vector<std::unique_ptr<CudaEvent>> copied_, slot_free_;  // per streamed ordinal
  bool placed_ = false;
};

}  // namespace granule::cuda
