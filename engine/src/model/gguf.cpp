// GGUF v2/v3 files: the validating mmap reader (ModelFile) and the metadata value type.
// Every count, length, offset and size is checked against the file size before it is
// used, so a corrupt file fails with one FormatError line and never crashes.
#include "granule/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "granule/error.h"
#include "granule/log.h"
#include "granule/quant.h"
#include "model/gguf_format.h"

namespace granule {

using namespace gguf_format;

namespace {

constexpr uint64_t kHeaderBytes = 4 + 4 + 8 + 8;
// The smallest encodings, used to bound counts by the bytes left: a key/value pair is a
// length, a type and at least one byte of value; a tensor entry is a name length,
// n_dims, one dim, a type and an offset.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

// Bytes of one scalar of a fixed-size metadata type; 0 for STRING and ARRAY.
uint64_t scalar_bytes(GgufType t) {
  switch (t) {
    case GgufType::UINT8:
    case GgufType::INT8:
    case GgufType::BOOL: return 1;
    case GgufType::UINT16:
    case GgufType::INT16: return 2;
    case GgufType::UINT32:
    case GgufType::INT32:
    case GgufType::FLOAT32: return 4;
    case GgufType::UINT64:
    case GgufType::INT64:
    case GgufType::FLOAT64: return 8;
    case GgufType::STRING:
    case GgufType::ARRAY: return 0;
  }
  return 0;
}

// Bounds-checked little-endian reads over the mapped bytes. Every read says what it was
// reading so that a truncated file names the field it ran out in.
// Over a prefix of the file (parse_header), `available` bytes are readable of `size`: a
// read past them but inside the file is HeaderIncomplete, not a bad file.
class Cursor {
 public:
  Cursor(const uint8_t* data, uint64_t size, const std::string& file, uint64_t available)
      : data_(data), size_(size), available_(available), file_(file) {}

  uint64_t position() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  [[noreturn]] void fail(const std::string& what) const { throw FormatError(file_ + ": " + what); }

  void need(uint64_t n, std::string_view what) const {
    if (n <= remaining() && n > available_ - pos_)
      throw HeaderIncomplete(file_ + ": the header continues past the first " +
                                 std::to_string(available_) + " bytes (" + std::string(what) + ")",
                             pos_ + n);
    if (n > remaining())
      fail("truncated: " + std::string(what) + " at offset " + std::to_string(pos_) + " needs " +
           std::to_string(n) + " bytes, " + std::to_string(remaining()) + " left");
  }

  template <typename T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(std::string_view what) {
    const auto length = read<uint64_t>(what);
    need(length, what);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(length));
    pos_ += length;
    return s;
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t available_;
  uint64_t pos_ = 0;
  const std::string& file_;
};

}  // namespace

// ---------------------------------------------------------------------------------------
// GgufValue

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::UINT8: return "uint8";
    case GgufType::INT8: return "int8";
    case GgufType::UINT16: return "uint16";
    case GgufType::INT16: return "int16";
    case GgufType::UINT32: return "uint32";
    case GgufType::INT32: return "int32";
    case GgufType::FLOAT32: return "float32";
    case GgufType::BOOL: return "bool";
    case GgufType::STRING: return "string";
    case GgufType::ARRAY: return "array";
    case GgufType::UINT64: return "uint64";
    case GgufType::INT64: return "int64";
    case GgufType::FLOAT64: return "float64";
  }
  return "unknown";
}

size_t GgufValue::array_size() const {
  if (type != GgufType::ARRAY) return 0;
  if (array_type == GgufType::STRING) return strings.size();
  if (is_float(array_type)) return floats.size();
  return ints.size();
}

