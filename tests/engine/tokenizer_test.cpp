// Tokenizer behaviour on tiny hand-built vocabularies (written with GgufWriter, so every
// expected id follows from the vocabulary in the test), plus round trips, the incremental
// detokenizer and a size sanity check on the real vocabularies when they are present.
#include "granule/tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "granule/error.h"
#include "granule/gguf.h"
#include "granule/testkit/byte_level.h"
#include "granule/testkit/gguf_writer.h"
#include "support/test_files.h"
#include "text/tokenizer_utf8.h"

namespace granule {
namespace {

namespace fs = std::filesystem;

constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kByte = 6;

struct VocabSpec {
  std::string model = "gpt2";
  std::string pre = "gpt2";
  std::vector<std::string> tokens;
  std::vector<int32_t> types;  // empty: all normal
  std::vector<double> scores;  // empty: none written
  std::vector<std::string> merges;
  std::vector<std::pair<std::string, GgufValue>> extra;
};

class TinyVocab : public ::testing::Test {
 protected:
  void TearDown() override {
    std::error_code ignored;
    fs::remove_all(dir_, ignored);
  }

  std::unique_ptr<Tokenizer> build(const VocabSpec& spec) {
    GgufWriter writer;
    writer.set("general.architecture", GgufValue::string("llama"));
    writer.set("tokenizer.ggml.model", GgufValue::string(spec.model));
    if (!spec.pre.empty()) writer.set("tokenizer.ggml.pre", GgufValue::string(spec.pre));
    writer.set("tokenizer.ggml.tokens", GgufValue::string_array(spec.tokens));
    std::vector<int64_t> types(spec.tokens.size(), kNormal);
    for (size_t i = 0; i < spec.types.size(); ++i) types[i] = spec.types[i];
    writer.set("tokenizer.ggml.token_type", GgufValue::int_array(GgufType::INT32, types));
    if (!spec.scores.empty()) {
      writer.set("tokenizer.ggml.scores", GgufValue::float_array(GgufType::FLOAT32, spec.scores));
    }
    if (!spec.merges.empty()) {
      writer.set("tokenizer.ggml.merges", GgufValue::string_array(spec.merges));
    }
    for (const auto& [key, value] : spec.extra) writer.set(key, value);
    fs::create_directories(dir_);
    const fs::path path = dir_ / ("vocab" + std::to_string(files_++) + ".gguf");
    writer.write(path);
    file_ = ModelFile::open(path);
    return Tokenizer::from_gguf(*file_);
  }

  // A byte-level vocabulary: the 256 byte characters (ids 0..255), then `more`.
  static VocabSpec byte_level(std::vector<std::string> more, std::vector<std::string> merges) {
    VocabSpec spec;
    for (int byte = 0; byte < 256; ++byte) spec.tokens.push_back(gpt2_byte_symbol(byte));
    for (auto& token : more) spec.tokens.push_back(std::move(token));
    spec.merges = std::move(merges);
    return spec;
  }

  // A SentencePiece vocabulary: <unk> <s> </s>, then `pieces` with their scores, then the
  // 256 byte tokens when with_bytes.
  static VocabSpec sentencepiece(std::vector<std::pair<std::string, double>> pieces,
                                 bool with_bytes) {
    VocabSpec spec;
    spec.model = "llama";
    spec.pre = "default";
    spec.tokens = {"<unk>", "<s>", "</s>"};
    spec.types = {kUnknown, kControl, kControl};
    spec.scores = {0, 0, 0};
    for (auto& [piece, score] : pieces) {
      spec.tokens.push_back(piece);
      spec.types.push_back(kNormal);
      spec.scores.push_back(score);
    }
    if (with_bytes) {
      for (int byte = 0; byte < 256; ++byte) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", byte);
        spec.tokens.push_back(name);
        spec.types.push_back(kByte);
        spec.scores.push_back(0);
      }
    }
    return spec;
  }

  TokenId id_of(const Tokenizer& tokenizer, std::string_view text) {
    const auto id = tokenizer.find_token(text);
    EXPECT_TRUE(id.has_value()) << "no token '" << text << "'";
    return id.value_or(-1);
  }

