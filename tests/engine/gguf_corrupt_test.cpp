// Corrupt GGUF files: every truncation, targeted damage to each header, metadata and
// tensor-table field, and seeded random bit flips. Each must fail with one FormatError
// line naming the file (or, for a harmless flip, open cleanly) and never crash or hang.
// Also run under ASan+UBSan in CI, so it stays small and fast.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "granule/error.h"
#include "granule/gguf.h"
#include "granule/testkit/gguf_writer.h"

namespace granule {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

// A small model with strings, arrays and three tensors of different block types.
GgufWriter base_writer() {
  GgufWriter writer;
  writer.set("general.architecture", GgufValue::string("llama"));
  writer.set("test.count", GgufValue::u32(7));
  writer.set("dup.key1", GgufValue::u32(1));
  writer.set("dup.key2", GgufValue::u32(2));
  writer.set("test.names", GgufValue::string_array({"alpha", "beta", ""}));
  writer.set("test.floats", GgufValue::float_array(GgufType::FLOAT32, {1, 2, 3}));
  writer.set("test.flag", GgufValue::boolean_value(true));
  std::vector<float> values(256);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 17) - 8.0f;
  writer.add_tensor("tok", {8, 4}, TensorType::F32, std::span(values).first(32));
  writer.add_tensor("w1", {64, 2}, TensorType::Q4_0, std::span(values).first(128));
  writer.add_tensor("w2", {256}, TensorType::Q6_K, values);
  return writer;
}

Bytes base_file() { return base_writer().to_bytes(); }

void put_u32(Bytes& b, size_t pos, uint32_t v) { std::memcpy(b.data() + pos, &v, 4); }
void put_u64(Bytes& b, size_t pos, uint64_t v) { std::memcpy(b.data() + pos, &v, 8); }
uint64_t get_u64(const Bytes& b, size_t pos) {
  uint64_t v;
  std::memcpy(&v, b.data() + pos, 8);
  return v;
}

// Position just past the GGUF string `s` (u64 length + bytes) in the file.
size_t after_string(const Bytes& b, const std::string& s) {
  Bytes needle(8 + s.size());
  const uint64_t n = s.size();
  std::memcpy(needle.data(), &n, 8);
  std::memcpy(needle.data() + 8, s.data(), s.size());
  const auto it = std::search(b.begin(), b.end(), needle.begin(), needle.end());
  EXPECT_NE(it, b.end()) << s;
  return static_cast<size_t>(it - b.begin()) + needle.size();
}
size_t string_start(const Bytes& b, const std::string& s) { return after_string(b, s) - s.size() - 8; }

// Field positions of one tensor-table entry.
struct TensorFields {
  size_t n_dims, dims, type, offset;
};
TensorFields tensor_fields(const Bytes& b, const std::string& name, uint32_t n_dims) {
  const size_t p = after_string(b, name);
  return {p, p + 4, p + 4 + 8 * n_dims, p + 4 + 8 * n_dims + 4};
}

constexpr size_t kTensorCountPos = 8, kKvCountPos = 16, kFirstKeyPos = 24;

class CorruptGguf : public ::testing::Test {
 protected:
  CorruptGguf() {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    // Thousands of small files: tmpfs keeps that well under a second (disk: ~20 s).
    const fs::path dir = fs::is_directory("/dev/shm") && ::access("/dev/shm", W_OK) == 0
                             ? fs::path("/dev/shm")
                             : fs::temp_directory_path();
    path_ = dir /
            ("granule-" + std::to_string(::getpid()) + "-" + test->test_suite_name() + "." + test->name() + ".gguf");
  }
  ~CorruptGguf() override {
    std::error_code ec;
    fs::remove(path_, ec);
  }

