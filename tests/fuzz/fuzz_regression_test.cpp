// Replays the fuzz inputs through the normal (non-fuzz) build: every seed in
// tests/fuzz/corpus/HARNESS/ and every reproducer the fuzzers found, kept in
// tests/fuzz/regressions/HARNESS/ (one ctest each, named after its file). Each must end
// cleanly: a harness catches granule::Error only, so any other exception, a crash or a
// failed round-trip check fails the test (and, in a sanitizer build, any memory error).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "granule/error.h"
#include "granule/gguf.h"
#include "granule/model_config.h"
#include "harnesses.h"

namespace granule::fuzz {
namespace {

namespace fs = std::filesystem;

const fs::path kFuzzDir = fs::path(GRANULE_SOURCE_DIR) / "tests" / "fuzz";

std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> files;
  if (fs::is_directory(dir)) {
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.is_regular_file()) files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

void run_harness(const std::string& harness, const std::vector<uint8_t>& bytes) {
  if (harness == "gguf_open") {
    open_gguf(bytes.data(), bytes.size());
  } else if (harness == "tokenizer") {
    init_tokenizers(GRANULE_TESTDATA_DIR);
    tokenize(bytes.data(), bytes.size());
  } else if (harness == "chat_template") {
    render_chat(bytes.data(), bytes.size());
  } else {
    FAIL() << "unknown harness folder '" << harness << "'";
  }
}

class SeedCorpus : public ::testing::TestWithParam<std::string> {};

TEST_P(SeedCorpus, EverySeedEndsCleanly) {
  const std::vector<fs::path> seeds = files_in(kFuzzDir / "corpus" / GetParam());
  ASSERT_FALSE(seeds.empty()) << "no seeds in tests/fuzz/corpus/" << GetParam();
  for (const fs::path& seed : seeds) {
    SCOPED_TRACE(seed.filename().string());
    EXPECT_NO_THROW(run_harness(GetParam(), read_bytes(seed)));
  }
}

INSTANTIATE_TEST_SUITE_P(Harnesses, SeedCorpus,
                         ::testing::Values("gguf_open", "tokenizer", "chat_template"));

struct Reproducer {
  std::string harness;
  fs::path file;
};

void PrintTo(const Reproducer& r, std::ostream* os) {
  *os << r.harness << "/" << r.file.filename();
}

std::vector<Reproducer> reproducers() {
  std::vector<Reproducer> all;
  for (const char* harness : {"gguf_open", "tokenizer", "chat_template"}) {
    for (const fs::path& file : files_in(kFuzzDir / "regressions" / harness)) {
      all.push_back({harness, file});
    }
  }
  return all;
}

class FuzzReproducer : public ::testing::TestWithParam<Reproducer> {};

TEST_P(FuzzReproducer, EndsCleanly) {
  EXPECT_NO_THROW(run_harness(GetParam().harness, read_bytes(GetParam().file)));
}

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(FuzzReproducer);
INSTANTIATE_TEST_SUITE_P(Found, FuzzReproducer, ::testing::ValuesIn(reproducers()),
                         [](const auto& info) {
                           std::string name =
                               info.param.harness + "_" + info.param.file.filename().string();
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

// Found by fuzz_gguf_open: a 17 KB file whose block_count is about 10^7 made the weight table
// allocate 1.8 GB for its layers before finding blk.0 missing. Now a one-line FormatError.
TEST(FuzzFound, HugeBlockCountIsAFormatErrorNotAnAllocation) {
  const fs::path file =
      kFuzzDir / "regressions" / "gguf_open" / "oom-block-count-sizes-layer-table";
  const auto model = ModelFile::open(file);
  const ModelConfig config = ModelConfig::from_gguf(*model);
  try {
    (void)WeightTable::from_gguf(*model, config);
    FAIL() << "expected a FormatError";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("block_count"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace granule::fuzz
