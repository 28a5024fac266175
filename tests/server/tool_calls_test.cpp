// The tool-call parser over each template format, fed whole and split at every byte (a marker
// may span pieces), and the structural-tag constraint the server builds for tool_choice.
#include "tool_calls.h"

#include <gtest/gtest.h>

#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace granule::server {
namespace {

struct Parsed {
  std::string content;
  std::vector<ToolCall> calls;
};

// Feeds `reply` in pieces of `piece` bytes (0: whole); `forced`: a harmony reply that begins
// inside a call to that function (its header forced in the prompt).
Parsed parse(ToolCallFormat format, const std::string& reply, size_t piece,
             const std::optional<std::string>& forced = std::nullopt) {
  ToolCallParser parser(format, "call_x");
  if (forced) parser.begin_call(*forced);
  Parsed out;
  const auto take = [&out](ToolCallParser::Delta d) {
    out.content += d.content;
    add_tool_call_pieces(out.calls, d.calls);
  };
  if (piece == 0) {
    take(parser.push(reply));
  } else {
    for (size_t i = 0; i < reply.size(); i += piece) take(parser.push(reply.substr(i, piece)));
  }
  take(parser.finish());
  return out;
}

// `forced`: a harmony reply that begins inside a call to that function (its header forced in
// the prompt); "" for one whose header the prompt forced up to "to=functions.".
void expect_every_split(ToolCallFormat format, const std::string& reply, const std::string& content,
                        const std::vector<ToolCall>& calls,
                        const std::optional<std::string>& forced = std::nullopt) {
  for (size_t piece : {0, 1, 2, 3, 7}) {
    const Parsed p = parse(format, reply, piece, forced);
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
  // ... and when the length limit cut the closing tag short.
  expect_every_split(ToolCallFormat::Hermes,
                     "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool", "",
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

// gpt-oss: a call is a commentary message to=functions.NAME; other messages pass on with their
// tags, for the ReasoningParser.
TEST(ToolCallParser, HarmonyCommentaryCallAfterAnalysis) {
  const std::string analysis = "<|channel|>analysis<|message|>Need the weather.<|end|>";
  // The recipient in the channel header, <|call|> written out.
  expect_every_split(ToolCallFormat::Harmony,
                     analysis +
                         "<|start|>assistant<|channel|>commentary to=functions.get_weather "
                         "<|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
                     analysis, {{"", "get_weather", R"({"city":"Paris"})"}});
  // The recipient after the role (as the template renders past calls); <|call|> stopped the
  // reply and is not in it.
  expect_every_split(ToolCallFormat::Harmony,
                     analysis +
                         "<|start|>assistant to=functions.lookup<|channel|>commentary "
                         "json<|message|>{\"q\": [1, 2]}",
                     analysis, {{"", "lookup", R"({"q":[1,2]})"}});
  // The call as the reply's first message (the prompt ended with "<|start|>assistant").
  expect_every_split(ToolCallFormat::Harmony,
                     " to=functions.f<|channel|>commentary json<|message|>{}<|call|>", "",
                     {{"", "f", "{}"}});
  expect_every_split(ToolCallFormat::Harmony,
                     "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>",
                     "", {{"", "f", "{}"}});
}

TEST(ToolCallParser, HarmonyAnswersAndBrokenCallsPassOn) {
  const std::string answer =
      "<|channel|>analysis<|message|>a < b<|end|><|start|>assistant<|channel|>final<|message|>"
      "It is <b>4</b>.";
  expect_every_split(ToolCallFormat::Harmony, answer, answer, {});
  // Commentary to the user (no recipient) is an answer, not a call.
  const std::string preamble = "<|channel|>commentary<|message|>Checking.<|end|>";
  expect_every_split(ToolCallFormat::Harmony, preamble, preamble, {});
  // A model that ignores harmony and answers in plain text.
  expect_every_split(ToolCallFormat::Harmony, "Hello there", "Hello there", {});
  // A call cut short (max_tokens) is a call with the arguments it has, as OpenAI's.
  expect_every_split(ToolCallFormat::Harmony,
                     "<|channel|>commentary to=functions.f json<|message|>{\"a\": ", "",
                     {{"", "f", R"({"a":)"}});
  // A recipient without a function's name is not a call.
  const std::string unnamed = "<|channel|>commentary to=functions. json<|message|>{}<|end|>";
  expect_every_split(ToolCallFormat::Harmony, unnamed, unnamed, {});
}

// A harmony call streams as OpenAI's: its first piece names it (id and name) once the header is
// read, the pieces after it carry its arguments as they come; whole, they are one call.
TEST(ToolCallParser, HarmonyCallsStreamNameFirstThenArguments) {
  const std::string reply =
      "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>commentary "
      "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Rome\", \"n\": [1, 2]}"
      "<|call|>";
  ToolCallParser parser(ToolCallFormat::Harmony, "call_x");
  std::vector<ToolCallPiece> pieces;
  size_t named_at = std::string::npos;  // the byte whose push released the name
  for (size_t i = 0; i < reply.size(); ++i) {
    for (ToolCallPiece& p : parser.push(reply.substr(i, 1)).calls) {
      if (!p.id.empty()) named_at = i;
      pieces.push_back(std::move(p));
    }
  }
  for (ToolCallPiece& p : parser.finish().calls) pieces.push_back(std::move(p));
  ASSERT_GE(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].id, "call_x_0");
  EXPECT_EQ(pieces[0].name, "get_weather");
  EXPECT_EQ(pieces[0].arguments, "");  // named before any argument came
  EXPECT_EQ(named_at, reply.find("<|message|>{") + std::string("<|message|>").size() - 1);
  std::string arguments;
  for (size_t i = 1; i < pieces.size(); ++i) {
    EXPECT_EQ(pieces[i].index, 0);
    EXPECT_TRUE(pieces[i].id.empty() && pieces[i].name.empty());
    arguments += pieces[i].arguments;
  }
  EXPECT_EQ(arguments, R"({"city":"Rome","n":[1,2]})");
}

// tool_choice required with several tools: the prompt forced "to=functions.", the reply names
// the function, then the header's end and the arguments.
TEST(ToolCallParser, HarmonyRequiredCallBeginsWithTheName) {
  expect_every_split(ToolCallFormat::Harmony,
                     "get_time <|constrain|>json<|message|>{\"hour24\": true}", "",
                     {{"", "get_time", R"({"hour24":true})"}}, "");
}

TEST(ToolCallParser, HarmonyTwoCallsInOneReply) {
  expect_every_split(ToolCallFormat::Harmony,
                     "<|channel|>commentary to=functions.a json<|message|>{\"x\": 1}<|call|>"
                     "<|start|>assistant<|channel|>commentary to=functions.b json<|message|>{}"
                     "<|call|>",
                     "", {{"", "a", R"({"x":1})"}, {"", "b", "{}"}});
}

// A tool round trip through gpt-oss's own template: the assistant's call and the tool's result
// render as harmony messages, and the call message as rendered parses back into the same call.
TEST(ToolCallParser, HarmonyRoundTripThroughTheGptOssTemplate) {
  if (!ChatTemplate::jinja_available()) GTEST_SKIP() << "this build has no Jinja engine";
  std::ifstream in(std::string(GRANULE_SOURCE_DIR) + "/tests/data/chat/gpt_oss.jinja");
  std::stringstream source;
  source << in.rdbuf();
  const ChatTemplate gpt_oss = ChatTemplate::detect(source.str());
  ASSERT_EQ(tool_call_format(gpt_oss), ToolCallFormat::Harmony);
  ChatMessage call{"assistant", ""};
  call.tool_calls_json =
      R"([{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}])";
  ChatMessage result{"tool", R"({"celsius": 21})"};
  result.tool_call_id = "call_1";
  result.name = "get_weather";
  ChatOptions options;
  options.tools_json =
      R"([{"type":"function","function":{"name":"get_weather","description":"Weather now",)"
      R"("parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])";
  const std::string prompt =
      gpt_oss.render({{"user", "Weather in Paris?"}, call, result}, true, "", options);
  const std::string call_message =
      "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
      "{\"city\": \"Paris\"}<|call|>";
  EXPECT_NE(prompt.find(call_message), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("<|start|>functions.get_weather to=assistant<|channel|>commentary"
                        "<|message|>\"{\\\"celsius\\\": 21}\"<|end|>"),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("type get_weather = "), std::string::npos) << prompt;
  // What the model writes after "<|start|>assistant" is the call message without its role.
  const std::string reply = call_message.substr(std::string("<|start|>assistant").size());
  expect_every_split(ToolCallFormat::Harmony, reply, "",
                     {{"", "get_weather", R"({"city":"Paris"})"}});
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

// Harmony's forced call: the header after "<|start|>assistant" as gpt-oss writes a call, the
// arguments constrained by the tool's schema; a name, or the one tool, else nothing.
TEST(HarmonyForcedCall, HeaderAndSchemaOfTheNamedOrOnlyTool) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
      R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
          "properties":{"b":{"type":"string"},"a":{"type":"integer"}},"required":["b"]}}},
          {"type":"function","function":{"name":"g"}}])");
  const auto named = harmony_forced_call(tools, "f");
  ASSERT_TRUE(named);
  EXPECT_EQ(named->name, "f");
  EXPECT_EQ(named->header, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>");
  EXPECT_EQ(named->constraint.kind, ConstraintKind::JsonSchema);
  const auto schema = nlohmann::ordered_json::parse(named->constraint.source);
  EXPECT_EQ(schema["properties"].begin().key(), "b");  // the client's order kept
  EXPECT_EQ(schema["required"], nlohmann::ordered_json::array({"b"}));
  // A function without parameters takes any object.
  const auto bare = harmony_forced_call(tools, "g");
  ASSERT_TRUE(bare);
  EXPECT_EQ(nlohmann::ordered_json::parse(bare->constraint.source),
            nlohmann::ordered_json({{"type", "object"}}));
  EXPECT_FALSE(harmony_forced_call(tools, "missing"));
  // tool_choice required: the one tool, or nothing when there are several.
  EXPECT_FALSE(harmony_forced_call(tools, ""));
  const auto only = harmony_forced_call(nlohmann::ordered_json::array({tools[1]}), "");
  ASSERT_TRUE(only);
  EXPECT_EQ(only->name, "g");
}

