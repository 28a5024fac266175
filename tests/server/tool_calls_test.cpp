// The tool-call parser over each template format, fed whole and split at every byte (a marker
// may span pieces), and the structural-tag constraint the server builds for tool_choice.
#include "tool_calls.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace granule::server {
namespace {

struct Parsed {
  std::string content;
  std::vector<ToolCall> calls;
};

// Feeds `reply` in pieces of `piece` bytes (0: whole).
Parsed parse(ToolCallFormat format, const std::string& reply, size_t piece) {
  ToolCallParser parser(format, "call_x");
  Parsed out;
  const auto take = [&out](ToolCallParser::Delta d) {
    out.content += d.content;
    for (ToolCall& c : d.calls) out.calls.push_back(std::move(c));
  };
  if (piece == 0) {
    take(parser.push(reply));
  } else {
    for (size_t i = 0; i < reply.size(); i += piece) take(parser.push(reply.substr(i, piece)));
  }
  take(parser.finish());
  return out;
}

void expect_every_split(ToolCallFormat format, const std::string& reply, const std::string& content,
                        const std::vector<ToolCall>& calls) {
  for (size_t piece : {0, 1, 2, 3, 7}) {
    const Parsed p = parse(format, reply, piece);
    EXPECT_EQ(p.content, content) << "piece " << piece;
    ASSERT_EQ(p.calls.size(), calls.size()) << "piece " << piece;
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(p.calls[i].name, calls[i].name);
      EXPECT_EQ(p.calls[i].arguments, calls[i].arguments);
      EXPECT_EQ(p.calls[i].id, "call_x_" + std::to_string(i));
    }
  }
}

TEST(ToolCallParser, HermesCallsBetweenText) {
  expect_every_split(ToolCallFormat::Hermes,
                     "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                     "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
                     "\"arguments\": {}}\n</tool_call>",
                     "Let me check.\n\n",
                     {{"", "get_weather", R"({"city":"Paris"})"}, {"", "get_time", "{}"}});
}

TEST(ToolCallParser, HermesTextWithoutCallsAndBrokenCalls) {
  expect_every_split(ToolCallFormat::Hermes, "a < b and <tool", "a < b and <tool", {});
  // Not JSON inside the tags: the text as it was.
  expect_every_split(ToolCallFormat::Hermes, "<tool_call>oops</tool_call>",
                     "<tool_call>oops</tool_call>", {});
  // The reply ended inside a complete call (no closing tag): still a call.
  expect_every_split(ToolCallFormat::Hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {}}", "",
                     {{"", "f", "{}"}});
}

TEST(ToolCallParser, Llama3WholeReplyIsACall) {
  expect_every_split(ToolCallFormat::Llama3,
                     "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", "",
                     {{"", "get_weather", R"({"city":"Rome"})"}});
  expect_every_split(ToolCallFormat::Llama3, "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}",
                     "", {{"", "f", "{}"}});
  expect_every_split(ToolCallFormat::Llama3, "The answer is 4.", "The answer is 4.", {});
  expect_every_split(ToolCallFormat::Llama3, "{not a call", "{not a call", {});
}

TEST(ToolCallParser, MistralArrayOfCalls) {
  expect_every_split(ToolCallFormat::Mistral,
                     "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", "
                     "\"arguments\": {}}]",
                     "", {{"", "a", R"({"x":1})"}, {"", "b", "{}"}});
  expect_every_split(ToolCallFormat::Mistral, "[{\"name\": \"a\", \"arguments\": {}}]", "",
                     {{"", "a", "{}"}});
  expect_every_split(ToolCallFormat::Mistral, "[1, 2] is a list", "[1, 2] is a list", {});
}

TEST(ToolCallConstraint, StructuralTagPerFormat) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
      R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
          "properties":{"b":{"type":"string"},"a":{"type":"integer"}}}}},
          {"type":"function","function":{"name":"g"}}])");
  const auto hermes = tool_call_constraint(ToolCallFormat::Hermes, tools, "", true);
  ASSERT_TRUE(hermes);
  EXPECT_EQ(hermes->kind, ConstraintKind::StructuralTag);
  const auto doc = nlohmann::ordered_json::parse(hermes->source);
  EXPECT_EQ(doc["format"]["tags"].size(), 2u);
  EXPECT_FALSE(doc["format"]["stop_after_first"].get<bool>());
  EXPECT_EQ(doc["format"]["tags"][0]["begin"], "<tool_call>\n{\"name\": \"f\", \"arguments\": ");
  // The client's property order is kept.
  EXPECT_EQ(doc["format"]["tags"][0]["content"]["json_schema"]["properties"].begin().key(), "b");
  const auto named = tool_call_constraint(ToolCallFormat::Llama3, tools, "g", true);
  ASSERT_TRUE(named);
  const auto named_doc = nlohmann::ordered_json::parse(named->source);
  EXPECT_EQ(named_doc["format"]["tags"].size(), 1u);
  EXPECT_TRUE(named_doc["format"]["stop_after_first"].get<bool>());
  EXPECT_FALSE(tool_call_constraint(ToolCallFormat::Harmony, tools, "", true));
  EXPECT_FALSE(tool_call_constraint(ToolCallFormat::Hermes, tools, "missing", true));
}

}  // namespace
}  // namespace granule::server