 private:
  fs::path dir_ =
      fs::temp_directory_path() / ("granule_tokenizer_test_" + std::to_string(::getpid()) + "_" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::unique_ptr<ModelFile> file_;
  int files_ = 0;
};

// --- byte-level BPE ----------------------------------------------------------------------

TEST_F(TinyVocab, BpeAppliesMergesInRankOrder) {
  // "abc": with "b c" ranked first the word becomes a|bc; with "a b" first, ab|c.
  auto bc_first = build(byte_level({"ab", "bc"}, {"b c", "a b"}));
  EXPECT_EQ(bc_first->encode("abc", false, false),
            (std::vector<TokenId>{'a', id_of(*bc_first, "bc")}));
  auto ab_first = build(byte_level({"ab", "bc"}, {"a b", "b c"}));
  EXPECT_EQ(ab_first->encode("abc", false, false),
            (std::vector<TokenId>{id_of(*ab_first, "ab"), 'c'}));
}

TEST_F(TinyVocab, BpeMergesChainAndPreferTheLeftmostOfEqualPairs) {
  auto tokenizer = build(byte_level({"aa", "aaa", "aaaa"}, {"a a", "aa a", "aa aa"}));
  const TokenId aa = id_of(*tokenizer, "aa"), aaaa = id_of(*tokenizer, "aaaa");
  // "aaaaa": the a|a pairs merge leftmost first (0-1, then 2-3, leaving the last a); then
  // aa|a (rank 1) goes before aa|aa (rank 2), so the result is aa, aaa.
  EXPECT_EQ(tokenizer->encode("aaaaa", false, false),
            (std::vector<TokenId>{aa, id_of(*tokenizer, "aaa")}));
  EXPECT_EQ(tokenizer->encode("aaaa", false, false), (std::vector<TokenId>{aaaa}));
  EXPECT_EQ(tokenizer->encode("aaa", false, false),
            (std::vector<TokenId>{id_of(*tokenizer, "aaa")}));
}

TEST_F(TinyVocab, BpeMapsSpacesAndBytesThroughGpt2Characters) {
  const std::string space = gpt2_byte_symbol(' ');  // "Ġ"
  auto tokenizer = build(byte_level({space + "a"}, {space + " a"}));
  const TokenId space_a = id_of(*tokenizer, space + "a");
  // The GPT-2 split keeps the space with the word after it.
  EXPECT_EQ(tokenizer->encode("a a", false, false), (std::vector<TokenId>{'a', space_a}));
  EXPECT_EQ(tokenizer->token_to_piece(space_a), " a");
  // A byte with no merge stays its own byte token, whatever it is.
  const std::string bytes = "\xC3\xA9\n\x01";
  const auto ids = tokenizer->encode(bytes, false, false);
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(tokenizer->decode(ids), bytes);
}

TEST_F(TinyVocab, BpeRejectsUnknownModelAndPreTokenizerByName) {
  auto spec = byte_level({}, {"a b"});
  auto expect_refused = [this](const VocabSpec& s, const std::string& name) {
    try {
      build(s);
      ADD_FAILURE() << "an unknown name was accepted: " << name;
    } catch (const UnsupportedError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  };
  spec.pre = "no-such-pre";
  expect_refused(spec, "no-such-pre");  // an unknown pre-tokenizer
  spec.pre = "gpt2";
  spec.model = "bert";
  expect_refused(spec, "bert");  // an unknown tokenizer model
}

TEST_F(TinyVocab, MissingVocabularyPartsAreFormatErrors) {
  auto no_merges = byte_level({}, {});
  EXPECT_THROW(build(no_merges), FormatError);
  auto short_types = byte_level({}, {"a b"});
  short_types.extra.emplace_back("tokenizer.ggml.token_type",
                                 GgufValue::int_array(GgufType::INT32, {1, 1}));
  EXPECT_THROW(build(short_types), FormatError);
  auto text_scores = byte_level({}, {"a b"});
  text_scores.extra.emplace_back("tokenizer.ggml.scores",
                                 GgufValue::string_array(std::vector<std::string>(256, "x")));
  EXPECT_THROW(build(text_scores), FormatError);
}

TEST_F(TinyVocab, SpecialIdsOutsideTheVocabularyAreIgnored) {
  auto spec = byte_level({}, {"a b"});
  spec.extra.emplace_back("tokenizer.ggml.bos_token_id", GgufValue::u32(100000));
  spec.extra.emplace_back("tokenizer.ggml.eos_token_id", GgufValue::u32(7));
  auto tokenizer = build(spec);
  EXPECT_FALSE(tokenizer->bos().has_value());
  EXPECT_EQ(tokenizer->eos(), 7);
}

TEST_F(TinyVocab, KnownPreTokenizerNamesAllCompile) {
  for (const char* pre :
       {"default", "gpt-2", "llama-bpe", "llama3", "smollm", "qwen2", "starcoder", "deepseek-llm",
        "deepseek-coder", "falcon", "refact", "command-r", "gpt-4o", "phi-2", "tekken", "bloom"}) {
    auto spec = byte_level({}, {"a b"});
    spec.pre = pre;
    auto tokenizer = build(spec);
    const std::string text = "Hello, World 123!\n\t  x 你好";
    EXPECT_EQ(tokenizer->decode(tokenizer->encode(text, false, false)), text) << pre;
  }
}

TEST_F(TinyVocab, SmollmSplitsEveryDigitButGpt2KeepsNumbersTogether) {
  // With a merge "1 2" a GPT-2 split forms "12"; SmolLM's digit split never lets it.
  auto spec = byte_level({"12"}, {"1 2"});
  spec.pre = "gpt2";
  auto gpt2 = build(spec);
  EXPECT_EQ(gpt2->encode("12", false, false), (std::vector<TokenId>{id_of(*gpt2, "12")}));
  spec.pre = "smollm";
  auto smollm = build(spec);
  EXPECT_EQ(smollm->encode("12", false, false), (std::vector<TokenId>{'1', '2'}));
}

TEST_F(TinyVocab, Llama3TakesAWholeWordTokenBeforeMerging) {
  // "abc" is a token no merge sequence reaches (only "a b" exists). Llama 3's tokenizer
  // (ignore_merges) takes the word as it is; plain GPT-2 BPE cannot.
  auto spec = byte_level({"ab", "abc"}, {"a b"});
  spec.pre = "llama-bpe";
  auto llama3 = build(spec);
  EXPECT_EQ(llama3->encode("abc", false, false), (std::vector<TokenId>{id_of(*llama3, "abc")}));
  spec.pre = "gpt2";
  auto gpt2 = build(spec);
  EXPECT_EQ(gpt2->encode("abc", false, false), (std::vector<TokenId>{id_of(*gpt2, "ab"), 'c'}));
}

// --- special tokens, BOS, end of generation ---------------------------------------------

TEST_F(TinyVocab, SpecialTokensParseOnlyWhenAskedButUserDefinedAlways) {
  auto spec =
      byte_level({"<|im_start|>", "<|im_end|>", "<tool>", "<|end|>", "<|endoftext|>"}, {"a b"});
  spec.types.assign(256, kNormal);
  spec.types.insert(spec.types.end(), {kControl, kControl, kUserDefined, kControl, kControl});
  auto tokenizer = build(spec);
  const TokenId start = id_of(*tokenizer, "<|im_start|>");
  const TokenId tool = id_of(*tokenizer, "<tool>");

  const auto parsed = tokenizer->encode("<|im_start|>a<tool>", false, true);
  EXPECT_EQ(parsed, (std::vector<TokenId>{start, 'a', tool}));

  const auto plain = tokenizer->encode("<|im_start|>a<tool>", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), start), 0);
  EXPECT_EQ(plain.back(), tool);  // user-defined tokens are split out even as plain text
  EXPECT_EQ(tokenizer->decode(plain), "<|im_start|>a<tool>");

