// Golden tokenizations from independent tokenizers:
// - llama.cpp's vocabulary test files in GRANULE_TESTDATA_DIR/tokenizer, the data folder
//   `bash packaging/setup.sh testdata` fills (GPT-2 byte-level BPE, Llama 2 and Phi-3
//   SentencePiece): the .out ids were made by the original Hugging Face
//   tokenizers (no BOS, special tokens not parsed). Read the way llama.cpp's
//   test-tokenizer-0 reads them: the .inp file split at "\n__ggml_vocab_test__\n", the .out
//   file one line per string.
// - The default model (SmolLM2, pre-tokenizer "smollm"): tests/data/tokenizer/
//   smollm2_goldens.txt, made by tests/reference/make_smollm2_tokenizer_goldens.py with
//   Hugging Face tokenizers from the GGUF's own vocabulary and merges.
// - Phi-3's special tokens and the whitespace after them (rstrip), over llama.cpp's Phi-3
//   vocabulary: tests/data/tokenizer/phi3_goldens.txt, made by
//   tests/reference/make_phi3_tokenizer_goldens.py with Hugging Face tokenizers.
// Each test skips, naming what is missing, when its data is absent.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "granule/gguf.h"
#include "granule/testkit/gguf_writer.h"
#include "granule/tokenizer.h"
#include "support/test_files.h"

namespace granule {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<TokenId> parse_ids(const std::string& line) {
  std::vector<TokenId> ids;
  std::istringstream in(line);
  for (long id = 0; in >> id;) ids.push_back(static_cast<TokenId>(id));
  return ids;
}

std::string show(const std::vector<TokenId>& ids) {
  std::string text;
  for (TokenId id : ids) text += std::to_string(id) + " ";
  return text;
}

using granule::test::default_model_path;

struct VocabCase {
  const char* file;
};

class LlamaCppVocabGolden : public ::testing::TestWithParam<VocabCase> {};

TEST_P(LlamaCppVocabGolden, EncodesEveryStringLikeHuggingFaceAndDecodesBack) {
  const fs::path vocab = fs::path(GRANULE_TESTDATA_DIR) / "tokenizer" / GetParam().file;
  if (!fs::exists(vocab)) {
    GTEST_SKIP() << "llama.cpp's tokenizer golden " << vocab
                 << " is absent: `bash packaging/setup.sh testdata` fetches it";
  }
  const auto file = ModelFile::open(vocab);
  const auto tokenizer = Tokenizer::from_gguf(*file);

  const std::string inputs = read_file(vocab.string() + ".inp");
  const std::string separator = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0; pos < inputs.size();) {
    const size_t next = inputs.find(separator, pos);
    if (next == std::string::npos) {
      texts.push_back(inputs.substr(pos));
      break;
    }
    texts.push_back(inputs.substr(pos, next - pos));
    pos = next + separator.size();
  }
  std::ifstream outputs(vocab.string() + ".out");
  std::vector<std::vector<TokenId>> expected;
  for (std::string line; std::getline(outputs, line);) expected.push_back(parse_ids(line));
  ASSERT_EQ(texts.size(), expected.size());
  ASSERT_GT(texts.size(), 40u);

  for (size_t i = 0; i < texts.size(); ++i) {
    const std::vector<TokenId> ids = tokenizer->encode(texts[i], false, false);
    EXPECT_EQ(ids, expected[i]) << "case " << i << " '" << texts[i] << "'\n got      " << show(ids)
                                << "\n expected " << show(expected[i]);
    EXPECT_EQ(tokenizer->decode(ids), texts[i]) << "case " << i;
  }
}

// How gtest shows a case (--gtest_list_tests, failure messages): its file, not its bytes.
void PrintTo(const VocabCase& c, std::ostream* os) { *os << c.file; }

