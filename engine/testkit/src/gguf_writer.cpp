// GgufWriter: GGUF v2/v3 files with every metadata type and tensors encoded by the block
// formats (or given raw), laid out at the file's alignment. Tests and tools make models with it.
#include "granule/testkit/gguf_writer.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "granule/error.h"
#include "granule/testkit/quantize.h"
#include "model/gguf_format.h"

namespace granule {

using namespace gguf_format;

namespace {

class ByteSink {
 public:
  template <typename T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  void pad_to(uint64_t alignment) {
    while (bytes.size() % alignment != 0) bytes.push_back(0);
  }
  std::vector<uint8_t> bytes;
};

// Zero bytes that bring `size` up to a multiple of `alignment`.
size_t padding_after(size_t size, uint64_t alignment) {
  return static_cast<size_t>((alignment - size % alignment) % alignment);
}

// Writes one integer element of `type`, refusing values the type cannot hold so that a
// test's typo does not silently wrap.
void put_integer(ByteSink& out, GgufType type, int64_t signed_value, uint64_t unsigned_value,
                 const std::string& key) {
  auto check = [&](bool fits) {
    if (!fits)
      throw UsageError("GGUF key " + key + ": value " + std::to_string(signed_value) +
                       " does not fit " + type_label(type));
  };
  switch (type) {
    case GgufType::UINT8:
      check(unsigned_value <= UINT8_MAX);
      out.put<uint8_t>(static_cast<uint8_t>(unsigned_value));
      break;
    case GgufType::UINT16:
      check(unsigned_value <= UINT16_MAX);
      out.put<uint16_t>(static_cast<uint16_t>(unsigned_value));
      break;
    case GgufType::UINT32:
      check(unsigned_value <= UINT32_MAX);
      out.put<uint32_t>(static_cast<uint32_t>(unsigned_value));
      break;
    case GgufType::UINT64:
      out.put<uint64_t>(unsigned_value);
      break;
    case GgufType::INT8:
      check(signed_value >= INT8_MIN && signed_value <= INT8_MAX);
      out.put<int8_t>(static_cast<int8_t>(signed_value));
      break;
    case GgufType::INT16:
      check(signed_value >= INT16_MIN && signed_value <= INT16_MAX);
      out.put<int16_t>(static_cast<int16_t>(signed_value));
      break;
    case GgufType::INT32:
      check(signed_value >= INT32_MIN && signed_value <= INT32_MAX);
      out.put<int32_t>(static_cast<int32_t>(signed_value));
      break;
    case GgufType::INT64:
      out.put<int64_t>(signed_value);
      break;
    case GgufType::BOOL:
      check(signed_value == 0 || signed_value == 1);
      out.put<uint8_t>(static_cast<uint8_t>(signed_value));
      break;
    default:
      throw UsageError("GGUF key " + key + ": " + type_label(type) + " is not an integer type");
  }
}

void put_value(ByteSink& out, const std::string& key, const GgufValue& v) {
  out.put<uint32_t>(static_cast<uint32_t>(v.type));
  switch (v.type) {
    case GgufType::STRING:
      out.put_string(v.str);
      return;
    case GgufType::FLOAT32:
      out.put<float>(static_cast<float>(v.f64));
      return;
    case GgufType::FLOAT64:
      out.put<double>(v.f64);
      return;
    case GgufType::BOOL:
      out.put<uint8_t>(v.boolean ? 1 : 0);
      return;
    case GgufType::ARRAY: {
      out.put<uint32_t>(static_cast<uint32_t>(v.array_type));
      out.put<uint64_t>(v.array_size());
      if (v.array_type == GgufType::STRING) {
        for (const auto& s : v.strings) out.put_string(s);
      } else if (v.array_type == GgufType::FLOAT32) {
        for (double f : v.floats) out.put<float>(static_cast<float>(f));
      } else if (v.array_type == GgufType::FLOAT64) {
        for (double f : v.floats) out.put<double>(f);
      } else {
        for (int64_t i : v.ints) put_integer(out, v.array_type, i, static_cast<uint64_t>(i), key);
      }
      return;
    }
    default:
      put_integer(out, v.type, v.i64, v.u64, key);
      return;
  }
}

}  // namespace

GgufWriter::GgufWriter(uint32_t version, uint64_t alignment)
    : version_(version), alignment_(alignment) {
  if (version != 2 && version != 3)
    throw UsageError("GgufWriter writes GGUF version 2 or 3, not " + std::to_string(version));
  if (alignment == 0 || !std::has_single_bit(alignment) || alignment > UINT32_MAX)
    throw UsageError("GGUF alignment " + std::to_string(alignment) + " is not a power of two");
  if (alignment != kDefaultAlignment)
    set(std::string(kAlignmentKey), GgufValue::u32(static_cast<uint32_t>(alignment)));
}

void GgufWriter::set(std::string key, GgufValue value) {
  // A valid general.alignment also moves the padding, so the file stays consistent;
  // an invalid one is written as given (tests use that to make bad files).
  if (key == kAlignmentKey && value.type == GgufType::UINT32 && value.u64 != 0 &&
      std::has_single_bit(value.u64))
    alignment_ = value.u64;
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(std::move(key), std::move(value));
}

namespace {
int64_t checked_elements(const std::string& name, const std::vector<int64_t>& dims) {
  if (dims.empty() || dims.size() > kMaxDims)
    throw UsageError("tensor " + name + " needs 1 to 4 dimensions");
  int64_t elements = 1;
  for (int64_t d : dims) {
    if (d <= 0) throw UsageError("tensor " + name + " has a non-positive dimension");
    if (__builtin_mul_overflow(elements, d, &elements))
      throw UsageError("tensor " + name + " has too many elements");
  }
  return elements;
}
}  // namespace

void GgufWriter::add_tensor(std::string name, std::vector<int64_t> dims, TensorType type,
                            std::span<const float> values) {
  const int64_t elements = checked_elements(name, dims);
  if (static_cast<int64_t>(values.size()) != elements)
    throw UsageError("tensor " + name + " has " + std::to_string(values.size()) + " values for " +
                     std::to_string(elements) + " elements");
  const int64_t row = dims[0];
  const size_t bytes_per_row = row_bytes(type, row);
  const int64_t rows = elements / row;
  std::vector<uint8_t> bytes(bytes_per_row * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    quantize_row(type, values.data() + r * row, bytes.data() + r * bytes_per_row, row);
  add_raw_tensor(std::move(name), std::move(dims), static_cast<uint32_t>(type), std::move(bytes));
}

void GgufWriter::add_raw_tensor(std::string name, std::vector<int64_t> dims, uint32_t ggml_type,
                                std::vector<uint8_t> bytes) {
  const int64_t elements = checked_elements(name, dims);
  for (const auto& t : tensors_)
    if (t.name == name) throw UsageError("tensor " + name + " added twice");
  // Types the reader knows must come with exactly their size; unknown ids are written as
  // given, so tests can make files the reader has to reject.
  if (const BlockGeometry* g = block_geometry(ggml_type)) {
    if (dims[0] % g->block_elems != 0)
      throw UsageError("tensor " + name + " row is not a multiple of the block size");
    const uint64_t expected = static_cast<uint64_t>(elements) / g->block_elems * g->block_bytes;
    if (bytes.size() != expected)
      throw UsageError("tensor " + name + " has " + std::to_string(bytes.size()) +
                       " bytes, expected " + std::to_string(expected));
  }
  const uint64_t size = bytes.size();
  tensors_.push_back({std::move(name), std::move(dims), ggml_type, std::move(bytes), {}, size, 0});
}

void GgufWriter::add_generated_tensor(std::string name, std::vector<int64_t> dims,
                                      uint32_t ggml_type, RowGenerator generate) {
  const int64_t elements = checked_elements(name, dims);
  for (const auto& t : tensors_)
    if (t.name == name) throw UsageError("tensor " + name + " added twice");
  const BlockGeometry* g = block_geometry(ggml_type);
  if (!g) throw UsageError("tensor " + name + ": a generated tensor needs a known block type");
  if (dims[0] % g->block_elems != 0)
    throw UsageError("tensor " + name + " row is not a multiple of the block size");
  const uint64_t row = static_cast<uint64_t>(dims[0]) / g->block_elems * g->block_bytes;
  const uint64_t size = static_cast<uint64_t>(elements) / g->block_elems * g->block_bytes;
  tensors_.push_back(
      {std::move(name), std::move(dims), ggml_type, {}, std::move(generate), size, row});
}

void GgufWriter::generate_rows(const PendingTensor& t, int64_t first_row, int64_t rows,
                               uint8_t* out, int threads) {
  // Small slices on one thread: starting threads would cost more than the rows.
  const auto bytes = static_cast<uint64_t>(rows) * t.row_bytes;
  const int64_t parts = bytes < (256u << 10) ? 1 : std::clamp<int64_t>(threads, 1, rows);
  if (parts == 1) {
    t.generate(first_row, rows, out);
    return;
  }
  std::vector<std::thread> pool;
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t begin = rows * p / parts, end = rows * (p + 1) / parts;
    pool.emplace_back([&t, first_row, begin, end, out] {
      t.generate(first_row + begin, end - begin, out + static_cast<uint64_t>(begin) * t.row_bytes);
    });
  }
  for (auto& thread : pool) thread.join();
}

void GgufWriter::add_zero_tensor(std::string name, std::vector<int64_t> dims, uint32_t ggml_type) {
  const int64_t elements = checked_elements(name, dims);
  const BlockGeometry* g = block_geometry(ggml_type);
  if (g == nullptr || dims[0] % g->block_elems != 0)
    throw UsageError("tensor " + name + ": a zero tensor needs a known type and whole blocks");
  for (const auto& t : tensors_)
    if (t.name == name) throw UsageError("tensor " + name + " added twice");
  const uint64_t size = static_cast<uint64_t>(elements) / g->block_elems * g->block_bytes;
  tensors_.push_back({std::move(name), std::move(dims), ggml_type, {}, {}, size, 0, true});
}

std::vector<uint8_t> GgufWriter::header_bytes() const {
  ByteSink out;
  out.put<uint32_t>(kMagic);
  out.put<uint32_t>(version_);
  out.put<uint64_t>(tensors_.size());
  out.put<uint64_t>(metadata_.size());
  for (const auto& [key, value] : metadata_) {
    out.put_string(key);
    put_value(out, key, value);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    out.put_string(t.name);
    out.put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) out.put<uint64_t>(static_cast<uint64_t>(d));
    out.put<uint32_t>(t.ggml_type);
    out.put<uint64_t>(offset);
    offset += padding_after(t.size_bytes, alignment_) + t.size_bytes;
  }
  out.pad_to(alignment_);
  return std::move(out.bytes);
}