  // The longest special wins where two start alike.
  EXPECT_EQ(tokenizer->encode("<|endoftext|>", false, true),
            (std::vector<TokenId>{id_of(*tokenizer, "<|endoftext|>")}));

  // Control tokens render only on request; user-defined ones always.
  EXPECT_EQ(tokenizer->token_to_piece(start), "");
  EXPECT_EQ(tokenizer->token_to_piece(start, true), "<|im_start|>");
  EXPECT_EQ(tokenizer->token_to_piece(tool), "<tool>");
  EXPECT_EQ(tokenizer->decode(parsed), "a<tool>");
  EXPECT_EQ(tokenizer->decode(parsed, true), "<|im_start|>a<tool>");
  IncrementalDetokenizer hidden(*tokenizer);
  EXPECT_EQ(hidden.push(start), "");
  IncrementalDetokenizer shown(*tokenizer, /*render_special=*/true);
  EXPECT_EQ(shown.push(start), "<|im_start|>");
}

TEST_F(TinyVocab, BosIsAddedOnlyWhenAskedAndPresent) {
  auto spec = byte_level({"<s>"}, {"a b"});
  spec.types.assign(256, kNormal);
  spec.types.push_back(kControl);
  spec.extra.emplace_back("tokenizer.ggml.bos_token_id", GgufValue::u32(256));
  spec.extra.emplace_back("tokenizer.ggml.add_bos_token", GgufValue::boolean_value(true));
  auto with_bos = build(spec);
  EXPECT_TRUE(with_bos->add_bos_by_default());
  EXPECT_EQ(with_bos->encode("a", true, false), (std::vector<TokenId>{256, 'a'}));
  EXPECT_EQ(with_bos->encode("a", false, false), (std::vector<TokenId>{'a'}));

  auto without = build(byte_level({}, {"a b"}));
  EXPECT_FALSE(without->bos().has_value());
  EXPECT_FALSE(without->add_bos_by_default());
  EXPECT_EQ(without->encode("a", true, false), (std::vector<TokenId>{'a'}));
}

TEST_F(TinyVocab, EndOfGenerationCoversEosEotAndEndTokensByText) {
  auto spec = byte_level({"</s>", "<|im_end|>", "<|eot_id|>", "<|im_start|>"}, {"a b"});
  spec.types.assign(256, kNormal);
  // <|eot_id|> is mislabelled normal on purpose: it must still end generation and be
  // treated as a control token.
  spec.types.insert(spec.types.end(), {kControl, kControl, kNormal, kControl});
  spec.extra.emplace_back("tokenizer.ggml.eos_token_id", GgufValue::u32(256));
  auto tokenizer = build(spec);
  const TokenId eos = 256, im_end = 257, eot_id = 258, im_start = 259;
  EXPECT_EQ(tokenizer->eos(), eos);
  EXPECT_EQ(tokenizer->eot(), eot_id);  // <|eot_id|> is preferred over <|im_end|>
  for (TokenId id : {eos, im_end, eot_id}) EXPECT_TRUE(tokenizer->is_end_of_generation(id)) << id;
  EXPECT_FALSE(tokenizer->is_end_of_generation(im_start));
  EXPECT_FALSE(tokenizer->is_end_of_generation('a'));
  EXPECT_EQ(tokenizer->end_of_generation_tokens(), (std::vector<TokenId>{eos, im_end, eot_id}));
  EXPECT_EQ(tokenizer->token_attr(eot_id), TokenAttr::Control);
}

// gpt-oss's o200k_harmony vocabulary: <|return|> and <|call|> end a reply, <|end|> only closes
// a message (the analysis before the final answer), and the structure tokens render as text
// so the reasoning parser can read the channels — as llama.cpp's vocabulary does it.
TEST_F(TinyVocab, HarmonyEndsOnReturnAndCallAndRendersItsStructureTokens) {
  auto spec = byte_level({"<|return|>", "<|call|>", "<|end|>", "<|start|>", "<|channel|>",
                          "<|message|>", "<|constrain|>", "<|endoftext|>"},
                         {"a b"});
  spec.types.assign(256, kNormal);
  spec.types.insert(spec.types.end(), 8, kControl);
  spec.extra.emplace_back("tokenizer.ggml.eos_token_id", GgufValue::u32(256));
  auto tokenizer = build(spec);
  const TokenId ret = 256, call = 257, end = 258, start = 259, channel = 260, message = 261,
                constrain = 262, endoftext = 263;
  EXPECT_EQ(tokenizer->end_of_generation_tokens(), (std::vector<TokenId>{ret, call, endoftext}));
  EXPECT_FALSE(tokenizer->is_end_of_generation(end));
  for (TokenId id : {end, start, channel, message, constrain}) {
    EXPECT_EQ(tokenizer->token_attr(id), TokenAttr::UserDefined) << id;
    EXPECT_EQ(tokenizer->token_to_piece(id), tokenizer->token_text(id));
  }
  EXPECT_EQ(tokenizer->token_to_piece(ret), "");  // still hidden: it ends the reply
  // Without <|return|> and <|call|> (Phi-3), <|end|> ends generation as before.
  auto phi = byte_level({"<|end|>", "<|channel|>"}, {"a b"});
  phi.types.assign(256, kNormal);
  phi.types.insert(phi.types.end(), 2, kControl);
  auto phi_tokenizer = build(phi);
  EXPECT_TRUE(phi_tokenizer->is_end_of_generation(256));
  EXPECT_EQ(phi_tokenizer->token_attr(257), TokenAttr::Control);
}

TEST_F(TinyVocab, TokenToPieceRejectsIdsOutsideTheVocabulary) {
  auto tokenizer = build(byte_level({}, {"a b"}));
  EXPECT_THROW(tokenizer->token_to_piece(-1), UsageError);
  EXPECT_THROW(tokenizer->token_to_piece(256), UsageError);
}

// --- SentencePiece BPE -------------------------------------------------------------------

TEST_F(TinyVocab, SentencePieceMergesByScoreAndAddsTheSpacePrefix) {
  // "▁ab": "ab" scores higher than "▁a", so the text splits ▁|ab; with the scores
  // swapped it splits ▁a|b.
  auto ab_wins =
      build(sentencepiece({{"▁", -3}, {"a", -4}, {"b", -4}, {"▁a", -2}, {"ab", -1}}, false));
  EXPECT_EQ(ab_wins->encode("ab", false, false),
            (std::vector<TokenId>{id_of(*ab_wins, "▁"), id_of(*ab_wins, "ab")}));
  auto space_a_wins =
      build(sentencepiece({{"▁", -3}, {"a", -4}, {"b", -4}, {"▁a", -1}, {"ab", -2}}, false));
  EXPECT_EQ(space_a_wins->encode("ab", false, false),
            (std::vector<TokenId>{id_of(*space_a_wins, "▁a"), id_of(*space_a_wins, "b")}));
  EXPECT_TRUE(space_a_wins->adds_space_prefix());
  // Spaces inside the text become ▁ too, and decode takes the prefix off again.
  const auto ids = space_a_wins->encode("a a", true, false);
  EXPECT_EQ(ids, (std::vector<TokenId>{1, id_of(*space_a_wins, "▁a"), id_of(*space_a_wins, "▁a")}));
  EXPECT_EQ(space_a_wins->decode(ids), "a a");
  EXPECT_EQ(space_a_wins->token_to_piece(id_of(*space_a_wins, "▁a")), " a");
}

TEST_F(TinyVocab, SentencePieceFallsBackToBytesThenToUnknown) {
  auto with_bytes = build(sentencepiece({{"▁", -1}, {"a", -1}, {"▁a", -0.5}}, true));
  // "€" is no piece: its three UTF-8 bytes become <0xE2> <0x82> <0xAC>.
  const auto ids = with_bytes->encode("a€", false, false);
  EXPECT_EQ(ids,
            (std::vector<TokenId>{id_of(*with_bytes, "▁a"), id_of(*with_bytes, "<0xE2>"),
                                  id_of(*with_bytes, "<0x82>"), id_of(*with_bytes, "<0xAC>")}));
  EXPECT_EQ(with_bytes->token_to_piece(id_of(*with_bytes, "<0x82>")), "\x82");
  EXPECT_EQ(with_bytes->decode(ids), "a€");

  auto without_bytes = build(sentencepiece({{"▁", -1}, {"a", -1}, {"▁a", -0.5}}, false));
  EXPECT_EQ(without_bytes->encode("a€", false, false),
            (std::vector<TokenId>{id_of(*without_bytes, "▁a"), 0}));
  EXPECT_EQ(without_bytes->unknown(), 0);
}

TEST_F(TinyVocab, SentencePieceNeverFormsControlTokensFromText) {
  auto spec = sentencepiece({{"▁", -1}, {"<", -1}, {"s", -1}, {">", -1}, {"<s", -0.5}}, false);
  auto tokenizer = build(spec);
  // "<s>" is the control token 1, reachable by merging "<s" and ">": text must not become it.
  const auto ids = tokenizer->encode("<s>", false, false);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 0);
  EXPECT_EQ(tokenizer->decode(ids), "<s>");
  EXPECT_EQ(tokenizer->encode("<s>", false, true), (std::vector<TokenId>{1}));
  // Llama defaults: BOS 1 added by default, EOS 2 ends generation.
  EXPECT_TRUE(tokenizer->add_bos_by_default());
  EXPECT_TRUE(tokenizer->is_end_of_generation(2));
}

