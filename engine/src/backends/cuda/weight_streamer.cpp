// WeightStreamer: moving layers between device buffers and pinned host blobs, and the event
// protocol of a pass (fork, copy j into slot j % S, wait before layer, free after it, join).
#include "backends/cuda/weight_streamer.h"

#include <algorithm>

#include "backends/cuda/cuda_check.h"
#include "granule/error.h"
#include "granule/log.h"

namespace granule::cuda {

WeightStreamer::WeightStreamer(MemoryManager& memory, const WeightLayout& layout)
    : memory_(memory),
      layout_(layout),
      layer_bytes_(layout.sizes().layer_bytes),
      resident_(layer_bytes_.size()),
      host_(layer_bytes_.size()),
      ordinal_(layer_bytes_.size(), -1),
      split_(layer_bytes_.size()) {}

WeightStreamer::~WeightStreamer() {
  // The copy stream may still be carrying a pass; its buffers go after it.
  cudaStreamSynchronize(copy_stream_.get());
  cudaGetLastError();
}

void WeightStreamer::upload_resident(size_t layer) {
  // Through a pinned blob, so the copy runs at full speed; freed right after.
  PinnedBuffer blob(layer_bytes_[layer]);
  layout_.layers[layer].write(blob.as<uint8_t>());
  check_cuda(cudaMemcpy(resident_[layer].get(), blob.as<uint8_t>(), layer_bytes_[layer],
                        cudaMemcpyHostToDevice),
             "uploading weights");
}

bool WeightStreamer::apply(const PlacementPlan& plan, cudaStream_t compute) {
  const size_t n = layer_bytes_.size();
  if (plan.layer_streamed.size() != n)
    throw UsageError("weight placement: a plan for " + std::to_string(plan.layer_streamed.size()) +
                     " layers, the model has " + std::to_string(n));
  check_cuda(cudaStreamSynchronize(compute), "cudaStreamSynchronize");
  copy_stream_.synchronize();
  bool changed = !placed_;

  // Demotions (and, at load, every streamed layer): device blob → pinned host blob.
  for (size_t i = 0; i < n; ++i) {
    if (!plan.layer_streamed[i] || host_[i].as<uint8_t>()) continue;
    PinnedBuffer blob(layer_bytes_[i]);
    if (resident_[i].get()) {
      check_cuda(cudaMemcpy(blob.as<uint8_t>(), resident_[i].get(), layer_bytes_[i],
                            cudaMemcpyDeviceToHost),
                 "moving a layer to host memory");
      resident_[i].reset();
    } else {
      layout_.layers[i].write(blob.as<uint8_t>());
    }
    host_[i] = std::move(blob);
    changed = true;
  }
  // The ring grows before promotions (it never needs to shrink while anything streams).
  if (plan.staging_slots > slots_ || plan.staging_slot_bytes > slot_bytes_) {
    staging_.reset();
    slots_ = 0;
    staging_ = DeviceBuffer(memory_, MemoryCategory::WeightsStaging,
                            static_cast<size_t>(plan.staging_slots) * plan.staging_slot_bytes);
    slots_ = plan.staging_slots;
    slot_bytes_ = plan.staging_slot_bytes;
    changed = true;
  }
  // Promotions (and, at load, every resident layer). A refusal after load keeps it streamed.
  for (size_t i = 0; i < n; ++i) {
    if (plan.layer_streamed[i] || resident_[i].get()) continue;
    try {
      resident_[i] = DeviceBuffer(memory_, MemoryCategory::WeightsResident, layer_bytes_[i]);
    } catch (const CapacityError&) {
      if (!placed_) throw;
      logger("engine.cuda")->warn("layer {} stays streamed: the budget refused it", i);
      continue;
    }
    if (host_[i].as<uint8_t>()) {
      check_cuda(cudaMemcpy(resident_[i].get(), host_[i].as<uint8_t>(), layer_bytes_[i],
                            cudaMemcpyHostToDevice),
                 "moving a layer to device memory");
      host_[i].reset();
    } else {
      upload_resident(i);
    }
    changed = true;
  }

  order_.clear();
  streamed_bytes_ = 0;
  for (size_t i = 0; i < n; ++i) {
    ordinal_[i] = -1;
    if (resident_[i].get()) continue;
    ordinal_[i] = static_cast<int32_t>(order_.size());
    order_.push_back(i);
    streamed_bytes_ += layer_bytes_[i];
  }
  if (order_.empty() && staging_.get()) {
    staging_.reset();
    slots_ = 0;
    slot_bytes_ = 0;
  }
  while (copied_.size() < order_.size()) {
    copied_.push_back(std::make_unique<CudaEvent>());
    slot_free_.push_back(std::make_unique<CudaEvent>());
  }
  plan_ = plan;
  plan_.layer_streamed.assign(n, false);
  for (size_t i : order_) plan_.layer_streamed[i] = true;
  plan_.streamed_layers = streamed_layers();
  plan_.resident_layers = resident_layers();
  plan_.streamed_bytes_per_pass = streamed_bytes_;
  placed_ = true;
  return changed;
}

const uint8_t* WeightStreamer::layer_base(size_t layer) const {
  if (ordinal_[layer] < 0) return resident_[layer].as<uint8_t>();
  return staging_.as<uint8_t>() +
         static_cast<size_t>(ordinal_[layer] % slots_) * static_cast<size_t>(slot_bytes_);
}

int32_t WeightStreamer::resident_layers() const {
  return static_cast<int32_t>(layer_bytes_.size() - order_.size());
}

uint64_t WeightStreamer::resident_bytes() const {
  uint64_t bytes = 0;
  for (const DeviceBuffer& b : resident_) bytes += b.bytes();
  return bytes;
}

uint64_t WeightStreamer::split_bytes_per_pass() const {
  uint64_t bytes = 0;
  for (size_t layer : order_) {
    if (split_[layer].empty()) {
      bytes += layer_bytes_[layer];
      continue;
    }
    for (const CopyRange& r : split_[layer]) bytes += r.bytes;
  }
  return bytes;
}

void WeightStreamer::set_split_copies(size_t layer, std::vector<CopyRange> ranges) {
  for (const CopyRange& r : ranges)
    if (r.offset + r.bytes > layer_bytes_[layer])
      throw UsageError("weight streaming: a split copy past layer " + std::to_string(layer) +
                       "'s blob");
  split_[layer] = std::move(ranges);
}

int WeightStreamer::copy(size_t ordinal) {
  const size_t layer = order_[ordinal];
  uint8_t* slot = staging_.as<uint8_t>() +
                  (ordinal % static_cast<size_t>(slots_)) * static_cast<size_t>(slot_bytes_);
  const uint8_t* host = host_[layer].as<uint8_t>();
  int copies = 0;
  if (split_pass_ && !split_[layer].empty()) {
    // The device's rows of each matrix only; the rest of the slot keeps whatever it held (the
    // kernels of a split pass read none of it).
    for (const CopyRange& r : split_[layer]) {
      if (r.bytes == 0) continue;
      check_cuda(cudaMemcpyAsync(slot + r.offset, host + r.offset, r.bytes, cudaMemcpyHostToDevice,
                                 copy_stream_.get()),
                 "streaming a layer's device rows");
      ++copies;
    }
  } else {
    check_cuda(cudaMemcpyAsync(slot, host, layer_bytes_[layer], cudaMemcpyHostToDevice,
                               copy_stream_.get()),
               "streaming a layer");
    copies = 1;
  }
  check_cuda(cudaEventRecord(copied_[ordinal]->get(), copy_stream_.get()), "cudaEventRecord");
  return copies;
}

int WeightStreamer::begin_pass(cudaStream_t compute, bool split) {
  split_pass_ = split;
  if (order_.empty()) return 0;
  check_cuda(cudaEventRecord(fork_.get(), compute), "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(copy_stream_.get(), fork_.get(), 0), "cudaStreamWaitEvent");
  const size_t first = std::min(order_.size(), static_cast<size_t>(slots_));
  int copies = 0;
  for (size_t j = 0; j < first; ++j) copies += copy(j);
  return copies;
}

void WeightStreamer::before_layer(size_t layer, cudaStream_t compute) {
  const int32_t j = ordinal_[layer];
  if (j < 0) return;
  check_cuda(cudaStreamWaitEvent(compute, copied_[static_cast<size_t>(j)]->get(), 0),
             "cudaStreamWaitEvent");
}

int WeightStreamer::after_layer(size_t layer, cudaStream_t compute) {
  const int32_t j = ordinal_[layer];
  if (j < 0) return 0;
  const size_t next = static_cast<size_t>(j) + static_cast<size_t>(slots_);
  if (next >= order_.size()) return 0;
  check_cuda(cudaEventRecord(slot_free_[static_cast<size_t>(j)]->get(), compute),
             "cudaEventRecord");
  check_cuda(cudaStreamWaitEvent(copy_stream_.get(), slot_free_[static_cast<size_t>(j)]->get(), 0),
             "cudaStreamWaitEvent");
  return copy(next);
}

}  // namespace granule::cuda