int64_t GgufValue::as_int() const {
  if (is_signed(type)) return i64;
  if (is_unsigned(type)) {
    if (u64 > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw FormatError("value " + std::to_string(u64) + " is too large for a signed integer");
    return static_cast<int64_t>(u64);
  }
  throw FormatError("value is " + type_label(type) + ", expected an integer");
}

double GgufValue::as_float() const {
  if (is_float(type)) return f64;
  if (is_signed(type)) return static_cast<double>(i64);
  if (is_unsigned(type)) return static_cast<double>(u64);
  throw FormatError("value is " + type_label(type) + ", expected a number");
}

bool GgufValue::as_bool() const {
  if (type != GgufType::BOOL) throw FormatError("value is " + type_label(type) + ", expected a bool");
  return boolean;
}

const std::string& GgufValue::as_string() const {
  if (type != GgufType::STRING)
    throw FormatError("value is " + type_label(type) + ", expected a string");
  return str;
}

GgufValue GgufValue::u32(uint32_t v) { return of(GgufType::UINT32, v); }
GgufValue GgufValue::i32(int32_t v) { return of(GgufType::INT32, v); }
GgufValue GgufValue::f32(float v) { return of(GgufType::FLOAT32, v); }

GgufValue GgufValue::u64v(uint64_t v) {
  // Built directly: a double cannot carry every uint64.
  GgufValue value;
  value.type = GgufType::UINT64;
  value.u64 = v;
  value.i64 = v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? static_cast<int64_t>(v) : 0;
  return value;
}

GgufValue GgufValue::boolean_value(bool v) {
  GgufValue value;
  value.type = GgufType::BOOL;
  value.boolean = v;
  value.u64 = v;
  value.i64 = v;
  return value;
}

GgufValue GgufValue::string(std::string v) {
  GgufValue value;
  value.type = GgufType::STRING;
  value.str = std::move(v);
  return value;
}

GgufValue GgufValue::of(GgufType scalar_type, double numeric_value) {
  GgufValue value;
  value.type = scalar_type;
  if (is_float(scalar_type)) {
    value.f64 = scalar_type == GgufType::FLOAT32 ? static_cast<float>(numeric_value) : numeric_value;
  } else if (is_integer(scalar_type)) {
    if (numeric_value != std::trunc(numeric_value))
      throw UsageError("GGUF " + type_label(scalar_type) + " value " + std::to_string(numeric_value) +
                       " is not an integer");
    // Range checks before the casts, which are undefined out of range (the writer
    // checks the narrower types' ranges).
    constexpr double kTwo63 = 9223372036854775808.0;
    if (is_signed(scalar_type)) {
      if (!(numeric_value >= -kTwo63 && numeric_value < kTwo63))
        throw UsageError("GGUF " + type_label(scalar_type) + " value out of range");
      value.i64 = static_cast<int64_t>(numeric_value);
      value.u64 = static_cast<uint64_t>(value.i64);
    } else {
      if (!(numeric_value >= 0 && numeric_value < 2 * kTwo63))
        throw UsageError("GGUF " + type_label(scalar_type) + " value out of range");
      value.u64 = static_cast<uint64_t>(numeric_value);
      value.i64 = numeric_value < kTwo63 ? static_cast<int64_t>(value.u64) : 0;
    }
  } else if (scalar_type == GgufType::BOOL) {
    return boolean_value(numeric_value != 0);
  } else {
    throw UsageError("GgufValue::of needs a numeric type, not " + type_label(scalar_type));
  }
  return value;
}

GgufValue GgufValue::string_array(std::vector<std::string> v) {
  GgufValue value;
  value.type = GgufType::ARRAY;
  value.array_type = GgufType::STRING;
  value.strings = std::move(v);
  return value;
}

GgufValue GgufValue::int_array(GgufType elem, std::vector<int64_t> v) {
  if (!is_integer(elem) && elem != GgufType::BOOL)
    throw UsageError("int_array needs an integer or bool element type, not " + type_label(elem));
  GgufValue value;
  value.type = GgufType::ARRAY;
  value.array_type = elem;
  value.ints = std::move(v);
  return value;
}

GgufValue GgufValue::float_array(GgufType elem, std::vector<double> v) {
  if (!is_float(elem))
    throw UsageError("float_array needs float32 or float64 elements, not " + type_label(elem));
  GgufValue value;
  value.type = GgufType::ARRAY;
  value.array_type = elem;
  value.floats = std::move(v);
  return value;
}

// ---------------------------------------------------------------------------------------
// TensorInfo

int64_t TensorInfo::elements() const {
  return std::accumulate(dims.begin(), dims.end(), int64_t{1}, std::multiplies<>());
}

int64_t TensorInfo::rows() const {
  if (dims.empty()) return 0;
  return std::accumulate(dims.begin() + 1, dims.end(), int64_t{1}, std::multiplies<>());
}

// ---------------------------------------------------------------------------------------
// Parsing

class GgufParser {
 public:
  // Over file.base_ (the whole mapped file), or over a prefix of `available` bytes at `data`.
  GgufParser(ModelFile& file, const std::string& name, const uint8_t* data, uint64_t available)
      : file_(file), name_(name), in_(data, file.size_, name_, available) {}

  void parse() {
    read_header();
    read_metadata();
    read_alignment();
    read_tensor_table();
    place_tensor_data();
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { in_.fail(what); }

  void read_header() {
    if (file_.size_ < 4 || in_.read<uint32_t>("magic") != kMagic)
      fail("not a GGUF file (bad magic)");
    const auto version = in_.read<uint32_t>("version");
    if (version != 2 && version != 3) {
      if (version == 1) fail("unsupported GGUF version 1 (convert the model with a newer llama.cpp)");
      const uint32_t swapped = __builtin_bswap32(version);
      if (swapped == 2 || swapped == 3) fail("big-endian GGUF files are not supported");
      fail("unsupported GGUF version " + std::to_string(version));
    }
    file_.version_ = version;
    tensor_count_ = in_.read<uint64_t>("tensor count");
    kv_count_ = in_.read<uint64_t>("metadata count");
    if (kv_count_ > in_.remaining() / kMinKvBytes)
      fail("metadata count " + std::to_string(kv_count_) + " is impossible for a file of " +
           std::to_string(file_.size_) + " bytes");
    if (tensor_count_ > in_.remaining() / kMinTensorInfoBytes)
      fail("tensor count " + std::to_string(tensor_count_) + " is impossible for a file of " +
           std::to_string(file_.size_) + " bytes");
  }

  void read_metadata() {
    for (uint64_t i = 0; i < kv_count_; ++i) {
      std::string key = in_.read_string("metadata key");
      const auto type = in_.read<uint32_t>("metadata type");
      GgufValue value = read_value(key, type);
      const auto [it, inserted] = file_.metadata_.emplace(std::move(key), std::move(value));
      if (!inserted) fail("duplicate metadata key " + it->first);
    }
  }

  GgufType checked_type(const std::string& key, uint32_t raw) const {
    if (!is_valid_type(raw))
      fail("metadata key " + key + " has unknown value type " + std::to_string(raw));
    return static_cast<GgufType>(raw);
  }

  GgufValue read_value(const std::string& key, uint32_t raw_type) {
    const GgufType type = checked_type(key, raw_type);
    GgufValue value;
    value.type = type;
    if (type == GgufType::ARRAY) {
      read_array(key, value);
    } else {
      const std::string what = "value of " + key;
      if (type == GgufType::STRING)
        value.str = in_.read_string(what);
      else
        read_scalar(type, what, value.u64, value.i64, value.f64, value.boolean);
    }
    if (is_unsigned(type) && value.i64 < 0) value.i64 = 0;  // scalars keep i64 only when it fits
    return value;
  }

  // Reads one fixed-size scalar into the payload members it belongs to; `what` names it
  // in a truncation error.
  void read_scalar(GgufType type, std::string_view what, uint64_t& u, int64_t& i, double& f,
                   bool& b) {
    switch (type) {
      case GgufType::UINT8: u = in_.read<uint8_t>(what); break;
      case GgufType::UINT16: u = in_.read<uint16_t>(what); break;
      case GgufType::UINT32: u = in_.read<uint32_t>(what); break;
      case GgufType::UINT64: u = in_.read<uint64_t>(what); break;
      case GgufType::INT8: i = in_.read<int8_t>(what); break;
      case GgufType::INT16: i = in_.read<int16_t>(what); break;
      case GgufType::INT32: i = in_.read<int32_t>(what); break;
      case GgufType::INT64: i = in_.read<int64_t>(what); break;
      case GgufType::FLOAT32: f = in_.read<float>(what); break;
      case GgufType::FLOAT64: f = in_.read<double>(what); break;
      case GgufType::BOOL: {
        // Any non-zero byte is true, as ggml reads it.
        b = in_.read<uint8_t>(what) != 0;
        u = b;
        i = b;
        return;
      }
      case GgufType::STRING:
      case GgufType::ARRAY: fail("internal: " + type_label(type) + " is not a scalar");
    }
    // Keep both integer views consistent: an unsigned value also as signed when it fits,
    // a signed one also as unsigned (reinterpreted, which is how arrays store UINT64).
    if (is_unsigned(type)) i = static_cast<int64_t>(u);
    if (is_signed(type)) u = static_cast<uint64_t>(i);
  }

  void read_array(const std::string& key, GgufValue& value) {
    const GgufType elem = checked_type(key, in_.read<uint32_t>("array type of " + key));
    const auto count = in_.read<uint64_t>("array length of " + key);
    if (elem == GgufType::ARRAY) fail("metadata key " + key + " is a nested array (not supported)");
    // Every element takes at least this many bytes, so a corrupt count fails here
    // instead of reserving a giant vector.
    const uint64_t min_elem_bytes = elem == GgufType::STRING ? 8 : scalar_bytes(elem);
    if (count > in_.remaining() / min_elem_bytes)
      fail("array " + key + " claims " + std::to_string(count) + " elements, more than the file holds");
    value.array_type = elem;
    const auto n = static_cast<size_t>(count);
    const std::string what = (elem == GgufType::STRING ? "string in array " : "array ") + key;
    if (elem == GgufType::STRING) {
      value.strings.reserve(n);
      for (size_t k = 0; k < n; ++k) value.strings.push_back(in_.read_string(what));
    } else if (is_float(elem)) {
      value.floats.resize(n);
      for (size_t k = 0; k < n; ++k)
        value.floats[k] = elem == GgufType::FLOAT32 ? in_.read<float>(what) : in_.read<double>(what);
    } else {
      value.ints.resize(n);
      uint64_t u = 0;
      int64_t i = 0;
      double f = 0;
      bool b = false;
      for (size_t k = 0; k < n; ++k) {
        read_scalar(elem, what, u, i, f, b);
        value.ints[k] = i;
      }
    }
  }

  void read_alignment() {
    const auto it = file_.metadata_.find(std::string(kAlignmentKey));
    if (it == file_.metadata_.end()) return;
    const GgufValue& v = it->second;
    if (v.type != GgufType::UINT32)
      fail(std::string(kAlignmentKey) + " must be a uint32, found " + type_label(v.type));
    if (v.u64 == 0 || !std::has_single_bit(v.u64))
      fail(std::string(kAlignmentKey) + " " + std::to_string(v.u64) + " is not a power of two");
    file_.alignment_ = v.u64;
  }

  void read_tensor_table() {
    auto& tensors = file_.tensors_;
    tensors.reserve(static_cast<size_t>(tensor_count_));
    for (uint64_t t = 0; t < tensor_count_; ++t) {
      TensorInfo info;
      info.name = in_.read_string("tensor name");
      const auto n_dims = in_.read<uint32_t>("dimension count of tensor " + info.name);
      if (n_dims == 0 || n_dims > kMaxDims)
        fail("tensor " + info.name + " has " + std::to_string(n_dims) + " dimensions (1 to 4 allowed)");
      uint64_t elements = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        const auto dim = in_.read<uint64_t>("dimensions of tensor " + info.name);
        if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          fail("tensor " + info.name + " has invalid dimension " + std::to_string(dim));
        if (__builtin_mul_overflow(elements, dim, &elements) ||
            elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          fail("tensor " + info.name + " has too many elements (dimensions overflow)");
        info.dims.push_back(static_cast<int64_t>(dim));
      }
      info.ggml_type = in_.read<uint32_t>("type of tensor " + info.name);
      info.offset = in_.read<uint64_t>("offset of tensor " + info.name);
      info.size_bytes = tensor_bytes(info, elements);
      if (info.offset % file_.alignment_ != 0)
        fail("tensor " + info.name + " offset " + std::to_string(info.offset) +
             " is not a multiple of the alignment " + std::to_string(file_.alignment_));
      const auto [it, inserted] = file_.tensor_index_.emplace(info.name, tensors.size());
      if (!inserted) fail("duplicate tensor name " + info.name);
      tensors.push_back(std::move(info));
    }
  }

  uint64_t tensor_bytes(const TensorInfo& info, uint64_t elements) const {
    const BlockGeometry* g = block_geometry(info.ggml_type);
    if (g == nullptr)
      fail("tensor " + info.name + " has unknown type id " + std::to_string(info.ggml_type));
    if (static_cast<uint64_t>(info.dims[0]) % g->block_elems != 0)
      fail("tensor " + info.name + " row of " + std::to_string(info.dims[0]) +
           " elements is not a multiple of the " + tensor_type_name(info.ggml_type) +
           " block size " + std::to_string(g->block_elems));
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(elements / g->block_elems, uint64_t{g->block_bytes}, &bytes))
      fail("tensor " + info.name + " is too large (size overflows)");
    return bytes;
  }

  void place_tensor_data() {
    const uint64_t table_end = in_.position();
    const uint64_t a = file_.alignment_;
    // table_end < 2^63 (it is inside the file) and a <= 2^31 (a uint32), so rounding up
    // cannot overflow.
    const uint64_t data_offset = (table_end + a - 1) / a * a;
    file_.data_offset_ = data_offset;
    auto& tensors = file_.tensors_;
    if (tensors.empty()) return;
    if (data_offset > file_.size_)
      fail("tensor data starts at offset " + std::to_string(data_offset) + ", past the end of the file (" +
           std::to_string(file_.size_) + " bytes)");
    const uint64_t data_bytes = file_.size_ - data_offset;
    for (auto& t : tensors) {
      if (t.offset > data_bytes || t.size_bytes > data_bytes - t.offset)
        fail("tensor " + t.name + " (" + std::to_string(t.size_bytes) + " bytes at data offset " +
             std::to_string(t.offset) + ") extends past the end of the file");
      t.data = file_.base_ == nullptr ? nullptr : file_.base_ + data_offset + t.offset;
    }
    std::vector<const TensorInfo*> by_offset;
    by_offset.reserve(tensors.size());
    for (const auto& t : tensors) by_offset.push_back(&t);
    std::sort(by_offset.begin(), by_offset.end(),
              [](const TensorInfo* x, const TensorInfo* y) { return x->offset < y->offset; });
    for (size_t k = 1; k < by_offset.size(); ++k) {
      const TensorInfo& prev = *by_offset[k - 1];
      const TensorInfo& cur = *by_offset[k];
      if (prev.offset + prev.size_bytes > cur.offset)
        fail("tensors " + prev.name + " and " + cur.name + " overlap");
    }
  }

  ModelFile& file_;
  std::string name_;
  Cursor in_;
  uint64_t tensor_count_ = 0;
  uint64_t kv_count_ = 0;
};

// ---------------------------------------------------------------------------------------
// ModelFile

std::unique_ptr<ModelFile> ModelFile::open(const std::filesystem::path& path) {
  std::unique_ptr<ModelFile> file(new ModelFile());
  file->path_ = path;
  const std::string name = path.string();
  file->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file->fd_ < 0) throw Error(name + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(file->fd_, &st) != 0) throw Error(name + ": cannot stat: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw FormatError(name + ": not a regular file");
  file->size_ = static_cast<uint64_t>(st.st_size);
  if (file->size_ < kHeaderBytes)
    throw FormatError(name + ": too short for a GGUF header (" + std::to_string(file->size_) + " bytes)");
  void* mapping = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, file->fd_, 0);
  if (mapping == MAP_FAILED) throw Error(name + ": cannot map: " + std::strerror(errno));
  file->base_ = static_cast<const uint8_t*>(mapping);

  GgufParser(*file, name, file->base_, file->size_).parse();
  logger("engine.gguf")
      ->debug("{}: GGUF v{}, {} metadata keys, {} tensors, alignment {}, data at {}", name,
              file->version_, file->metadata_.size(), file->tensors_.size(), file->alignment_,
              file->data_offset_);
  return file;
}