// --- incremental detokenizer -------------------------------------------------------------

bool is_valid_utf8(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    size_t length = lead < 0x80 ? 1 : lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC2 ? 2 : 0;
    if (length == 0 || i + length > text.size()) return false;
    for (size_t k = 1; k < length; ++k) {
      if ((static_cast<unsigned char>(text[i + k]) & 0xC0) != 0x80) return false;
    }
    i += length;
  }
  return true;
}

TEST_F(TinyVocab, DetokenizerHoldsBytesUntilTheCharacterIsComplete) {
  auto tokenizer = build(sentencepiece({{"▁", -1}, {"a", -1}, {"▁a", -0.5}}, true));
  IncrementalDetokenizer detokenizer(*tokenizer);
  const auto ids = tokenizer->encode("a🦙a", false, false);  // ▁a, 4 byte tokens, a
  ASSERT_EQ(ids.size(), 6u);
  EXPECT_EQ(detokenizer.push(ids[0]), "a");  // the space prefix is taken off
  EXPECT_EQ(detokenizer.push(ids[1]), "");
  EXPECT_EQ(detokenizer.push(ids[2]), "");
  EXPECT_EQ(detokenizer.push(ids[3]), "");
  EXPECT_EQ(detokenizer.push(ids[4]), "🦙");
  EXPECT_EQ(detokenizer.push(ids[5]), "a");
  EXPECT_EQ(detokenizer.flush(), "");
}

