// Pre-tokenizer splits against an independent regex engine: tests/data/tokenizer/
// pretokenizer_goldens.txt holds the word lengths Hugging Face tokenizers (Oniguruma, with
// each family's tokenizer.json pre-tokenizer) gives for llama.cpp's vocabulary test
// strings and more; made by tests/reference/make_pretokenizer_goldens.py. This covers the
// families with no test vocabulary here (Llama 3, Qwen 2, GPT-4o, Tekken, DeepSeek Coder).
#include "text/tokenizer_pretokenize.h"

#include <gtest/gtest.h>

#include "support/test_files.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "granule/error.h"

namespace granule::detail {
namespace {

using granule::test::unescape_golden;

TEST(PreTokenizerGolden, SplitsLikeHuggingFaceForEveryFamily) {
  std::ifstream goldens(std::filesystem::path(GRANULE_SOURCE_DIR) /
                        "tests/data/tokenizer/pretokenizer_goldens.txt");
  ASSERT_TRUE(goldens) << "tests/data/tokenizer/pretokenizer_goldens.txt is missing";
  std::map<std::string, std::unique_ptr<PreTokenizer>> pre_tokenizers;
  std::map<std::string, int> cases_per_family;
  for (std::string line; std::getline(goldens, line);) {
    const size_t tab1 = line.find('\t');
    const size_t tab2 = line.find('\t', tab1 + 1);
    ASSERT_NE(tab2, std::string::npos) << line;
    const std::string name = line.substr(0, tab1);
    const std::string text = unescape_golden(line.substr(tab1 + 1, tab2 - tab1 - 1));
    std::vector<size_t> expected;
    std::istringstream lengths(line.substr(tab2 + 1));
    for (size_t length = 0; lengths >> length;) expected.push_back(length);

    auto& pre = pre_tokenizers[name];
    if (!pre) pre = std::make_unique<PreTokenizer>(pre_tokenizer_spec(name));
    std::vector<size_t> got;
    for (std::string_view word : pre->split(text)) got.push_back(word.size());
    EXPECT_EQ(got, expected) << name << ": '" << text << "'";
    ++cases_per_family[name];
  }
  EXPECT_GE(cases_per_family.size(), 7u);
  for (const auto& [name, cases] : cases_per_family) EXPECT_GT(cases, 40) << name;
}

TEST(PreTokenizer, WordsCoverTheTextInOrder) {
  const PreTokenizer pre(pre_tokenizer_spec("llama-bpe"));
  const std::string text = "Hello,  world!\n\n 123456 \xFF\xFE tail";
  std::string joined;
  const char* expected_next = text.data();
  for (std::string_view word : pre.split(text)) {
    EXPECT_EQ(word.data(), expected_next);  // views into the text, no gaps or overlaps
    expected_next = word.data() + word.size();
    joined += word;
  }
  EXPECT_EQ(joined, text);
  EXPECT_TRUE(pre.split("").empty());
}

TEST(PreTokenizer, UnknownNameIsUnsupportedAndMissingNameUsesDefault) {
  EXPECT_THROW(pre_tokenizer_spec("made-up"), UnsupportedError);
  EXPECT_EQ(pre_tokenizer_spec("").regexes, pre_tokenizer_spec("default").regexes);
  EXPECT_TRUE(pre_tokenizer_spec("llama-bpe").ignore_merges);
  EXPECT_TRUE(pre_tokenizer_spec("llama-bpe").add_bos);
  EXPECT_FALSE(pre_tokenizer_spec("smollm").add_bos);
}

}  // namespace
}  // namespace granule::detail
