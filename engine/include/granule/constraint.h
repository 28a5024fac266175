// Structured output: a constraint on what a sequence may generate (a JSON Schema, a free JSON
// object, a GBNF grammar as llama.cpp writes them, or a regular expression). The engine
// compiles it with xgrammar into a token mask applied before every draw; a build without
// xgrammar refuses constrained requests (structured_output_available()).
#pragma once
#include <string>

namespace granule {

enum class ConstraintKind {
  None,        // free text
  JsonObject,  // any JSON object (OpenAI's response_format json_object)
  JsonSchema,  // JSON valid under `source`, a JSON Schema
  Grammar,     // text of the GBNF grammar `source`, from its rule "root"
  Regex,       // text matching the regular expression `source` in full
  // xgrammar's structural tag (a JSON document of tags, JSON schemas, literal text): what the
  // server builds for tool calls in a template's format.
  StructuralTag,
};

struct Constraint {
  ConstraintKind kind = ConstraintKind::None;
  std::string source;  // the schema, grammar or expression; empty for None and JsonObject

  bool active() const { return kind != ConstraintKind::None; }
  static Constraint json_object() { return {ConstraintKind::JsonObject, {}}; }
  static Constraint json_schema(std::string schema) {
    return {ConstraintKind::JsonSchema, std::move(schema)};
  }
  static Constraint grammar(std::string gbnf) { return {ConstraintKind::Grammar, std::move(gbnf)}; }
  static Constraint regex(std::string expression) {
    return {ConstraintKind::Regex, std::move(expression)};
  }
  static Constraint structural_tag(std::string json) {
    return {ConstraintKind::StructuralTag, std::move(json)};
  }
};

const char* constraint_kind_name(ConstraintKind kind);  // "json_schema", ...

// Whether this build can constrain generation (it was built with xgrammar).
bool structured_output_available();
// The message a constrained request gets from a build without it.
inline constexpr const char* kNoStructuredOutputMessage =
    "this build has no structured output (JSON schemas, grammars, tool calls): it was built "
    "without xgrammar; run 'bash packaging/setup.sh xgrammar' and rebuild";

}  // namespace granule