TEST_F(TinyVocab, DetokenizerReplacesBytesThatCanNeverFormACharacter) {
  auto tokenizer = build(sentencepiece({{"▁", -1}, {"a", -1}}, true));
  const TokenId e2 = id_of(*tokenizer, "<0xE2>"), x82 = id_of(*tokenizer, "<0x82>"),
                ff = id_of(*tokenizer, "<0xFF>"), a = id_of(*tokenizer, "a");
  IncrementalDetokenizer detokenizer(*tokenizer);
  EXPECT_EQ(detokenizer.push(ff), "\xEF\xBF\xBD");  // 0xFF starts nothing: replaced at once
  EXPECT_EQ(detokenizer.push(e2), "");
  EXPECT_EQ(detokenizer.push(a),
            "\xEF\xBF\xBD"
            "a");  // E2 then "a": E2 was cut short
  EXPECT_EQ(detokenizer.push(e2), "");
  EXPECT_EQ(detokenizer.push(x82), "");
  EXPECT_EQ(detokenizer.flush(), "\xEF\xBF\xBD");  // one U+FFFD for the cut-off E2 82
  EXPECT_EQ(detokenizer.flush(), "");
  detokenizer.reset();
  EXPECT_EQ(detokenizer.push(id_of(*tokenizer, "▁")), "");  // first token again: space off
}

