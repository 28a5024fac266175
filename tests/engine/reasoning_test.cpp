// ReasoningParser: Qwen3 / DeepSeek-R1 <think> blocks and gpt-oss harmony channels split into
// reasoning and answer, fed whole and one byte at a time (tags split across pieces), with the
// real tag sequences those models write.
#include "granule/reasoning.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace granule {
namespace {

struct Split {
  std::string reasoning;
  std::string content;
};

// Feeds the pieces and collects everything released, checking that nothing comes out twice.
Split feed(ReasoningFormat format, const std::vector<std::string>& pieces, bool opened = false) {
  ReasoningParser parser(format, opened);
  Split out;
  for (const std::string& piece : pieces) {
    const ReasoningDelta d = parser.push(piece);
    out.reasoning += d.reasoning;
    out.content += d.content;
  }
  const ReasoningDelta d = parser.finish();
  out.reasoning += d.reasoning;
  out.content += d.content;
  return out;
}

std::vector<std::string> bytes(const std::string& text) {
  std::vector<std::string> pieces;
  for (char c : text) pieces.emplace_back(1, c);
  return pieces;
}

// Each case is checked whole, byte by byte, and in the token-sized pieces given.
void expect_split(ReasoningFormat format, const std::vector<std::string>& tokens,
                  const std::string& reasoning, const std::string& content, bool opened = false) {
  std::string whole;
  for (const std::string& t : tokens) whole += t;
  SCOPED_TRACE(whole);
  for (const auto& pieces : {std::vector<std::string>{whole}, bytes(whole), tokens}) {
    const Split s = feed(format, pieces, opened);
    EXPECT_EQ(s.reasoning, reasoning);
    EXPECT_EQ(s.content, content);
  }
}

TEST(ReasoningParser, Qwen3ThinkBlockThenAnswer) {
  expect_split(ReasoningFormat::Think,
               {"<think>", "\n", "Okay", ", the user", " asks", ".\n", "</think>", "\n\n", "The",
                " answer", " is 4."},
               "Okay, the user asks.", "The answer is 4.");
}

TEST(ReasoningParser, EmptyThinkBlockOfNonThinkingModeGivesNoReasoning) {
  expect_split(ReasoningFormat::Think, {"<think>", "\n\n", "</think>", "\n\n", "Hi", "!"}, "",
               "Hi!");
}

TEST(ReasoningParser, TemplateOpenedThinkSoTheReplyStartsInsideIt) {
  // DeepSeek-R1's template ends the prompt with "<think>\n": the reply has only the close.
  expect_split(ReasoningFormat::Think,
               {"Let", " me", " think", ".", "\n", "</think>", "\n\n", "Yes"}, "Let me think.",
               "Yes", /*opened=*/true);
}

TEST(ReasoningParser, AnswerWithoutThinkIsAllContent) {
  expect_split(ReasoningFormat::Think, {"Paris", " is", " the capital", " <b>", "."}, "",
               "Paris is the capital <b>.");
  // Text that starts like the tag but is not it.
  expect_split(ReasoningFormat::Think, {"<th", "ing>", " x"}, "", "<thing> x");
}

TEST(ReasoningParser, UnclosedThinkIsReasoningAtTheEnd) {
  expect_split(ReasoningFormat::Think, {"<think>", "\n", "still going", "</thi"},
               "still going</thi", "");
}

TEST(ReasoningParser, ThinkTagLaterInTheAnswerStaysText) {
  expect_split(ReasoningFormat::Think, {"Use", " <think>", " tags"}, "", "Use <think> tags");
}

TEST(ReasoningParser, StreamsReasoningBeforeTheCloseArrives) {
  ReasoningParser parser(ReasoningFormat::Think);
  EXPECT_EQ(parser.push("<think>\nStep one").reasoning, "Step one");
  EXPECT_TRUE(parser.in_reasoning());
  // Whitespace and a partial close wait: they may belong to the tag.
  EXPECT_EQ(parser.push(" and\n</th").reasoning, " and");
  const ReasoningDelta d = parser.push("ink>\n\nDone");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "Done");
  EXPECT_FALSE(parser.in_reasoning());
  EXPECT_TRUE(parser.saw_reasoning());
}

// gpt-oss: the prompt ends with "<|start|>assistant"; the reply is the analysis message, then
// a new assistant message on the final channel, ended by <|return|> (an end-of-generation
// token, so not in the text).
TEST(ReasoningParser, HarmonyAnalysisThenFinal) {
  expect_split(
      ReasoningFormat::Harmony,
      {"<|channel|>", "analysis", "<|message|>", "User", " asks", " 2+2", ".", "<|end|>",
       "<|start|>", "assistant", "<|channel|>", "final", "<|message|>", "2+2", " = 4", "."},
      "User asks 2+2.", "2+2 = 4.");
}

TEST(ReasoningParser, HarmonyFinalOnlyAndReturnTokenInText) {
  expect_split(ReasoningFormat::Harmony,
               {"<|channel|>", "final", "<|message|>", "Hello", "!", "<|return|>"}, "", "Hello!");
}

TEST(ReasoningParser, HarmonyCommentaryToolCallIsContentAndCallEndsIt) {
  // A tool call's header names the recipient and constrains the format; its arguments are
  // kept as the answer for the structured-output work to parse.
  expect_split(
      ReasoningFormat::Harmony,
      {"<|channel|>", "analysis", "<|message|>", "Need", " weather", ".", "<|end|>", "<|start|>",
       "assistant", "<|channel|>", "commentary", " to", "=functions", ".get_weather",
       " <|constrain|>", "json", "<|message|>", "{\"city\":\"Paris\"}", "<|call|>"},
      "Need weather.", "{\"city\":\"Paris\"}");
}

TEST(ReasoningParser, HarmonyPlainTextReplyIsContent) {
  expect_split(ReasoningFormat::Harmony, {"Just", " text", " <|", "x"}, "", "Just text <|x");
}

// Found by fuzzing (tests/fuzz/regressions/chat_template/harmony-unfinished-header): a reply
// that ends inside a channel header is released as the answer, not parsed again forever.
TEST(ReasoningParser, HarmonyReplyEndingInsideAHeaderIsReleased) {
  expect_split(ReasoningFormat::Harmony,
               {"<|channel|>", "analysis", "<|message|>", "Hm", "<|channel|>", "fin"}, "Hm",
               "<|channel|>fin");
  std::string long_header = "<|channel|>";
  long_header.append(300, 'x');
  expect_split(ReasoningFormat::Harmony, {long_header, " end"}, "", long_header + " end");
}

TEST(ReasoningParser, NoFormatPassesEverythingThrough) {
  expect_split(ReasoningFormat::None, {"<think>", "x", "</think>", "y"}, "", "<think>x</think>y");
}

}  // namespace
}  // namespace granule
