// GGUF model files: a validating reader over mmap (ModelFile) and the metadata values it
// yields. The writer tests and tools make models with is granule/testkit/gguf_writer.h.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "granule/error.h"
#include "granule/tensor_type.h"

namespace granule {

enum class GgufType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
std::string_view gguf_type_name(GgufType t);

// One metadata value. Scalars keep their exact GGUF type; arrays are homogeneous and
// stored typed (strings in `strings`, integers in `ints`, floats in `floats`, bools as 0/1
// in `ints`), which keeps a 150k-entry vocabulary cheap.
struct GgufValue {
  GgufType type = GgufType::UINT32;
  // scalar payload (the member matching `type`)
  uint64_t u64 = 0;     // UINT8..UINT64 (unsigned)
  int64_t i64 = 0;      // INT8..INT64, and unsigned values that fit
  double f64 = 0;       // FLOAT32/FLOAT64
  bool boolean = false;
  std::string str;
  // array payload (type == ARRAY)
  GgufType array_type = GgufType::UINT8;
  std::vector<std::string> strings;
  std::vector<int64_t> ints;   // also UINT64 values (reinterpreted) and BOOL
  std::vector<double> floats;

  size_t array_size() const;
  // Convenience accessors; throw FormatError naming the expected type on mismatch.
  int64_t as_int() const;        // any integer scalar
  double as_float() const;       // any numeric scalar
  bool as_bool() const;
  const std::string& as_string() const;

  // Constructors, for code that builds metadata (the testkit's GgufWriter).
  static GgufValue u32(uint32_t v);
  static GgufValue i32(int32_t v);
  static GgufValue u64v(uint64_t v);
  static GgufValue f32(float v);
  static GgufValue boolean_value(bool v);
  static GgufValue string(std::string v);
  static GgufValue of(GgufType scalar_type, double numeric_value);  // any numeric scalar
  static GgufValue string_array(std::vector<std::string> v);
  static GgufValue int_array(GgufType elem, std::vector<int64_t> v);
  static GgufValue float_array(GgufType elem, std::vector<double> v);
};

struct TensorInfo {
  std::string name;
  std::vector<int64_t> dims;   // GGUF order: dims[0] is the contiguous (row) dimension
  uint32_t ggml_type = 0;      // raw id; tensor_type_info() says if it is supported
  uint64_t offset = 0;         // relative to the data section
  uint64_t size_bytes = 0;
  const uint8_t* data = nullptr;  // into the mapping

  int64_t elements() const;
  int64_t rows() const;        // product of dims[1..]
};

// ModelFile::parse_header ran out of the bytes it was given before the tensor table ended
// (the file itself is not known to be bad): give it at least `needed_bytes` from the start.
class HeaderIncomplete : public FormatError {
 public:
  HeaderIncomplete(const std::string& what, uint64_t needed)
      : FormatError(what), needed_bytes(needed) {}
  uint64_t needed_bytes;
};

// A GGUF file mapped read-only. open() validates the header, every metadata entry, the
// tensor table (counts, types, offsets, sizes, alignment, overlaps) against the file size
// before anything is used; a bad file throws FormatError("FILE: what is wrong").
class ModelFile {
 public:
  static std::unique_ptr<ModelFile> open(const std::filesystem::path& path);
  // The header, metadata and tensor table of a file of `file_size` bytes from its first
  // bytes (`prefix`, e.g. fetched by HTTP range requests), validated as open() validates
  // them. Tensors have no data (TensorInfo::data is null). Throws HeaderIncomplete when the
  // table runs past the prefix; `name` labels errors and is path().
  static std::unique_ptr<ModelFile> parse_header(std::vector<uint8_t> prefix, uint64_t file_size,
                                                 const std::string& name);
  ~ModelFile();
  ModelFile(const ModelFile&) = delete;
  ModelFile& operator=(const ModelFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }
  const uint8_t* base() const { return base_; }  // null for parse_header's files
  // Start of tensor data in the file; may lie past its end when there are no tensors.
  uint64_t data_offset() const { return data_offset_; }

  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const GgufValue* find(std::string_view key) const;     // nullptr when absent
  // Typed lookups; throw FormatError if present with the wrong type.
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find_tensor(std::string_view name) const;  // nullptr when absent

 private:
  ModelFile() = default;
  std::filesystem::path path_;
  int fd_ = -1;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
  std::vector<uint8_t> header_prefix_;  // parse_header's bytes, released after parsing
  friend class GgufParser;
};

}  // namespace granule