// tool_choice required with several tools: "to=functions." forced, then a structural tag over
// every tool (name, the header's end with its control tokens where the vocabulary has them, the
// arguments' schema).
TEST(HarmonyForcedCall, RequiredWithSeveralToolsConstrainsTheName) {
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
      R"([{"type":"function","function":{"name":"f","parameters":{"type":"object",
          "properties":{"b":{"type":"string"}}}}},
          {"type":"function","function":{"name":"g"}}])");
  const auto call = harmony_required_call(tools, 7, 9);
  ASSERT_TRUE(call);
  EXPECT_EQ(call->name, "");
  EXPECT_EQ(call->header, "<|channel|>commentary to=functions.");
  ASSERT_EQ(call->constraint.kind, ConstraintKind::StructuralTag);
  const auto tag = nlohmann::ordered_json::parse(call->constraint.source);
  ASSERT_EQ(tag["format"]["type"], "or");
  ASSERT_EQ(tag["format"]["elements"].size(), 2u);
  const auto& f = tag["format"]["elements"][0]["elements"];
  EXPECT_EQ(f[0]["value"], "f ");
  EXPECT_EQ(f[1], nlohmann::ordered_json({{"type", "token"}, {"token", 7}}));
  EXPECT_EQ(f[2]["value"], "json");
  EXPECT_EQ(f[3], nlohmann::ordered_json({{"type", "token"}, {"token", 9}}));
  EXPECT_EQ(f[4]["json_schema"]["properties"].begin().key(), "b");
  EXPECT_EQ(tag["format"]["elements"][1]["elements"][4]["json_schema"],
            nlohmann::ordered_json({{"type", "object"}}));
  EXPECT_EQ(f[4]["max_whitespace_cnt"], 1);  // a small model fills free whitespace
  // A vocabulary without the control tokens spells the markers as text.
  const auto text = harmony_required_call(tools, std::nullopt, std::nullopt);
  ASSERT_TRUE(text);
  const auto text_tag = nlohmann::ordered_json::parse(text->constraint.source);
  EXPECT_EQ(text_tag["format"]["elements"][0]["elements"][3]["value"], "<|message|>");
  EXPECT_FALSE(harmony_required_call(nlohmann::ordered_json::array(), 7, 9));
}