std::vector<uint8_t> GgufWriter::to_bytes() const {
  std::vector<uint8_t> bytes = header_bytes();
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (const auto& t : tensors_) {
    if (t.zero) throw UsageError("to_bytes: tensor " + t.name + " is a zero tensor");
    if (t.generate) {
      const size_t at = bytes.size();
      bytes.resize(at + t.size_bytes);
      generate_rows(t, 0, static_cast<int64_t>(t.size_bytes / t.row_bytes), bytes.data() + at,
                    threads);
    } else {
      bytes.insert(bytes.end(), t.bytes.begin(), t.bytes.end());
    }
    bytes.resize(bytes.size() + padding_after(t.size_bytes, alignment_), 0);
  }
  return bytes;
}

void GgufWriter::write(const std::filesystem::path& path) const {
  // Streams the tensors instead of building the whole file in memory (to_bytes), so
  // writing a model needs no second copy of its weights.
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  if (!file) throw Error(path.string() + ": cannot create: " + std::strerror(errno));
  auto put = [&file](const uint8_t* data, size_t size) {
    file.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  };
  const std::vector<uint8_t> header = header_bytes();
  put(header.data(), header.size());
  const std::vector<uint8_t> zeros(alignment_, 0);
  // Generated tensors go through a buffer of about 64 MiB, filled on every core.
  constexpr uint64_t kSliceBytes = 64ull << 20;
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<uint8_t> slice;
  uint64_t end = header.size();
  for (const auto& t : tensors_) {
    if (t.zero) {
      file.seekp(static_cast<std::streamoff>(t.size_bytes), std::ios::cur);  // a hole
    } else if (t.generate) {
      const auto rows = static_cast<int64_t>(t.size_bytes / t.row_bytes);
      const auto slice_rows =
          static_cast<int64_t>(std::max<uint64_t>(1, kSliceBytes / t.row_bytes));
      for (int64_t first = 0; first < rows && file; first += slice_rows) {
        const int64_t count = std::min(slice_rows, rows - first);
        slice.resize(static_cast<size_t>(count) * t.row_bytes);
        generate_rows(t, first, count, slice.data(), threads);
        put(slice.data(), slice.size());
      }
    } else {
      put(t.bytes.data(), t.bytes.size());
    }
    end += t.size_bytes + padding_after(t.size_bytes, alignment_);
    put(zeros.data(), padding_after(t.size_bytes, alignment_));
  }
  file.close();
  // A file ending in a hole has no byte written at its end: give it its full size.
  if (file) std::filesystem::resize_file(path, end);
  if (!file) throw Error(path.string() + ": write failed: " + std::strerror(errno));
}

}  // namespace granule