INSTANTIATE_TEST_SUITE_P(Vocabularies, LlamaCppVocabGolden,
                         ::testing::Values(VocabCase{"ggml-vocab-gpt-2.gguf"},
                                           VocabCase{"ggml-vocab-llama-spm.gguf"},
                                           VocabCase{"ggml-vocab-phi-3.gguf"},
                                           VocabCase{"ggml-vocab-deepseek-llm.gguf"},
                                           VocabCase{"ggml-vocab-gemma-4.gguf"},
                                           VocabCase{"ggml-vocab-qwen35.gguf"}),
                         [](const auto& info) {
                           std::string name = info.param.file;
                           name = name.substr(11, name.size() - 11 - 5);  // ggml-vocab-X.gguf
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

// The case: Gemma 4's vocabulary (tokenizer.ggml.model "gemma4", no add_bos_token key) adds
// BOS as llama.cpp does, takes "<turn|>" and "<eos>" as ends of generation, keeps a byte with
// no piece as its <0xXX> token, and decodes spaces from "▁".
TEST(Gemma4Tokenizer, BosEndOfTurnAndByteFallback) {
  const fs::path vocab = fs::path(GRANULE_TESTDATA_DIR) / "tokenizer" / "ggml-vocab-gemma-4.gguf";
  if (!fs::exists(vocab))
    GTEST_SKIP() << "llama.cpp's Gemma 4 vocabulary " << vocab << " is absent";
  const auto tokenizer = Tokenizer::from_gguf(*ModelFile::open(vocab));
  EXPECT_EQ(tokenizer->pre_name(), "gemma4");
  EXPECT_TRUE(tokenizer->add_bos_by_default());
  ASSERT_TRUE(tokenizer->bos());
  const std::vector<TokenId> ids = tokenizer->encode(" Hello world", true, false);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), *tokenizer->bos());
  EXPECT_EQ(tokenizer->decode(ids), " Hello world");
  for (const char* text : {"<turn|>", "<eos>"}) {
    const auto id = tokenizer->find_token(text);
    ASSERT_TRUE(id) << text;
    EXPECT_TRUE(tokenizer->is_end_of_generation(*id)) << text;
  }
  const std::vector<TokenId> raw = tokenizer->encode("\xff", false, false);
  ASSERT_EQ(raw.size(), 1u);
  EXPECT_EQ(tokenizer->token_text(raw[0]), "<0xFF>");
}

using granule::test::unescape_golden;

// The default model's tokenizer (the test skips without the model).
class SmolLM2Golden : public ::testing::Test {
 protected:
  void SetUp() override {
    const fs::path model = default_model_path();
    if (model.empty()) GTEST_SKIP() << test::kNoDefaultModel;
    tokenizer = Tokenizer::from_gguf(*ModelFile::open(model));
  }
  std::unique_ptr<Tokenizer> tokenizer;
};

TEST_F(SmolLM2Golden, MatchesHuggingFaceTokenizersOnTrickyStrings) {
  ASSERT_EQ(tokenizer->pre_name(), "smollm");

  std::ifstream goldens(fs::path(GRANULE_SOURCE_DIR) / "tests/data/tokenizer/smollm2_goldens.txt");
  ASSERT_TRUE(goldens) << "tests/data/tokenizer/smollm2_goldens.txt is missing";
  size_t cases = 0;
  for (std::string line; std::getline(goldens, line);) {
    const size_t tab1 = line.find('\t');
    const size_t tab2 = line.find('\t', tab1 + 1);
    ASSERT_NE(tab2, std::string::npos) << line;
    const bool parse_special = line.substr(0, tab1) == "1";
    const std::string text = unescape_golden(line.substr(tab1 + 1, tab2 - tab1 - 1));
    const std::vector<TokenId> expected = parse_ids(line.substr(tab2 + 1));

    const std::vector<TokenId> ids = tokenizer->encode(text, false, parse_special);
    EXPECT_EQ(ids, expected) << "'" << text << "' parse_special=" << parse_special << "\n got      "
                             << show(ids) << "\n expected " << show(expected);
    // Byte-level BPE loses nothing: the ids decode to the text (special tokens rendered).
    EXPECT_EQ(tokenizer->decode(ids, /*render_special=*/true), text);
    ++cases;
  }
  EXPECT_GT(cases, 50u);
}

// Reads a goldens file (parse_special, escaped text, ids; tab separated) and checks every
// case; returns how many there were.
size_t expect_goldens(const Tokenizer& tokenizer, const fs::path& goldens_path) {
  std::ifstream goldens(goldens_path);
  EXPECT_TRUE(goldens) << goldens_path << " is missing";
  size_t cases = 0;
  for (std::string line; std::getline(goldens, line);) {
    const size_t tab1 = line.find('\t');
    const size_t tab2 = line.find('\t', tab1 + 1);
    EXPECT_NE(tab2, std::string::npos) << line;
    if (tab2 == std::string::npos) continue;
    const bool parse_special = line.substr(0, tab1) == "1";
    const std::string text = unescape_golden(line.substr(tab1 + 1, tab2 - tab1 - 1));
    const std::vector<TokenId> expected = parse_ids(line.substr(tab2 + 1));
    const std::vector<TokenId> ids = tokenizer.encode(text, false, parse_special);
    EXPECT_EQ(ids, expected) << "'" << text << "' parse_special=" << parse_special << "\n got      "
                             << show(ids) << "\n expected " << show(expected);
    ++cases;
  }
  return cases;
}

