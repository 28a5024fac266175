// Structured output through the engine API (Request::constraint): on the default model
// (SmolLM2-135M, CPU), every reply to a JSON Schema, a free JSON object, a GBNF grammar and a
// regular expression is what the constraint asks, constrained and free sequences share steps,
// bad constraints are refused at submit(), and telemetry counts the constrained sequences.
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "granule/engine.h"
#include "granule/error.h"
#include "support/engine_chats.h"
#include "support/test_files.h"

namespace granule {
namespace {

struct Reply {
  std::string text;
  FinishReason reason = FinishReason::None;
  std::string error;
};

Request chat(const std::string& question, Constraint constraint, Reply& out, int32_t max_tokens) {
  Request r;
  r.messages = {{"user", question}};
  r.sampling = SamplingParams::greedy();
  r.sampling.max_tokens = max_tokens;
  r.constraint = std::move(constraint);
  r.sink.on_token = [&out](SequenceId, const std::string& text, int32_t) { out.text += text; };
  r.sink.on_finish = [&out](SequenceId, FinishReason reason, const std::string& error) {
    out.reason = reason;
    out.error = error;
  };
  return r;
}

std::unique_ptr<Engine> open_default() {
  EngineOptions o = test::cpu_engine_options(1024, 4);
  return Engine::open(test::default_model_path(), o);
}

void run(Engine& engine) {
  for (int i = 0; i < 5000 && engine.step(); ++i) {
  }
  EXPECT_TRUE(engine.idle());
}

TEST(EngineConstraint, RefusedWithoutXgrammarOrForBadInput) {
  if (test::default_model_path().empty()) GTEST_SKIP() << test::kNoDefaultModel;
  auto engine = open_default();
  Reply out;
  if (!structured_output_available()) {
    try {
      engine->submit(chat("hi", Constraint::json_object(), out, 8));
      FAIL() << "a constrained request was accepted by a build without structured output";
    } catch (const UnsupportedError& e) {
      EXPECT_NE(std::string(e.what()).find("setup.sh xgrammar"), std::string::npos) << e.what();
    }
    return;
  }
  EXPECT_THROW(engine->submit(chat("hi", Constraint::json_schema("{not json"), out, 8)),
               UsageError);
  EXPECT_THROW(engine->submit(chat("hi", Constraint::grammar("root ::= undefined_rule"), out, 8)),
               UsageError);
  EXPECT_THROW(engine->submit(chat("hi", Constraint::regex("(unclosed"), out, 8)), UsageError);
  EXPECT_TRUE(engine->idle());
}

TEST(EngineConstraint, RepliesFollowTheirConstraintBesideAFreeOne) {
  if (test::default_model_path().empty()) GTEST_SKIP() << test::kNoDefaultModel;
  if (!structured_output_available()) GTEST_SKIP() << kNoStructuredOutputMessage;
  auto engine = open_default();
  Reply schema, object, grammar, regex, free;
  const std::string person =
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":20},)"
      R"("age":{"type":"integer","minimum":0,"maximum":150}},"required":["name","age"],)"
      R"("additionalProperties":false})";
  engine->submit(chat("Describe a person as JSON.", Constraint::json_schema(person), schema, 96));
  engine->submit(chat("Give me a JSON object about Paris.", Constraint::json_object(), object, 96));
  engine->submit(chat("Is Paris in France?",
                      Constraint::grammar(R"(root ::= ("yes" | "no") ", " [a-z ]{1,20} ".")"),
                      grammar, 48));
  engine->submit(
      chat("When was Paris founded?", Constraint::regex("[0-9]{3,4} (BC|AD)"), regex, 16));
  engine->submit(chat("What is the capital of France?", {}, free, 24));
  bool saw_mixed_step = false;
  for (int i = 0; i < 5000 && engine->step(); ++i) {
    const TelemetrySnapshot t = engine->telemetry();
    if (t.throughput.constrained_sequences > 0 &&
        t.throughput.constrained_sequences < t.scheduler.running)
      saw_mixed_step = true;
    if (t.throughput.constrained_sequences > 0) EXPECT_GE(t.throughput.last_mask_us, 0.0);
  }
  EXPECT_TRUE(engine->idle());
  EXPECT_TRUE(saw_mixed_step) << "constrained and free sequences never shared a step";

  EXPECT_EQ(schema.reason, FinishReason::Eos) << schema.text << " " << schema.error;
  EXPECT_TRUE(std::regex_match(schema.text,
                               std::regex(R"(\{"name": "[^"]{0,20}", "age": (0|[1-9][0-9]*)\})")))
      << schema.text;
  // A free object may run to max_tokens (the small model lists on): then only its start is
  // checked.
  EXPECT_TRUE(object.reason == FinishReason::Eos || object.reason == FinishReason::MaxTokens)
      << object.text << " " << object.error;
  ASSERT_FALSE(object.text.empty());
  EXPECT_EQ(object.text.front(), '{') << object.text;
  if (object.reason == FinishReason::Eos) EXPECT_EQ(object.text.back(), '}') << object.text;
  EXPECT_EQ(grammar.reason, FinishReason::Eos) << grammar.text << " " << grammar.error;
  EXPECT_TRUE(std::regex_match(grammar.text, std::regex(R"((yes|no), [a-z ]{1,20}\.)")))
      << grammar.text;
  EXPECT_EQ(regex.reason, FinishReason::Eos) << regex.text << " " << regex.error;
  EXPECT_TRUE(std::regex_match(regex.text, std::regex(R"([0-9]{3,4} (BC|AD))"))) << regex.text;
  EXPECT_NE(free.reason, FinishReason::Error) << free.error;
  EXPECT_FALSE(free.text.empty());
}

}  // namespace
}  // namespace granule
