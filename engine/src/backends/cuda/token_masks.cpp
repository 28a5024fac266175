// TokenMasks: the mapped table's layout, its epochs and the publication order (words and flags
// first, then the epoch, so a device that sees the epoch sees the masks).
#include "backends/cuda/token_masks.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "backends/cuda/cuda_check.h"
#include "granule/error.h"

namespace granule::cuda {

TokenMasks::TokenMasks(int rows, int64_t n_vocab)
    : rows_(rows),
      words_per_row_(static_cast<size_t>((n_vocab + 31) / 32)),
      table_(sizeof(Header) + static_cast<size_t>(rows) * sizeof(uint32_t) * (1 + words_per_row_)) {
  if (rows <= 0 || n_vocab <= 0) throw UsageError("CUDA backend: token masks of no rows");
  std::memset(table_.as<void>(), 0, table_.bytes());
  // Pinned memory is mapped on every device with unified addressing (all that this backend
  // runs on); the device pointer is asked for all the same.
  void* device = nullptr;
  check_cuda(cudaHostGetDevicePointer(&device, table_.as<void>(), 0),
             "mapping the token masks to the device");
  auto* base = static_cast<uint8_t*>(device);
  auto* header = reinterpret_cast<Header*>(base);
  device_.ready = &header->ready;
  device_.wanted = &header->wanted;
  device_.timed_out = &header->timed_out;
  device_.row_masked = reinterpret_cast<const uint32_t*>(header + 1);
  device_.words = device_.row_masked + rows;
  device_.words_per_row = static_cast<int>(words_per_row_);
}

uint32_t TokenMasks::ready() const {
  return std::atomic_ref<uint32_t>(header()->ready).load(std::memory_order_acquire);
}

uint32_t TokenMasks::wanted() const {
  return std::atomic_ref<uint32_t>(header()->wanted).load(std::memory_order_acquire);
}

void TokenMasks::arm() {
  release_unpublished();
  // Written before the launch that reads it; the launch orders it for the device.
  std::atomic_ref<uint32_t>(header()->wanted).store(wanted() + 1, std::memory_order_seq_cst);
}

void TokenMasks::publish(std::span<const uint32_t* const> rows) {
  if (!armed_unpublished()) throw UsageError("CUDA backend: token masks for no armed step");
  if (rows.size() > static_cast<size_t>(rows_))
    throw UsageError("CUDA backend: token masks for more rows than the table holds");
  uint32_t* flags = row_masked();
  for (size_t r = 0; r < static_cast<size_t>(rows_); ++r) {
    const uint32_t* mask = r < rows.size() ? rows[r] : nullptr;
    flags[r] = mask ? 1u : 0u;
    if (mask) std::memcpy(words() + r * words_per_row_, mask, words_per_row_ * sizeof(uint32_t));
  }
  // Everything above is visible to the device before the epoch that lets it read them.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::atomic_ref<uint32_t>(header()->ready).store(wanted(), std::memory_order_seq_cst);
}

bool TokenMasks::release_unpublished() {
  if (!armed_unpublished()) return false;
  std::fill_n(row_masked(), rows_, 0u);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::atomic_ref<uint32_t>(header()->ready).store(wanted(), std::memory_order_seq_cst);
  return true;
}

void TokenMasks::enqueue(float* logits, int64_t logits_stride, int rows, int n_vocab,
                         int first_mask_row, cudaStream_t stream) const {
  if (first_mask_row + rows > rows_)
    throw UsageError("CUDA backend: masking more rows than the token mask table holds");
  check_cuda(kernels::launch_token_mask(logits, logits_stride, rows, n_vocab, first_mask_row,
                                        device_, stream),
             "token_mask");
}

bool TokenMasks::take_timed_out() {
  std::atomic_ref<uint32_t> flag(header()->timed_out);
  return flag.exchange(0, std::memory_order_acq_rel) != 0;
}

}  // namespace granule::cuda
