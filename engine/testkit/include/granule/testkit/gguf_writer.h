// GgufWriter: GGUF v2/v3 files with any metadata and tensors at any shape, given as f32
// values (encoded by the test quantisers) or as raw bytes. Tests and granule-bench only.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
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
  // A tensor whose encoded rows are made when the file is written: generate(first_row,
  // row_count, out) fills row_count rows (row = dims[0] elements, rows = product of dims[1..])
  // at out. write() calls it for slices of rows on several threads at once (so it must be
  // thread-safe and its rows independent of the slicing) and streams them to disk: a model
  // larger than memory can be written. ggml_type must be a known block type.
  using RowGenerator = std::function<void(int64_t first_row, int64_t row_count, uint8_t* out)>;
  void add_generated_tensor(std::string name, std::vector<int64_t> dims, uint32_t ggml_type,
                            RowGenerator generate);
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
    std::vector<uint8_t> bytes;  // empty for a generated tensor
    RowGenerator generate;
    uint64_t size_bytes = 0;
    uint64_t row_bytes = 0;  // generated tensors only
    bool zero = false;       // add_zero_tensor: no bytes, a hole in the file
  };
  // A generated tensor's bytes, made on up to `threads` threads into out (size_bytes).
  static void generate_rows(const PendingTensor& t, int64_t first_row, int64_t rows, uint8_t* out,
                            int threads);
  // Header, metadata, tensor table and the padding up to the data section.
  std::vector<uint8_t> header_bytes() const;
  uint32_t version_;
  uint64_t alignment_;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace granule