// A reply that begins inside a forced call: its arguments, ended by <|call|> or by the reply's
// end (<|call|> is an end-of-generation token, not written); arguments cut short (max_tokens)
// are the call's as far as they came, as OpenAI's.
TEST(ToolCallParser, HarmonyForcedCallArguments) {
  expect_every_split(ToolCallFormat::Harmony, R"({"city": "Paris"})", "",
                     {{"", "get_weather", R"({"city":"Paris"})"}}, "get_weather");
  expect_every_split(ToolCallFormat::Harmony, R"({"city":"Paris"}<|call|>)", "",
                     {{"", "get_weather", R"({"city":"Paris"})"}}, "get_weather");
  expect_every_split(ToolCallFormat::Harmony, R"({"city": "Par)", "",
                     {{"", "get_weather", R"({"city":"Par)"}}, "get_weather");
  // A raw tab inside a string (the grammar's JSON allows it) is escaped, not a broken call.
  expect_every_split(ToolCallFormat::Harmony, "{\"city\": \"a\tb\\\"\"}", "",
                     {{"", "get_weather", R"({"city":"a\tb\""})"}}, "get_weather");
}

// The forced header follows gpt-oss's generation prompt, so the prompt ends as the model's own
// call message begins (the template's rendering of a call differs only in where it puts the
// recipient, which gpt-oss writes in either place).
TEST(HarmonyForcedCall, FollowsTheGptOssGenerationPrompt) {
  if (!ChatTemplate::jinja_available()) GTEST_SKIP() << "this build has no Jinja engine";
  std::ifstream in(std::string(GRANULE_SOURCE_DIR) + "/tests/data/chat/gpt_oss.jinja");
  std::stringstream source;
  source << in.rdbuf();
  const ChatTemplate gpt_oss = ChatTemplate::detect(source.str());
  const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(
      R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}])");
  ChatOptions options;
  options.tools_json = tools.dump();
  const auto forced = harmony_forced_call(tools, "get_weather");
  ASSERT_TRUE(forced);
  const std::string prompt =
      gpt_oss.render({{"user", "Weather in Paris?"}}, true, "", options) + forced->header;
  const std::string tail =
      "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
      "<|message|>";
  ASSERT_GE(prompt.size(), tail.size());
  EXPECT_EQ(prompt.substr(prompt.size() - tail.size()), tail) << prompt;
}

}  // namespace
}  // namespace granule::server