// --- real vocabularies -------------------------------------------------------------------

fs::path testdata_vocab(const char* name) {
  return fs::path(GRANULE_TESTDATA_DIR) / "tokenizer" / name;
}

using granule::test::default_model_path;

std::vector<fs::path> real_vocabularies() {
  std::vector<fs::path> found;
  for (const fs::path& path :
       {testdata_vocab("ggml-vocab-gpt-2.gguf"), testdata_vocab("ggml-vocab-llama-spm.gguf"),
        testdata_vocab("ggml-vocab-phi-3.gguf"), default_model_path()}) {
    if (!path.empty() && fs::exists(path)) {
      found.push_back(path);
    } else {
      // Printed, as the test goes on with the others (gtest cannot skip part of a test).
      std::cout << "SKIP: vocabulary " << (path.empty() ? fs::path("(the default model)") : path)
                << " is absent: `bash packaging/setup.sh testdata` / `model` fetches it\n";
    }
  }
  return found;
}

// Random text from code points a chat sees: ASCII, whitespace runs, Latin-1, Cyrillic,
// CJK, emoji (with modifiers), digits of several scripts.
std::string random_text(std::mt19937& rng, size_t characters) {
  static const std::vector<std::pair<uint32_t, uint32_t>> ranges = {
      {0x20, 0x7E},       {0x20, 0x20},   {0x0A, 0x0A},     {0x09, 0x09},
      {0xA0, 0xFF},       {0x400, 0x44F}, {0x4E00, 0x4FFF}, {0x1F300, 0x1F64F},
      {0x1F3FB, 0x1F3FF}, {0x660, 0x669}, {0xFF10, 0xFF19}};
  std::string text;
  for (size_t i = 0; i < characters; ++i) {
    const auto& range = ranges[rng() % ranges.size()];
    const uint32_t cp = range.first + rng() % (range.second - range.first + 1);
    utf8::append_codepoint(text, cp);
  }
  return text;
}

