// TokenMasks: the token masks of structured output on their way to the device sampler, a table
// in mapped pinned host memory ([rows][words] bitmasks, a flag per row, two epochs) that the
// host fills while the device runs the step's forward pass and the step's mask kernels read
// once the host has published it (kernels/sampling.cuh, launch_token_mask).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "backends/cuda/device_memory.h"
#include "sampling.cuh"

namespace granule::cuda {

class TokenMasks {
 public:
  // Room for `rows` mask rows of `n_vocab` bits each.
  TokenMasks(int rows, int64_t n_vocab);
  TokenMasks(const TokenMasks&) = delete;
  TokenMasks& operator=(const TokenMasks&) = delete;

  int rows() const { return rows_; }
  size_t words_per_row() const { return words_per_row_; }

  // Before a masked step is launched: a new epoch, which the step's mask kernels wait for.
  void arm();
  // The armed step's masks: rows[i] (words_per_row() words) for mask row i, null where row i
  // draws unmasked; rows past the span draw unmasked. Publishes them: the device goes on.
  void publish(std::span<const uint32_t* const> rows);
  // Publishes the armed step with no row masked, when it was not published (a step abandoned
  // between launch and wait, or waited for without masks): the device must never wait for a
  // host that has moved on. Returns whether it had to.
  bool release_unpublished();
  bool armed_unpublished() const { return wanted() != ready(); }
  // Queues the wait for the publication and the masking of `rows` logit rows (mask rows
  // [first_mask_row, first_mask_row + rows)), capturable.
  void enqueue(float* logits, int64_t logits_stride, int rows, int n_vocab, int first_mask_row,
               cudaStream_t stream) const;
  // Whether a wait gave up since the last call (the step then drew unmasked).
  bool take_timed_out();

 private:
  struct Header {
    uint32_t ready = 0, wanted = 0, timed_out = 0, unused = 0;
  };
  Header* header() const { return table_.as<Header>(); }
  uint32_t* row_masked() const { return reinterpret_cast<uint32_t*>(header() + 1); }
  uint32_t* words() const { return row_masked() + rows_; }
  uint32_t ready() const;
  uint32_t wanted() const;

  int rows_ = 0;
  size_t words_per_row_ = 0;
  PinnedBuffer table_;             // Header, row_masked[rows_], words[rows_][words_per_row_]
  kernels::TokenMaskArgs device_;  // the same memory as the device sees it
};

}  // namespace granule::cuda
