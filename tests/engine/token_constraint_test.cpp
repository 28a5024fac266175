// Control tokens under a constraint (runtime/token_constraint): no text grammar (JSON Schema,
// GBNF, regex) ever allows one, and a structural tag's {"type": "token"} allows exactly the one
// it names — how harmony's forced header puts <|constrain|> and <|message|> between texts.
// Unused tokens (a synthetic vocabulary padded with them) are never allowed by a text grammar
// nor accepted either.
#include "runtime/token_constraint.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "granule/gguf.h"
#include "granule/tokenizer.h"
#include "support/temp_model.h"
#include "support/test_files.h"

namespace granule {
namespace {

class ControlTokens : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!structured_output_available()) GTEST_SKIP() << kNoStructuredOutputMessage;
    if (test::default_model_path().empty()) GTEST_SKIP() << test::kNoDefaultModel;
    file_ = ModelFile::open(test::default_model_path());
    tokenizer_ = Tokenizer::from_gguf(*file_);
    n_vocab_ = static_cast<int64_t>(tokenizer_->vocab_size());
    for (TokenId id = 0; id < n_vocab_; ++id)
      if (tokenizer_->token_attr(id) == TokenAttr::Control) control_.push_back(id);
    ASSERT_FALSE(control_.empty());
  }
  std::vector<TokenId> allowed(TokenConstraint& c) {
    std::vector<uint32_t> mask;
    c.fill_mask(mask);
    std::vector<TokenId> ids;
    for (TokenId id = 0; id < n_vocab_; ++id)
      if ((mask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u) ids.push_back(id);
    return ids;
  }
  TokenId token(const std::string& text) {
    const auto id = tokenizer_->find_token(text);
    EXPECT_TRUE(id) << text;
    return id.value_or(0);
  }
  // Whether a control token that does not end generation is among `ids`.
  bool any_control_text(const std::vector<TokenId>& ids) {
    for (TokenId id : ids)
      if (tokenizer_->token_attr(id) == TokenAttr::Control && !tokenizer_->is_end_of_generation(id))
        return true;
    return false;
  }
  std::unique_ptr<ModelFile> file_;
  std::unique_ptr<Tokenizer> tokenizer_;
  int64_t n_vocab_ = 0;
  std::vector<TokenId> control_;
};

TEST_F(ControlTokens, NoTextGrammarAllowsOne) {
  ConstraintCompiler compiler(*tokenizer_, n_vocab_);
  auto json = compiler.compile(Constraint::json_schema(R"({"type": "string"})"));
  ASSERT_TRUE(json->accept(token("\"")));
  EXPECT_FALSE(any_control_text(allowed(*json)));
  auto gbnf = compiler.compile(Constraint::grammar("root ::= [^\\n]*"));
  EXPECT_FALSE(any_control_text(allowed(*gbnf)));
  auto regex = compiler.compile(Constraint::regex(".*"));
  EXPECT_FALSE(any_control_text(allowed(*regex)));
  for (TokenId id : control_)
    if (!tokenizer_->is_end_of_generation(id)) EXPECT_FALSE(regex->accept(id)) << id;
}

TEST_F(ControlTokens, AStructuralTagsTokenAllowsExactlyThatOne) {
  TokenId control = -1;
  for (TokenId id : control_)
    if (!tokenizer_->is_end_of_generation(id)) control = id;
  ASSERT_GE(control, 0) << "the default model has no control token that does not end a reply";
  ConstraintCompiler compiler(*tokenizer_, n_vocab_);
  auto tag = compiler.compile(Constraint::structural_tag(
      R"({"type": "structural_tag", "format": {"type": "sequence", "elements": [
          {"type": "const_string", "value": "a"}, {"type": "token", "token": )" +
      std::to_string(control) + R"(}, {"type": "const_string", "value": "b"}]}})"));
  ASSERT_TRUE(tag->accept(token("a")));
  EXPECT_EQ(allowed(*tag), std::vector<TokenId>{control});
  ASSERT_TRUE(tag->accept(control));
  EXPECT_EQ(allowed(*tag), std::vector<TokenId>{token("b")});
  ASSERT_TRUE(tag->accept(token("b")));
  for (TokenId id : allowed(*tag)) EXPECT_TRUE(tokenizer_->is_end_of_generation(id)) << id;
}

TEST(UnusedTokens, NoTextGrammarAllowsOrAcceptsOne) {
  if (!structured_output_available()) GTEST_SKIP() << kNoStructuredOutputMessage;
  SyntheticModelSpec spec;
  spec.n_vocab = 3000;  // ~960 tokens with text, the rest "<|reserved_N|>" typed unused
  const test::TempModel model(spec, "unused-tokens");
  const auto file = ModelFile::open(model.path);
  const auto tokenizer = Tokenizer::from_gguf(*file);
  std::vector<TokenId> unused;
  for (TokenId id = 0; id < spec.n_vocab; ++id)
    if (tokenizer->token_attr(id) == TokenAttr::Unused) unused.push_back(id);
  ASSERT_GT(unused.size(), 1000u);
  ConstraintCompiler compiler(*tokenizer, spec.n_vocab);
  const auto allows_unused = [&](TokenConstraint& c) {
    std::vector<uint32_t> mask;
    EXPECT_TRUE(c.fill_mask(mask));
    for (TokenId id : unused)
      if ((mask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u) return true;
    return false;
  };
  auto json = compiler.compile(Constraint::json_schema(R"({"type": "string"})"));
  EXPECT_FALSE(allows_unused(*json));
  ASSERT_TRUE(json->accept(tokenizer->find_token("\"").value_or(0)));
  EXPECT_FALSE(allows_unused(*json));  // inside a string: any text
  auto gbnf = compiler.compile(Constraint::grammar("root ::= [^\\n]*"));
  EXPECT_FALSE(allows_unused(*gbnf));
  auto regex = compiler.compile(Constraint::regex(".*"));
  EXPECT_FALSE(allows_unused(*regex));
  for (TokenId id : {unused.front(), unused[unused.size() / 2], unused.back()})
    EXPECT_FALSE(regex->accept(id)) << id;
  EXPECT_TRUE(regex->accept(tokenizer->find_token("a").value_or(0)));
}

}  // namespace
}  // namespace granule