std::unique_ptr<ModelFile> ModelFile::parse_header(std::vector<uint8_t> prefix, uint64_t file_size,
                                                   const std::string& name) {
  std::unique_ptr<ModelFile> file(new ModelFile());
  file->path_ = name;
  file->size_ = file_size;
  if (file_size < kHeaderBytes)
    throw FormatError(name + ": too short for a GGUF header (" + std::to_string(file_size) +
                      " bytes)");
  if (prefix.size() > file_size)
    throw UsageError(name + ": " + std::to_string(prefix.size()) +
                     " header bytes given for a file of " + std::to_string(file_size));
  file->header_prefix_ = std::move(prefix);
  GgufParser(*file, name, file->header_prefix_.data(), file->header_prefix_.size()).parse();
  file->header_prefix_ = {};
  return file;
}

ModelFile::~ModelFile() {
  if (base_ != nullptr) ::munmap(const_cast<uint8_t*>(base_), size_);
  if (fd_ >= 0) ::close(fd_);
}

const GgufValue* ModelFile::find(std::string_view key) const {
  const auto it = metadata_.find(std::string(key));
  return it == metadata_.end() ? nullptr : &it->second;
}

namespace {
// Runs a GgufValue accessor and names the file and key in its error.
template <typename Get>
auto typed_lookup(const ModelFile& file, std::string_view key, Get get)
    -> std::optional<decltype(get(std::declval<const GgufValue&>()))> {
  const GgufValue* v = file.find(key);
  if (v == nullptr) return std::nullopt;
  try {
    return get(*v);
  } catch (const FormatError& e) {
    throw FormatError(file.path().string() + ": metadata key " + std::string(key) + ": " + e.what());
  }
}
}  // namespace

std::optional<int64_t> ModelFile::get_int(std::string_view key) const {
  return typed_lookup(*this, key, [](const GgufValue& v) { return v.as_int(); });
}
std::optional<double> ModelFile::get_float(std::string_view key) const {
  return typed_lookup(*this, key, [](const GgufValue& v) { return v.as_float(); });
}
std::optional<bool> ModelFile::get_bool(std::string_view key) const {
  return typed_lookup(*this, key, [](const GgufValue& v) { return v.as_bool(); });
}
std::optional<std::string> ModelFile::get_string(std::string_view key) const {
  return typed_lookup(*this, key, [](const GgufValue& v) { return v.as_string(); });
}

const TensorInfo* ModelFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace granule