constexpr const char* kNoRealVocabulary =
    "no real vocabulary found (llama.cpp's goldens in " GRANULE_TESTDATA_DIR
    "/tokenizer, the default model): `bash packaging/setup.sh testdata model` fetches them";

TEST(RealVocabularies, RandomUtf8RoundTripsAndStreamsWithoutPartialCharacters) {
  const auto vocabularies = real_vocabularies();
  if (vocabularies.empty()) GTEST_SKIP() << kNoRealVocabulary;
  for (const fs::path& path : vocabularies) {
    SCOPED_TRACE(path.filename().string());
    const auto file = ModelFile::open(path);
    const auto tokenizer = Tokenizer::from_gguf(*file);
    std::mt19937 rng(1234);
    for (int round = 0; round < 60; ++round) {
      const std::string text = random_text(rng, 1 + rng() % 80);
      const auto ids = tokenizer->encode(text, round % 2 == 0, false);
      const std::string decoded = tokenizer->decode(ids);
      ASSERT_EQ(decoded, text) << "round " << round;

      IncrementalDetokenizer detokenizer(*tokenizer);
      std::string streamed;
      for (TokenId id : ids) {
        const std::string piece = detokenizer.push(id);
        ASSERT_TRUE(is_valid_utf8(piece)) << "partial UTF-8 emitted in round " << round;
        streamed += piece;
      }
      streamed += detokenizer.flush();
      ASSERT_EQ(streamed, decoded) << "round " << round;
    }
  }
}

TEST(RealVocabularies, OneTokenizerEncodesFromSeveralThreadsAtOnce) {
  const auto vocabularies = real_vocabularies();
  if (vocabularies.empty()) GTEST_SKIP() << kNoRealVocabulary;
  const auto file = ModelFile::open(vocabularies.front());
  const auto tokenizer = Tokenizer::from_gguf(*file);
  std::mt19937 rng(7);
  std::vector<std::string> texts;
  for (int i = 0; i < 8; ++i) texts.push_back(random_text(rng, 2000));
  std::vector<std::vector<TokenId>> expected;
  for (const auto& text : texts) expected.push_back(tokenizer->encode(text, false, false));

  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          if (tokenizer->encode(texts[i], false, false) != expected[i]) ++mismatches[t];
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

TEST(RealVocabularies, ByteLevelBpeKeepsInvalidUtf8Bytes) {
  const fs::path path = testdata_vocab("ggml-vocab-gpt-2.gguf");
  if (!fs::exists(path))
    GTEST_SKIP() << path << " is absent: `bash packaging/setup.sh testdata` fetches it";
  const auto file = ModelFile::open(path);
  const auto tokenizer = Tokenizer::from_gguf(*file);
  const std::string text = "ok \xFF\xFE bad \xE2\x82 cut \xC3";
  EXPECT_EQ(tokenizer->decode(tokenizer->encode(text, false, false)), text);
}

// Not a timed assert (speed is for benchmarks): a 100 KB text — prose, a 20,000-space run
// and a 20,000-letter word with no break — must encode without quadratic blow-up, which
// would take minutes here and trip the test's timeout. The time is printed.
TEST(RealVocabularies, HundredKilobyteTextEncodesInOnePass) {
  const auto vocabularies = real_vocabularies();
  if (vocabularies.empty()) GTEST_SKIP() << kNoRealVocabulary;
  std::mt19937 rng(99);
  std::string text;
  while (text.size() < 60'000) text += random_text(rng, 200) + "\n\nThe quick brown fox. ";
  text += std::string(20'000, ' ') + std::string(20'000, 'x');
  for (const fs::path& path : vocabularies) {
    const auto file = ModelFile::open(path);
    const auto tokenizer = Tokenizer::from_gguf(*file);
    const auto start = std::chrono::steady_clock::now();
    const auto ids = tokenizer->encode(text, false, false);
    const auto elapsed_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::printf("  %s: %zu bytes -> %zu tokens in %.1f ms\n", path.filename().c_str(), text.size(),
                ids.size(), elapsed_ms);
    EXPECT_EQ(tokenizer->decode(ids), text);
  }
}

}  // namespace
}  // namespace granule