// Phi-3's tokenizer_config.json gives </s> and its chat tokens rstrip: the whitespace after
// them is part of the token. The case: llama.cpp and Hugging Face give
// 32010 15043 32007 32001 for '<|user|>\nHello<|end|>\n<|assistant|>\n'.
TEST(Phi3Golden, SpecialTokensTakeTheWhitespaceAfterThemLikeHuggingFace) {
  const fs::path vocab = fs::path(GRANULE_TESTDATA_DIR) / "tokenizer" / "ggml-vocab-phi-3.gguf";
  if (!fs::exists(vocab)) {
    GTEST_SKIP() << vocab << " is absent: `bash packaging/setup.sh testdata` fetches it";
  }
  const auto file = ModelFile::open(vocab);
  const auto tokenizer = Tokenizer::from_gguf(*file);
  EXPECT_EQ(tokenizer->encode("<|user|>\nHello<|end|>\n<|assistant|>\n", false, true),
            (std::vector<TokenId>{32010, 15043, 32007, 32001}));
  EXPECT_GT(expect_goldens(*tokenizer,
                           fs::path(GRANULE_SOURCE_DIR) / "tests/data/tokenizer/phi3_goldens.txt"),
            15u);
}

// The rule keys on the model's name, as llama.cpp's does: the same vocabulary under another
// name keeps the whitespace (applying it to every SentencePiece model would change them all).
TEST(Phi3Golden, OtherModelsKeepTheWhitespaceAfterSpecialTokens) {
  const fs::path vocab = fs::path(GRANULE_TESTDATA_DIR) / "tokenizer" / "ggml-vocab-phi-3.gguf";
  if (!fs::exists(vocab)) {
    GTEST_SKIP() << vocab << " is absent: `bash packaging/setup.sh testdata` fetches it";
  }
  const auto phi3 = ModelFile::open(vocab);
  GgufWriter writer;
  for (const auto& [key, value] : phi3->metadata()) writer.set(key, value);
  writer.set("general.name", GgufValue::string("Not A Phi Model"));
  const fs::path renamed = fs::temp_directory_path() / "granule-phi3-renamed.gguf";
  writer.write(renamed);
  const auto file = ModelFile::open(renamed);
  const auto tokenizer = Tokenizer::from_gguf(*file);
  fs::remove(renamed);
  // The ids Granule gave before the rule, and llama.cpp gives for a model not named Phi-3.
  EXPECT_EQ(tokenizer->encode("<|user|>\nHello<|end|>\n<|assistant|>\n", false, true),
            (std::vector<TokenId>{32010, 29871, 13, 10994, 32007, 29871, 13, 32001, 29871, 13}));
}

// DeepSeek LLM beside U+2029, U+3000 and tabs, where llama.cpp and Hugging Face disagree:
// for 'мир→\u2029 \n' llama.cpp gives 23665 14728 350 20535 185 ("\u2029 " one word, its
// \s+$), Hugging Face 23665 14728 350 102 207 185 (the CJK split's U+0800-U+4E00 range takes
// U+2029 out first). Hugging Face is the reference. Its vocabulary is llama.cpp's
// ggml-vocab-deepseek-llm.gguf, which `setup.sh testdata` fetches with the other goldens.
TEST(DeepSeekLlmGolden, WhitespaceBesideParagraphSeparatorsAndTabsLikeHuggingFace) {
  const fs::path vocab =
      fs::path(GRANULE_TESTDATA_DIR) / "tokenizer" / "ggml-vocab-deepseek-llm.gguf";
  if (!fs::exists(vocab)) {
    GTEST_SKIP() << vocab << " is absent (llama.cpp's models/ folder has it)";
  }
  const auto file = ModelFile::open(vocab);
  const auto tokenizer = Tokenizer::from_gguf(*file);
  EXPECT_EQ(tokenizer->encode("\xD0\xBC\xD0\xB8\xD1\x80\xE2\x86\x92\xE2\x80\xA9 \n", false, false),
            (std::vector<TokenId>{23665, 14728, 350, 102, 207, 185}));
  EXPECT_GT(expect_goldens(*tokenizer, fs::path(GRANULE_SOURCE_DIR) /
                                           "tests/data/tokenizer/deepseek_llm_goldens.txt"),
            15u);
}

// The special ids llama.cpp reports when it loads SmolLM2 (BOS 1, EOS 2, EOT 2 found by
// text, EOG <|endoftext|> <|im_end|> and the FIM repository token <reponame>).
TEST_F(SmolLM2Golden, SpecialTokensMatchWhatLlamaCppReports) {
  EXPECT_EQ(tokenizer->model_name(), "gpt2");
  EXPECT_EQ(tokenizer->vocab_size(), 49152u);
  EXPECT_EQ(tokenizer->bos(), 1);
  EXPECT_EQ(tokenizer->eos(), 2);
  EXPECT_EQ(tokenizer->eot(), 2);
  EXPECT_FALSE(tokenizer->add_bos_by_default());
  EXPECT_FALSE(tokenizer->adds_space_prefix());
  EXPECT_EQ(tokenizer->end_of_generation_tokens(), (std::vector<TokenId>{0, 2, 4}));
  EXPECT_EQ(tokenizer->token_text(4), "<reponame>");
  EXPECT_EQ(tokenizer->find_token("<|im_start|>"), 1);
  EXPECT_EQ(tokenizer->token_attr(1), TokenAttr::Control);
}

}  // namespace
}  // namespace granule
