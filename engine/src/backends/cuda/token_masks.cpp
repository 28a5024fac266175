// TokenMasks: the pinned table's layout, its epochs and the publication order (rows first, then
// the epoch, so a device that sees the epoch copies the rows as written), and the device copy's.
#include "backends/cuda/token_masks.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "backends/cuda/cuda_check.h"
#include "granule/error.h"
#include "memory/workspace_layout.h"

namespace granule::cuda {

TokenMasks::TokenMasks(int rows, int64_t n_vocab, const DeviceBuffer& device)
    : rows_(rows), words_per_row_(static_cast<size_t>((n_vocab + 31) / 32)) {
  if (rows <= 0 || n_vocab <= 0) throw UsageError("CUDA backend: token masks of no rows");
  const uint64_t row_bytes = workspace::token_mask_row_bytes(n_vocab);
  static_assert(kernels::kTokenMaskRowHeaderBytes == 16);
  // The device copy: a 16-byte status, then its rows.
  if (!device.get() || device.bytes() < 16 + row_bytes)
    throw UsageError("CUDA backend: no device memory for the token masks");
  table_ = PinnedBuffer(sizeof(Header) + static_cast<size_t>(rows) * row_bytes);
  std::memset(table_.as<void>(), 0, table_.bytes());
  // Pinned memory is mapped on every device with unified addressing (all that this backend
  // runs on); the device pointer of the epochs is asked for all the same.
  void* mapped = nullptr;
  check_cuda(cudaHostGetDevicePointer(&mapped, table_.as<void>(), 0),
             "mapping the token masks to the device");
  auto* header = static_cast<Header*>(mapped);
  device_.ready = &header->ready;
  device_.wanted = &header->wanted;
  device_.timed_out = &header->timed_out;
  device_.host_rows = table_.as<uint8_t>() + sizeof(Header);  // the copy's source, a host address
  device_.host_row_count = rows;
  device_.published = device.as<uint32_t>();
  device_.device_rows = device.as<uint8_t>() + 16;
  device_.device_row_count = static_cast<int>((device.bytes() - 16) / row_bytes);
  device_.row_bytes = static_cast<int64_t>(row_bytes);
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
  for (size_t r = 0; r < static_cast<size_t>(rows_); ++r) {
    const uint32_t* mask = r < rows.size() ? rows[r] : nullptr;
    uint8_t* out = row(r);
    const uint32_t flag = mask ? 1u : 0u;
    std::memcpy(out, &flag, sizeof(flag));
    if (mask)
      std::memcpy(out + kernels::kTokenMaskRowHeaderBytes, mask, words_per_row_ * sizeof(uint32_t));
  }
  // Everything above is visible to the device (and to the copy that follows its wait) before
  // the epoch that lets it go on.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::atomic_ref<uint32_t>(header()->ready).store(wanted(), std::memory_order_seq_cst);
}

bool TokenMasks::release_unpublished() {
  if (!armed_unpublished()) return false;
  constexpr uint32_t kUnmasked = 0;
  for (size_t r = 0; r < static_cast<size_t>(rows_); ++r)
    std::memcpy(row(r), &kUnmasked, sizeof(kUnmasked));
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::atomic_ref<uint32_t>(header()->ready).store(wanted(), std::memory_order_seq_cst);
  return true;
}

void TokenMasks::enqueue(float* logits, int64_t logits_stride, int rows, int n_vocab,
                         int first_mask_row, cudaStream_t stream) const {
  if (first_mask_row < 0 || first_mask_row + rows > rows_)
    throw UsageError("CUDA backend: masking more rows than the token mask table holds");
  if (rows > device_.device_row_count)
    throw UsageError("CUDA backend: masking more rows at once than the device copy holds");
  check_cuda(kernels::launch_token_mask(logits, logits_stride, rows, n_vocab, first_mask_row,
                                        device_, stream),
             "token_mask");
}

bool TokenMasks::take_timed_out() {
  std::atomic_ref<uint32_t> flag(header()->timed_out);
  return flag.exchange(0, std::memory_order_acq_rel) != 0;
}

}  // namespace granule::cuda
