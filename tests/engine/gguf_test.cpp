// GGUF reader and writer: round trips of every metadata type and every block type
// through files, v2 and v3, several alignments; typed getters; the real vocab-only files
// and the default model (both skipped when absent).
#include "granule/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "granule/error.h"
#include "granule/quant.h"
#include "granule/testkit/gguf_writer.h"
#include "granule/testkit/quantize.h"
#include "support/test_files.h"

namespace granule {
namespace {

namespace fs = std::filesystem;

// A file in the temp folder named after the running test, removed at scope exit.
class TempFile {
 public:
  explicit TempFile(const std::string& tag = "") {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(test->test_suite_name()) + "." + test->name() + tag;
    for (char& c : name)
      if (c == '/') c = '_';
    path_ = fs::temp_directory_path() /
            ("granule-" + std::to_string(::getpid()) + "-" + name + ".gguf");
  }
  ~TempFile() {
    std::error_code ec;
    fs::remove(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::vector<uint8_t> read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// ---------------------------------------------------------------------------------------
// Metadata

GgufValue int64_scalar(int64_t v) {
  GgufValue value;
  value.type = GgufType::INT64;
  value.i64 = v;
  value.u64 = static_cast<uint64_t>(v);
  return value;
}

// Every scalar type at its extremes, strings with multi-byte UTF-8 and an embedded NUL,
// and arrays of every element type, also empty.
std::vector<std::pair<std::string, GgufValue>> every_metadata_type() {
  using T = GgufType;
  const std::string utf8 =
      "h\xC3\xA9llo \xE2\x86\x92 \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x99\x82";  // héllo → 世界
                                                                              // 🙂
  return {
      {"t.u8", GgufValue::of(T::UINT8, 255)},
      {"t.i8.min", GgufValue::of(T::INT8, -128)},
      {"t.i8.max", GgufValue::of(T::INT8, 127)},
      {"t.u16", GgufValue::of(T::UINT16, 65535)},
      {"t.i16", GgufValue::of(T::INT16, -32768)},
      {"t.u32", GgufValue::u32(std::numeric_limits<uint32_t>::max())},
      {"t.i32", GgufValue::i32(std::numeric_limits<int32_t>::min())},
      {"t.u64", GgufValue::u64v(std::numeric_limits<uint64_t>::max())},
      {"t.i64.min", int64_scalar(std::numeric_limits<int64_t>::min())},
      {"t.i64.max", int64_scalar(std::numeric_limits<int64_t>::max())},
      {"t.f32", GgufValue::f32(3.4028235e38f)},
      {"t.f32.denormal", GgufValue::f32(1e-45f)},
      {"t.f32.negzero", GgufValue::f32(-0.0f)},
      {"t.f32.inf", GgufValue::f32(-std::numeric_limits<float>::infinity())},
      {"t.f64", GgufValue::of(T::FLOAT64, 3.141592653589793)},
      {"t.f64.tiny", GgufValue::of(T::FLOAT64, 4.9406564584124654e-324)},
      {"t.bool.true", GgufValue::boolean_value(true)},
      {"t.bool.false", GgufValue::boolean_value(false)},
      {"t.str", GgufValue::string(utf8)},
      {"t.str.empty", GgufValue::string("")},
      {"t.str.nul", GgufValue::string(std::string("a\0b", 3))},
      {"a.u8", GgufValue::int_array(T::UINT8, {0, 1, 255})},
      {"a.i8", GgufValue::int_array(T::INT8, {-128, 0, 127})},
      {"a.u16", GgufValue::int_array(T::UINT16, {0, 65535})},
      {"a.i16", GgufValue::int_array(T::INT16, {-32768, 32767})},
      {"a.u32", GgufValue::int_array(T::UINT32, {0, 4294967295LL})},
      {"a.i32", GgufValue::int_array(T::INT32, {INT32_MIN, -1, INT32_MAX})},
      {"a.u64", GgufValue::int_array(T::UINT64, {0, -1 /* UINT64_MAX, stored reinterpreted */})},
      {"a.i64", GgufValue::int_array(T::INT64, {INT64_MIN, INT64_MAX})},
      {"a.bool", GgufValue::int_array(T::BOOL, {1, 0, 1, 1})},
      {"a.f32", GgufValue::float_array(T::FLOAT32, {1.5, -0.0, 1e-45, -1e30})},
      {"a.f64", GgufValue::float_array(T::FLOAT64, {3.141592653589793, -1e300})},
      {"a.str", GgufValue::string_array({"a", "", utf8, std::string("x\0y", 3)})},
      {"a.empty.u8", GgufValue::int_array(T::UINT8, {})},
      {"a.empty.f64", GgufValue::float_array(T::FLOAT64, {})},
      {"a.empty.str", GgufValue::string_array({})},
  };
}

void expect_same_value(const std::string& key, const GgufValue& written, const GgufValue& read) {
  SCOPED_TRACE(key);
  ASSERT_EQ(read.type, written.type);
  switch (written.type) {
    case GgufType::UINT8:
    case GgufType::UINT16:
    case GgufType::UINT32:
    case GgufType::UINT64:
      EXPECT_EQ(read.u64, written.u64);
      break;
    case GgufType::INT8:
    case GgufType::INT16:
    case GgufType::INT32:
    case GgufType::INT64:
      EXPECT_EQ(read.i64, written.i64);
      break;
    case GgufType::FLOAT32:
    case GgufType::FLOAT64:
      // Bit comparison keeps -0.0 and infinities honest.
      EXPECT_EQ(std::signbit(read.f64), std::signbit(written.f64));
      EXPECT_EQ(read.f64, written.f64);
      break;
    case GgufType::BOOL:
      EXPECT_EQ(read.boolean, written.boolean);
      break;
    case GgufType::STRING:
      EXPECT_EQ(read.str, written.str);
      break;
    case GgufType::ARRAY:
      EXPECT_EQ(read.array_type, written.array_type);
      EXPECT_EQ(read.array_size(), written.array_size());
      EXPECT_EQ(read.strings, written.strings);
      EXPECT_EQ(read.ints, written.ints);
      ASSERT_EQ(read.floats.size(), written.floats.size());
      for (size_t i = 0; i < read.floats.size(); ++i) {
        const double expected = written.array_type == GgufType::FLOAT32
                                    ? static_cast<float>(written.floats[i])
                                    : written.floats[i];
        EXPECT_EQ(read.floats[i], expected) << i;
        EXPECT_EQ(std::signbit(read.floats[i]), std::signbit(expected)) << i;
      }
      break;
  }
}

class GgufVersions : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GgufVersions, EveryMetadataTypeRoundTrips) {
  GgufWriter writer(GetParam());
  const auto values = every_metadata_type();
  for (const auto& [k, v] : values) writer.set(k, v);
  TempFile file;
  writer.write(file.path());
  const auto model = ModelFile::open(file.path());
  EXPECT_EQ(model->version(), GetParam());
  EXPECT_EQ(model->metadata().size(), values.size());  // alignment 32 is not written
  for (const auto& [k, v] : values) {
    const GgufValue* read = model->find(k);
    ASSERT_NE(read, nullptr) << k;
    expect_same_value(k, v, *read);
  }
  EXPECT_TRUE(model->tensors().empty());
}

INSTANTIATE_TEST_SUITE_P(V2AndV3, GgufVersions, ::testing::Values(2u, 3u),
                         [](const auto& info) { return "v" + std::to_string(info.param); });

TEST(GgufMetadata, TypedGettersConvertWhatTheyMayAndNameTheKeyOtherwise) {
  GgufWriter writer;
  for (const auto& [k, v] : every_metadata_type()) writer.set(k, v);
  TempFile file;
  writer.write(file.path());
  const auto model = ModelFile::open(file.path());

  EXPECT_EQ(model->get_int("t.u8"), 255);
  EXPECT_EQ(model->get_int("t.i8.min"), -128);
  EXPECT_EQ(model->get_int("t.u32"), 4294967295LL);
  EXPECT_EQ(model->get_int("t.i64.min"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(model->get_float("t.i16"), -32768.0);  // integers read as numbers
  EXPECT_EQ(model->get_float("t.f32"), 3.4028235e38f);
  EXPECT_EQ(model->get_bool("t.bool.true"), true);
  EXPECT_EQ(model->get_bool("t.bool.false"), false);
  EXPECT_EQ(model->get_string("t.str.empty"), "");
  EXPECT_EQ(model->get_int("absent"), std::nullopt);
  EXPECT_EQ(model->get_string("absent"), std::nullopt);
  EXPECT_EQ(model->find("absent"), nullptr);

  auto expect_error_naming_key = [&](auto get, const std::string& key) {
    try {
      get();
      ADD_FAILURE() << key << ": no error";
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(file.path().string()), std::string::npos) << e.what();
    }
  };
  expect_error_naming_key([&] { return model->get_int("t.u64"); }, "t.u64");  // > INT64_MAX
  expect_error_naming_key([&] { return model->get_int("t.f32"); }, "t.f32");
  expect_error_naming_key([&] { return model->get_int("t.bool.true"); }, "t.bool.true");
  expect_error_naming_key([&] { return model->get_float("t.str"); }, "t.str");
  expect_error_naming_key([&] { return model->get_bool("t.u8"); }, "t.u8");
  expect_error_naming_key([&] { return model->get_string("a.str"); }, "a.str");
}

TEST(GgufValue, AccessorsAndConstructors) {
  EXPECT_EQ(GgufValue::of(GgufType::UINT16, 7).as_int(), 7);
  EXPECT_EQ(GgufValue::of(GgufType::FLOAT32, 0.1).as_float(), static_cast<double>(0.1f));
  EXPECT_EQ(GgufValue::u64v(5).as_float(), 5.0);
  EXPECT_EQ(GgufValue::string_array({"a", "b"}).array_size(), 2u);
  EXPECT_EQ(GgufValue::u32(1).array_size(), 0u);
  EXPECT_THROW(GgufValue::string("x").as_int(), FormatError);
  EXPECT_THROW(GgufValue::u32(1).as_string(), FormatError);
  EXPECT_THROW(GgufValue::of(GgufType::UINT8, -1), UsageError);
  EXPECT_THROW(GgufValue::of(GgufType::UINT64, 18446744073709551616.0), UsageError);
  EXPECT_THROW(GgufValue::of(GgufType::INT64, std::numeric_limits<double>::infinity()), UsageError);
  EXPECT_THROW(GgufValue::of(GgufType::INT16, std::nan("")), UsageError);
  EXPECT_THROW(GgufValue::of(GgufType::INT32, 1.5), UsageError);
  EXPECT_THROW(GgufValue::of(GgufType::STRING, 1), UsageError);
  EXPECT_THROW(GgufValue::int_array(GgufType::FLOAT32, {1}), UsageError);
  EXPECT_THROW(GgufValue::float_array(GgufType::INT32, {1}), UsageError);
  EXPECT_EQ(gguf_type_name(GgufType::FLOAT64), "float64");
  EXPECT_EQ(gguf_type_name(GgufType::ARRAY), "array");
}

// ---------------------------------------------------------------------------------------
// Tensors

struct TensorCase {
  std::string name;
  TensorType type;
  std::vector<int64_t> dims;
};

// Every block type, with odd row counts and one to four dimensions.
std::vector<TensorCase> every_block_type() {
  return {
      {"f32", TensorType::F32, {7, 3}},           {"f16", TensorType::F16, {5, 9}},
      {"bf16", TensorType::BF16, {3, 2, 5}},      {"q8_0", TensorType::Q8_0, {64, 3}},
      {"q4_0", TensorType::Q4_0, {96, 5}},        {"q4_1", TensorType::Q4_1, {32, 7}},
      {"q4_k", TensorType::Q4_K, {256, 3}},       {"q5_k", TensorType::Q5_K, {512, 3, 1}},
      {"q6_k", TensorType::Q6_K, {256, 1, 3, 1}},
  };
}

struct Layout {
  uint32_t version;
  uint64_t alignment;
};

class GgufTensorLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(GgufTensorLayouts, EveryBlockTypeRoundTripsAtItsAlignedOffset) {
  const auto [version, alignment] = GetParam();
  GgufWriter writer(version, alignment);
  writer.set("general.architecture", GgufValue::string("test"));
  const auto cases = every_block_type();
  std::map<std::string, std::vector<float>> values;
  uint32_t seed = 1;
  for (const auto& c : cases) {
    int64_t n = 1;
    for (int64_t d : c.dims) n *= d;
    values[c.name] = gaussian(static_cast<size_t>(n), seed++);
    writer.add_tensor(c.name, c.dims, c.type, values[c.name]);
  }
  TempFile file;
  writer.write(file.path());
  EXPECT_EQ(read_all(file.path()), writer.to_bytes());

  const auto model = ModelFile::open(file.path());
  EXPECT_EQ(model->version(), version);
  EXPECT_EQ(model->alignment(), alignment);
  EXPECT_EQ(model->get_int("general.alignment"),
            alignment == 32 ? std::nullopt : std::optional<int64_t>(alignment));
  EXPECT_EQ(model->data_offset() % alignment, 0u);
  ASSERT_EQ(model->tensors().size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& c = cases[i];
    SCOPED_TRACE(c.name);
    const TensorInfo& t = model->tensors()[i];  // file order is kept
    EXPECT_EQ(model->find_tensor(c.name), &t);
    EXPECT_EQ(t.name, c.name);
    EXPECT_EQ(t.dims, c.dims);
    EXPECT_EQ(t.ggml_type, static_cast<uint32_t>(c.type));
    EXPECT_EQ(t.rows(), t.elements() / c.dims[0]);
    EXPECT_EQ(t.offset % alignment, 0u);
    EXPECT_EQ(t.data, model->base() + model->data_offset() + t.offset);
    // The stored bytes are exactly the encoder's, row by row.
    const size_t per_row = row_bytes(c.type, c.dims[0]);
    ASSERT_EQ(t.size_bytes, per_row * static_cast<size_t>(t.rows()));
    std::vector<uint8_t> expected(t.size_bytes);
    for (int64_t r = 0; r < t.rows(); ++r)
      quantize_row(c.type, values[c.name].data() + r * c.dims[0], expected.data() + r * per_row,
                   c.dims[0]);
    EXPECT_EQ(0, std::memcmp(t.data, expected.data(), expected.size()));
  }
  EXPECT_EQ(model->find_tensor("absent"), nullptr);
}

// How gtest shows a case (--gtest_list_tests, failure messages), not as raw bytes.
void PrintTo(const Layout& l, std::ostream* os) {
  *os << "GGUF v" << l.version << ", alignment " << l.alignment;
}

INSTANTIATE_TEST_SUITE_P(VersionsAndAlignments, GgufTensorLayouts,
                         ::testing::Values(Layout{3, 32}, Layout{2, 32}, Layout{3, 64},
                                           Layout{2, 64}, Layout{3, 8}, Layout{3, 256}),
                         [](const auto& info) {
                           return "v" + std::to_string(info.param.version) + "_align" +
                                  std::to_string(info.param.alignment);
                         });

TEST(GgufTensors, RawTensorOfAnUnsupportedButKnownTypeOpens) {
  // IQ2_XXS (id 16): the reader accepts it (the model loader names it); 256 elements, 66 bytes.
  GgufWriter writer;
  writer.add_raw_tensor("iq2_xxs", {256, 2}, 16, std::vector<uint8_t>(132, 0x11));
  TempFile file;
  writer.write(file.path());
  const auto model = ModelFile::open(file.path());
  ASSERT_EQ(model->tensors().size(), 1u);
  EXPECT_EQ(model->tensors()[0].size_bytes, 132u);
  EXPECT_FALSE(tensor_type_info(model->tensors()[0].ggml_type).has_value());
  EXPECT_EQ(model->tensors()[0].data[131], 0x11);
}

TEST(GgufWriter, RejectsInconsistentInput) {
  EXPECT_THROW(GgufWriter(1), UsageError);
  EXPECT_THROW(GgufWriter(3, 48), UsageError);
  EXPECT_THROW(GgufWriter(3, 0), UsageError);
  GgufWriter writer;
  const std::vector<float> six(6);
  EXPECT_THROW(writer.add_tensor("wrong count", {4, 2}, TensorType::F32, six), UsageError);
  EXPECT_THROW(writer.add_tensor("partial block", {6}, TensorType::Q8_0, six), UsageError);
  EXPECT_THROW(writer.add_tensor("no dims", {}, TensorType::F32, six), UsageError);
  EXPECT_THROW(writer.add_tensor("zero dim", {6, 0}, TensorType::F32, six), UsageError);
  writer.add_tensor("t", {6}, TensorType::F32, six);
  EXPECT_THROW(writer.add_tensor("t", {6}, TensorType::F32, six), UsageError);
  EXPECT_THROW(writer.add_raw_tensor("short", {32}, 8, std::vector<uint8_t>(33)), UsageError);
  writer.set("too.big", GgufValue::int_array(GgufType::UINT8, {256}));
  EXPECT_THROW(writer.to_bytes(), UsageError);
}

TEST(GgufWriter, SettingAKeyTwiceKeepsTheLastValue) {
  GgufWriter writer;
  writer.set("k", GgufValue::u32(1));
  writer.set("k", GgufValue::string("two"));
  TempFile file;
  writer.write(file.path());
  const auto model = ModelFile::open(file.path());
  EXPECT_EQ(model->metadata().size(), 1u);
  EXPECT_EQ(model->get_string("k"), "two");
}

TEST(GgufWriter, AlignmentKeySetLaterMovesThePadding) {
  GgufWriter writer;
  writer.set("general.alignment", GgufValue::u32(128));
  writer.add_tensor("a", {3}, TensorType::F32, std::vector<float>{1, 2, 3});
  writer.add_tensor("b", {3}, TensorType::F32, std::vector<float>{4, 5, 6});
  TempFile file;
  writer.write(file.path());
  const auto model = ModelFile::open(file.path());
  EXPECT_EQ(model->alignment(), 128u);
  EXPECT_EQ(model->find_tensor("b")->offset, 128u);
  EXPECT_EQ(reinterpret_cast<const float*>(model->find_tensor("b")->data)[2], 6.0f);
}

TEST(GgufOpen, MissingFileAndDirectoryAreErrorsNamingThePath) {
  const fs::path missing = fs::temp_directory_path() / "granule-no-such-model.gguf";
  try {
    ModelFile::open(missing);
    ADD_FAILURE() << "opened a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing.string()), std::string::npos) << e.what();
  }
  EXPECT_THROW(ModelFile::open(fs::temp_directory_path()), FormatError);
}

// ---------------------------------------------------------------------------------------
// Real files

// Counts and names from the `gguf` Python package's GGUFReader on these files.
TEST(GgufRealFiles, VocabOnlyFilesOpenWithTheirTokenArrays) {
  const fs::path dir = fs::path(GRANULE_TESTDATA_DIR) / "tokenizer";
  if (!fs::exists(dir)) {
    GTEST_SKIP() << dir << " is absent: `bash packaging/setup.sh testdata` fetches it";
  }
  const std::map<std::string, std::pair<size_t, std::string>> expected = {
      {"ggml-vocab-gpt-2.gguf", {50257, "gpt2"}},
      {"ggml-vocab-llama-spm.gguf", {32000, "llama"}},
      {"ggml-vocab-phi-3.gguf", {32064, "phi3"}},
  };
  int opened = 0;
  std::string missing;
  for (const auto& [name, facts] : expected) {
    const fs::path p = dir / name;
    if (!fs::exists(p)) {
      // A partial skip: gtest cannot mark part of a test skipped, so it is printed.
      std::cout << "SKIP: " << p << " is absent: `bash packaging/setup.sh testdata` fetches it\n";
      missing += " " + name;
      continue;
    }
    SCOPED_TRACE(name);
    const auto model = ModelFile::open(p);
    ++opened;
    EXPECT_EQ(model->version(), 3u);
    EXPECT_TRUE(model->tensors().empty());
    EXPECT_EQ(model->get_string("general.architecture"), facts.second);
    const GgufValue* tokens = model->find("tokenizer.ggml.tokens");
    ASSERT_NE(tokens, nullptr);
    EXPECT_EQ(tokens->type, GgufType::ARRAY);
    EXPECT_EQ(tokens->array_type, GgufType::STRING);
    EXPECT_EQ(tokens->strings.size(), facts.first);
  }
  if (opened == 0) GTEST_SKIP() << "none of the vocabulary files in " << dir << ":" << missing;
}

using granule::test::default_model_path;

// Expected facts are from the `gguf` Python package (GGUFReader and gguf.quants) on the
// same file (sha256 b179c952...).
TEST(GgufRealFiles, DefaultModelOpensWithItsLayersAndTensors) {
  const fs::path p = default_model_path();
  if (p.empty()) GTEST_SKIP() << test::kNoDefaultModel;
  const auto model = ModelFile::open(p);
  EXPECT_EQ(model->version(), 3u);
  EXPECT_EQ(model->get_string("general.architecture"), "llama");
  EXPECT_EQ(model->get_int("llama.block_count"), 30);
  EXPECT_EQ(model->get_int("llama.embedding_length"), 576);
  EXPECT_EQ(model->get_int("llama.attention.head_count"), 9);
  EXPECT_EQ(model->get_int("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(model->get_int("llama.feed_forward_length"), 1536);
  EXPECT_EQ(model->get_float("llama.rope.freq_base"), 100000.0);
  EXPECT_EQ(model->get_float("llama.attention.layer_norm_rms_epsilon"), static_cast<double>(1e-5f));
  EXPECT_EQ(model->find("tokenizer.ggml.tokens")->strings.size(), 49152u);
  EXPECT_EQ(model->data_offset(), 1785664u);

  ASSERT_EQ(model->tensors().size(), 272u);
  std::map<uint32_t, int> by_type;
  for (const auto& t : model->tensors()) {
    ++by_type[t.ggml_type];
    EXPECT_GE(t.data, model->base() + model->data_offset()) << t.name;
    EXPECT_LE(t.data + t.size_bytes, model->base() + model->file_size()) << t.name;
  }
  EXPECT_EQ(by_type[static_cast<uint32_t>(TensorType::Q4_1)], 210);
  EXPECT_EQ(by_type[static_cast<uint32_t>(TensorType::F32)], 61);
  EXPECT_EQ(by_type[static_cast<uint32_t>(TensorType::Q8_0)], 1);
  for (int layer = 0; layer < 30; ++layer)
    EXPECT_NE(model->find_tensor("blk." + std::to_string(layer) + ".attn_q.weight"), nullptr)
        << layer;

  const TensorInfo* embd = model->find_tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->dims, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(embd->size_bytes, 30081024u);

  // First values of row 0, as gguf.quants.dequantize gives them.
  struct Row0 {
    const char* name;
    float first[4];
  };
  const Row0 rows[] = {
      {"blk.0.attn_q.weight", {-0x1.8a8p-4f, 0x1.424p-3f, -0x1.8a8p-4f, -0x1.76p-1f}},
      {"token_embd.weight", {-0x1.b468p-4f, 0x1.0e28p-5f, 0x1.8ad8p-5f, -0x1.761p-6f}},
      {"blk.29.ffn_down.weight", {-0x1.17ep-2f, 0x1.7d8p-3f, 0x1.7d8p-3f, 0x1.8c8p-5f}},
  };
  for (const auto& r : rows) {
    const TensorInfo* t = model->find_tensor(r.name);
    ASSERT_NE(t, nullptr) << r.name;
    std::vector<float> row(static_cast<size_t>(t->dims[0]));
    dequantize_row(static_cast<TensorType>(t->ggml_type), t->data, row.data(), t->dims[0]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(row[i], r.first[i]) << r.name << " [" << i << "]";
  }
}

}  // namespace
}  // namespace granule
