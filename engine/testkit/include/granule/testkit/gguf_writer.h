// GgufWriter: GGUF v2/v3 files with any metadata and tensors at any shape, given as f32
// values (encoded by the test quantisers) or as raw bytes. Tests and granule-bench only.
#pragma once
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "granule/gguf.h"
#include "granule/tensor_type.h"

namespace granule {

// Writes GGUF v3 (or v2 when asked). Tensors are given as f32 values and quantised to the
// requested type with the exact GGUF block layouts, or as raw bytes already encoded.
class GgufWriter {
 public:
  explicit GgufWriter(uint32_t version = 3, uint64_t alignment = 32);
  void set(std::string key, GgufValue value);
  // dims in GGUF order (dims[0] contiguous); values.size() == product of dims.
  void add_tensor(std::string name, std::vector<int64_t> dims, TensorType type,
                  std::span<const float> values);
  void add_raw_tensor(std::string name, std::vector<int64_t> dims, uint32_t ggml_type,
                      std::vector<uint8_t> bytes);
  // A tensor whose data is all zero bytes, never held in memory: write() leaves a hole in
  // the file (sparse where the file system allows), so an 8B-shaped model's header and
  // tensor table cost only their own bytes (hub tests). to_bytes() refuses such a writer.
  void add_zero_tensor(std::string name, std::vector<int64_t> dims, uint32_t ggml_type);
  std::vector<uint8_t> to_bytes() const;
  void write(const std::filesystem::path& path) const;  // throws Error on I/O failure

 private:
  struct PendingTensor {
    std::string name;
    std::vector<int64_t> dims;
    uint32_t ggml_type;
    std::vector<uint8_t> bytes;
    uint64_t zero_bytes = 0;  // add_zero_tensor: the size, with `bytes` empty
    uint64_t size() const { return bytes.empty() ? zero_bytes : bytes.size(); }
  };
  // Header, metadata, tensor table and the padding up to the data section.
  std::vector<uint8_t> header_bytes() const;
  uint32_t version_;
  uint64_t alignment_;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace granule