  // Writes the bytes and opens them. Returns the FormatError message, or "" when the
  // file opened (then every tensor byte is read, so ASan sees any bad pointer).
  std::string open_bytes(const Bytes& bytes) {
    {
      std::ofstream out(path_, std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
    try {
      const auto model = ModelFile::open(path_);
      unsigned sum = 0;
      for (const auto& t : model->tensors())
        for (uint64_t i = 0; i < t.size_bytes; ++i) sum += t.data[i];
      for (const auto& [key, value] : model->metadata()) sum += static_cast<unsigned>(key.size() + value.array_size());
      touched_ += sum;
      return "";
    } catch (const FormatError& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.rfind(path_.string() + ": ", 0), 0u) << message;
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
      return message;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a FormatError: " << e.what();
      return e.what();
    }
  }

  // Expects a rejection whose message contains `needle`.
  void expect_rejected(const Bytes& bytes, const std::string& needle) {
    const std::string message = open_bytes(bytes);
    ASSERT_FALSE(message.empty()) << "opened, expected: " << needle;
    EXPECT_NE(message.find(needle), std::string::npos) << message;
  }

  fs::path path_;
  unsigned touched_ = 0;
};

TEST_F(CorruptGguf, BaseFileOpens) {
  const Bytes b = base_file();
  EXPECT_EQ(open_bytes(b), "");
  const auto model = ModelFile::open(path_);
  EXPECT_EQ(model->tensors().size(), 3u);
  EXPECT_EQ(model->metadata().size(), 7u);
}

TEST_F(CorruptGguf, TruncationAtEveryOffsetIsRejectedUntilTheLastTensorEnds) {
  const Bytes b = base_file();
  ASSERT_EQ(open_bytes(b), "");
  uint64_t end_of_data = 0;
  {
    const auto model = ModelFile::open(path_);
    for (const auto& t : model->tensors())
      end_of_data = std::max(end_of_data, model->data_offset() + t.offset + t.size_bytes);
  }
  ASSERT_LE(end_of_data, b.size());
  for (size_t length = 0; length < b.size(); ++length) {
    const std::string message = open_bytes(Bytes(b.begin(), b.begin() + static_cast<long>(length)));
    if (length < end_of_data)
      ASSERT_FALSE(message.empty()) << "truncated to " << length << " bytes opened";
    else
      ASSERT_EQ(message, "") << "only padding was cut at " << length;  // trailing padding is optional
  }
  EXPECT_NE(open_bytes(Bytes(b.begin(), b.begin() + 23)).find("too short"), std::string::npos);
  EXPECT_NE(open_bytes(Bytes(b.begin(), b.begin() + 40)).find("metadata count 7 is impossible"), std::string::npos);
  const auto mid_array = static_cast<long>(after_string(b, "beta") + 4);  // inside the last length
  std::string message = open_bytes(Bytes(b.begin(), b.begin() + mid_array));
  EXPECT_NE(message.find("truncated: string in array test.names"), std::string::npos) << message;
  const auto mid_data = static_cast<long>(end_of_data - 1);
  message = open_bytes(Bytes(b.begin(), b.begin() + mid_data));
  EXPECT_NE(message.find("tensor w2 (210 bytes"), std::string::npos) << message;
}

TEST_F(CorruptGguf, BadMagicAndVersions) {
  Bytes b = base_file();
  b[0] = 'X';
  expect_rejected(b, "bad magic");
  for (const auto& [version, needle] : std::vector<std::pair<uint32_t, std::string>>{
           {1, "unsupported GGUF version 1"}, {0, "unsupported GGUF version 0"},
           {4, "unsupported GGUF version 4"}, {0x03000000, "big-endian"}}) {
    b = base_file();
    put_u32(b, 4, version);
    expect_rejected(b, needle);
  }
}

TEST_F(CorruptGguf, HugeCountsFailBeforeAllocating) {
  for (uint64_t count : {uint64_t{1} << 40, uint64_t{1} << 62, ~uint64_t{0}}) {
    Bytes b = base_file();
    put_u64(b, kTensorCountPos, count);
    expect_rejected(b, "tensor count");
    b = base_file();
    put_u64(b, kKvCountPos, count);
    expect_rejected(b, "metadata count");
  }
  // Counts that are merely too large for what follows run out of bytes instead.
  Bytes b = base_file();
  put_u64(b, kKvCountPos, 20);
  EXPECT_NE(open_bytes(b), "");
}

TEST_F(CorruptGguf, HugeStringLengths) {
  for (uint64_t length : {uint64_t{1} << 32, uint64_t{1} << 62, ~uint64_t{0}}) {
    Bytes b = base_file();
    put_u64(b, kFirstKeyPos, length);  // the first key's length
    expect_rejected(b, "truncated");
    b = base_file();
    put_u64(b, string_start(b, "alpha"), length);  // a string inside an array
    expect_rejected(b, "truncated");
    b = base_file();
    put_u64(b, string_start(b, "w2"), length);  // a tensor name
    expect_rejected(b, "truncated");
  }
}

TEST_F(CorruptGguf, HugeArrayCounts) {
  for (const char* key : {"test.names", "test.floats"}) {
    for (uint64_t count : {uint64_t{1} << 33, uint64_t{1} << 61, ~uint64_t{0}}) {
      Bytes b = base_file();
      put_u64(b, after_string(b, key) + 8, count);  // after value type and element type
      expect_rejected(b, "claims");
    }
  }
}

TEST_F(CorruptGguf, UnknownValueTypesAndNestedArrays) {
  Bytes b = base_file();
  put_u32(b, after_string(b, "test.count"), 13);
  expect_rejected(b, "unknown value type 13");
  b = base_file();
  put_u32(b, after_string(b, "test.names") + 4, 77);  // element type
  expect_rejected(b, "unknown value type 77");
  b = base_file();
  put_u32(b, after_string(b, "test.names") + 4, static_cast<uint32_t>(GgufType::ARRAY));
  expect_rejected(b, "nested array");
}

TEST_F(CorruptGguf, DuplicateKeysAndTensorNames) {
  Bytes b = base_file();
  b[after_string(b, "dup.key2") - 1] = '1';
  expect_rejected(b, "duplicate metadata key dup.key1");
  b = base_file();
  b[after_string(b, "w2") - 1] = '1';
  expect_rejected(b, "duplicate tensor name w1");
}

TEST_F(CorruptGguf, TensorOffsetsPastTheEndMisalignedOrOverlapping) {
  const Bytes base = base_file();
  const auto tok = tensor_fields(base, "tok", 2);
  const auto w1 = tensor_fields(base, "w1", 2);
  const auto w2 = tensor_fields(base, "w2", 1);
  for (uint64_t offset : {uint64_t{1} << 40, ~uint64_t{0} - 31}) {
    Bytes b = base;
    put_u64(b, tok.offset, offset);
    expect_rejected(b, "extends past the end");
  }
  Bytes b = base;
  put_u64(b, w1.offset, get_u64(base, w1.offset) + 4);
  expect_rejected(b, "not a multiple of the alignment 32");
  b = base;
  put_u64(b, w2.offset, get_u64(base, w1.offset));
  expect_rejected(b, "overlap");
  b = base;
  put_u64(b, w1.offset, get_u64(base, tok.offset) + 32);  // inside tok's 128 bytes
  expect_rejected(b, "overlap");
}

TEST_F(CorruptGguf, BadDimensions) {
  const Bytes base = base_file();
  const auto tok = tensor_fields(base, "tok", 2);
  const auto w1 = tensor_fields(base, "w1", 2);
  Bytes b = base;
  put_u32(b, tok.n_dims, 5);
  expect_rejected(b, "5 dimensions");
  b = base;
  put_u32(b, tok.n_dims, 0);
  expect_rejected(b, "0 dimensions");
  b = base;
  put_u64(b, tok.dims, 0);
  expect_rejected(b, "invalid dimension 0");
  b = base;
  put_u64(b, tok.dims, uint64_t{1} << 63);
  expect_rejected(b, "invalid dimension");
  b = base;
  put_u64(b, tok.dims, uint64_t{1} << 32);
  put_u64(b, tok.dims + 8, uint64_t{1} << 32);
  expect_rejected(b, "overflow");
  b = base;
  put_u64(b, tok.dims, uint64_t{1} << 31);  // 2^62 elements of 4 bytes: the size overflows
  put_u64(b, tok.dims + 8, uint64_t{1} << 31);
  expect_rejected(b, "too large");
  b = base;
  put_u64(b, tok.dims, uint64_t{1} << 30);  // representable, but not in this file
  expect_rejected(b, "past the end");
  b = base;
  put_u64(b, w1.dims, 48);
  expect_rejected(b, "not a multiple of the Q4_0 block size 32");
}

TEST_F(CorruptGguf, UnknownTensorTypeIds) {
  const Bytes base = base_file();
  const auto tok = tensor_fields(base, "tok", 2);
  for (uint32_t id : {4u, 5u, 31u, 99u, 0xffffffffu}) {
    Bytes b = base;
    put_u32(b, tok.type, id);
    expect_rejected(b, "tensor tok has unknown type id " + std::to_string(id));
  }
}

TEST_F(CorruptGguf, BadAlignmentValues) {
  for (uint32_t alignment : {0u, 3u, 48u, 0xffffffffu}) {
    GgufWriter writer = base_writer();
    writer.set("general.alignment", GgufValue::u32(alignment));
    expect_rejected(writer.to_bytes(), "is not a power of two");
  }
  GgufWriter writer = base_writer();
  writer.set("general.alignment", GgufValue::i32(64));
  expect_rejected(writer.to_bytes(), "general.alignment must be a uint32");
  writer.set("general.alignment", GgufValue::string("64"));
  expect_rejected(writer.to_bytes(), "general.alignment must be a uint32");
  // A valid but huge alignment puts the data section past the end of the file (one
  // tensor at offset 0, which any alignment divides).
  GgufWriter huge;
  huge.set("general.alignment", GgufValue::u32(32));
  huge.add_tensor("only", {4}, TensorType::F32, std::vector<float>{1, 2, 3, 4});
  Bytes b = huge.to_bytes();
  const size_t value_pos = after_string(b, "general.alignment") + 4;
  put_u32(b, value_pos, 1u << 31);
  expect_rejected(b, "past the end of the file");
}

TEST_F(CorruptGguf, EmptyFile) { expect_rejected({}, "too short"); }

TEST_F(CorruptGguf, RandomBitFlipsNeverCrash) {
  const Bytes base = base_file();
  // Most flips land in the header, metadata and tensor table, where they matter; the
  // rest anywhere (flips in tensor data are harmless by design).
  const size_t table_end = after_string(base, "w2") + 4 + 8 + 4 + 8;
  std::mt19937 rng(20261202);
  int opened = 0, rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    Bytes b = base;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      const size_t span = (rng() % 10 < 8) ? table_end : b.size();
      const size_t pos = rng() % span;
      b[pos] ^= static_cast<uint8_t>(1u << (rng() % 8));
    }
    if (open_bytes(b).empty())
      ++opened;
    else
      ++rejected;
    if (HasFailure()) FAIL() << "trial " << trial;
  }
  // Both outcomes occur: flips in string bytes or values are harmless, flips in lengths,
  // counts, types and offsets are caught.
  EXPECT_GT(opened, 100);
  EXPECT_GT(rejected, 100);
  RecordProperty("opened", opened);
  RecordProperty("rejected", rejected);
}

}  // namespace
}  // namespace granule
