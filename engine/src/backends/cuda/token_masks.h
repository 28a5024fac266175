// TokenMasks: the token masks of structured output on their way to the device sampler. The host
// fills a table in pinned memory ([rows] of a header word and the row's bitmask, two epochs in
// front) while the device runs the step's forward pass; the step's mask launch waits for the
// host's epoch, copies the rows it masks to device memory by DMA and masks the logits there
// (kernels/sampling.cuh, launch_token_mask).
//
// No double buffer is needed: the host writes the table only between arm() and publish() (or
// release_unpublished()) of a step, and the copy of that step's rows runs only after the
// device saw publish()'s epoch; the next step's rows are written after wait() returned, behind
// the copy. A wait that gave up lets its copy run while the host may still write, and that
// step's mask kernel then masks nothing (the device's status says the wait gave up).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "backends/cuda/device_memory.h"
#include "sampling.cuh"

namespace granule::cuda {

class TokenMasks {
 public:
  // Room for `rows` mask rows of `n_vocab` bits each in host memory, copied for one launch at a
  // time into `device` (at least workspace::token_mask_device_bytes(n_vocab) bytes of device
  // memory, owned by the caller: the CUDA model's "token_masks" workspace buffer).
  TokenMasks(int rows, int64_t n_vocab, const DeviceBuffer& device);
  TokenMasks(const TokenMasks&) = delete;
  TokenMasks& operator=(const TokenMasks&) = delete;

  int rows() const { return rows_; }
  // The most logit rows one enqueue() masks (the device copy's rows).
  int device_rows() const { return device_.device_row_count; }

  // Before a masked step is launched: a new epoch, which the step's mask kernels wait for.
  void arm();
  // The armed step's masks: rows[i] (ceil(n_vocab / 32) words) for mask row i, null where row
  // i draws unmasked; rows past the span draw unmasked. Publishes them: the device goes on.
  void publish(std::span<const uint32_t* const> rows);
  // Publishes the armed step with no row masked, when it was not published (a step abandoned
  // between launch and wait, or waited for without masks): the device must never wait for a
  // host that has moved on. Returns whether it had to.
  bool release_unpublished();
  bool armed_unpublished() const { return wanted() != ready(); }
  // Queues the wait for the publication, the copy of mask rows [first_mask_row, first_mask_row
  // + rows) to the device and the masking of `rows` logit rows, capturable. rows <=
  // device_rows().
  void enqueue(float* logits, int64_t logits_stride, int rows, int n_vocab, int first_mask_row,
               cudaStream_t stream) const;
  // Whether a wait gave up since the last call (the step then drew unmasked).
  bool take_timed_out();

 private:
  struct Header {
    uint32_t ready = 0, wanted = 0, timed_out = 0, unused = 0;
  };
  static_assert(sizeof(Header) == 16);
  Header* header() const { return table_.as<Header>(); }
  uint8_t* row(size_t r) const {
    return table_.as<uint8_t>() + sizeof(Header) + r * static_cast<size_t>(device_.row_bytes);
  }
  uint32_t ready() const;
  uint32_t wanted() const;

  int rows_ = 0;
  size_t words_per_row_ = 0;
  PinnedBuffer table_;             // Header, then rows_ rows of device_.row_bytes
  kernels::TokenMaskArgs device_;  // the table as the device sees it, and the device copy
};

}  // namespace granule::cuda
