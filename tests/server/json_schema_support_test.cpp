// Which JSON Schemas structured output takes (app/server/json_schema_support): each rule on a
// small schema, and, over the JSON-Schema-Test-Suite (draft 2020-12) with xgrammar, that no
// grammar compiled from an accepted schema lets through an instance the suite calls invalid.
#include "json_schema_support.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "openai_request.h"

#ifdef GRANULE_TEST_HAVE_XGRAMMAR
#include <xgrammar/xgrammar.h>
#endif

namespace granule::server {
namespace {

using ojson = nlohmann::ordered_json;

// The 400's message for `schema`, or "" when it is taken.
std::string refusal(const std::string& schema) {
  try {
    enforceable_json_schema(ojson::parse(schema), "schema");
    return "";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    return e.what();
  }
}

void expect_taken(const std::string& schema) { EXPECT_EQ(refusal(schema), "") << schema; }

void expect_refused(const std::string& schema, const std::string& names) {
  const std::string message = refusal(schema);
  EXPECT_NE(message.find(names), std::string::npos) << schema << " → " << message;
}

TEST(JsonSchemaSupport, TypedKeywordsTheConverterEnforcesAreTaken) {
  expect_taken(R"({"type": "integer", "minimum": 1, "exclusiveMaximum": 10})");
  expect_taken(R"({"type": "number", "minimum": 1.5, "maximum": 2.5})");
  expect_taken(R"({"type": "integer", "multipleOf": 3})");
  expect_taken(R"({"type": "integer", "multipleOf": 3, "minimum": 0, "maximum": 99})");
  expect_taken(R"({"type": "string", "minLength": 2, "maxLength": 5})");
  expect_taken(R"({"type": "string", "pattern": "^[a-z]+$"})");
  expect_taken(R"({"type": "string", "format": "date-time"})");
  expect_taken(R"({"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3})");
  expect_taken(R"({"type": "array", "prefixItems": [{"type": "integer"}], "items": false})");
  expect_taken(R"({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"],
                   "additionalProperties": false, "minProperties": 1})");
  expect_taken(R"({"type": "object", "propertyNames": {"maxLength": 3}})");
  expect_taken(R"({"type": "object", "patternProperties": {"^x": {"type": "integer"}}})");
  expect_taken(R"({"type": ["string", "null"], "maxLength": 4})");
  expect_taken(R"({"enum": ["a", "b"], "type": "string", "title": "T"})");
  expect_taken(R"({"allOf": [{"type": "string"}]})");
  expect_taken(R"({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"})");
  expect_taken(R"({"type": "object", "properties": {"next": {"$ref": "#"}}})");
  // Keywords for another type than the schema's constrain nothing there.
  expect_taken(R"({"type": "string", "minimum": 3})");
}

TEST(JsonSchemaSupport, KeywordsTheConverterIgnoresAreRefusedByName) {
  expect_refused(R"({"type": "object", "not": {}})", "'not'");
  expect_refused(R"({"if": {"type": "string"}, "then": {"minLength": 1}})", "'if'");
  expect_refused(R"({"type": "array", "contains": {"type": "integer"}})", "'contains'");
  expect_refused(R"({"type": "array", "uniqueItems": true})", "'uniqueItems'");
  expect_refused(R"({"type": "number", "multipleOf": 0.5})", "'multipleOf'");
  expect_refused(R"({"type": "integer", "multipleOf": 2, "minimum": 0})", "'multipleOf'");
  expect_refused(R"({"type": "string", "format": "idn-email"})", "\"idn-email\"");
  expect_refused(R"({"type": "string", "format": "json-pointer"})", "'format'");
  expect_refused(R"({"type": "string", "pattern": "a+", "maxLength": 3})", "'maxLength'");
  expect_refused(R"({"type": "string", "format": "email", "pattern": "a"})", "'pattern'");
  expect_refused(R"({"type": "object", "dependentRequired": {"a": ["b"]}})", "'dependentRequired'");
  expect_refused(R"({"allOf": [{"type": "string"}, {"maxLength": 2}]})", "'allOf'");
  expect_refused(R"({"oneOf": [{"type": "integer"}, {"minimum": 2}]})", "'oneOf'");
  expect_refused(R"({"type": "object", "properties": {"xa": {}},
                     "patternProperties": {"^x": {"type": "integer"}}})",
                 "'patternProperties'");
  expect_refused(R"({"type": "object", "properties": {"a": {}}, "propertyNames": {}})",
                 "'propertyNames'");
  expect_refused(R"({"type": "object", "required": ["a"]})", "'schema.required'");
  // A made-up name may come twice, which the grammar counts and a JSON parser does not.
  expect_refused(R"({"type": "object", "additionalProperties": {}, "minProperties": 2})",
                 "'minProperties'");
  expect_taken(R"({"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 2})");
  expect_refused(R"({"type": "string", "contentEncoding": "base64"})", "'contentEncoding'");
  expect_refused(R"({"type": "string", "x-custom": 1})", "'x-custom'");
}

TEST(JsonSchemaSupport, KeywordsBesideABranchAreRefused) {
  // The converter reads $ref, const, enum, anyOf, oneOf and allOf alone.
  expect_refused(R"({"$defs": {"a": {"type": "array"}}, "$ref": "#/$defs/a", "maxItems": 2})",
                 "'maxItems' (in 'schema') is not supported for structured output: beside '$ref'");
  expect_refused(R"({"type": "integer", "anyOf": [{"minimum": 2}, {"maximum": 0}]})", "'type'");
  expect_refused(R"({"enum": [1, "a"], "type": "string"})", "holds 1");
  expect_refused(R"({"const": "a", "maxLength": 0})", "'maxLength'");
}

TEST(JsonSchemaSupport, OneOfIsTakenWhenItsBranchesAreProvablyApart) {
  expect_taken(R"({"oneOf": [{"type": "integer"}, {"type": "string"}]})");
  expect_taken(R"({"oneOf": [{"const": 1}, {"const": 2}, {"type": "string"}]})");
  expect_taken(R"({"oneOf": [
      {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}},
       "required": ["kind"]},
      {"type": "object", "properties": {"kind": {"const": "b"}}, "required": ["kind"]}]})");
  expect_refused(R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})", "'oneOf'");
}

TEST(JsonSchemaSupport, ReferencesResolveOnlyInsideTheSchema) {
  expect_refused(R"({"$ref": "http://example.com/a.json"})", "must point into the schema");
  expect_refused(R"({"$ref": "#foo"})", "must point into the schema");
  expect_refused(R"({"$defs": {"a~b": {}}, "$ref": "#/$defs/a~0b"})", "without escapes");
  expect_refused(R"({"$ref": "#/$defs/missing"})", "points at nothing");
  expect_refused(R"({"type": "object", "properties": {"a": {"$id": "x", "type": "string"}}})",
                 "'$id'");
  // What a $ref points at is checked like the rest.
  expect_refused(R"({"$defs": {"a": {"type": "object", "not": {}}}, "$ref": "#/$defs/a"})",
                 "'not'");
}

TEST(JsonSchemaSupport, ADeepOrMalformedSchemaIsA400NotACrash) {
  std::string deep = R"({"type": "integer"})";
  for (int i = 0; i < 100000; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  expect_refused(deep, "more than 64 deep");
  expect_refused(R"({"minItems": "x"})", "'schema.minItems' must be a non-negative integer");
  expect_refused(R"({"type": "integer", "minimum": 18446744073709551615})", "whole number");
  expect_refused(R"({"type": "string", "format": 7})", "'format'");
  expect_refused(R"({"enum": []})", "non-empty");
  expect_refused(R"({"anyOf": {}})", "non-empty array");
}

TEST(JsonSchemaSupport, AFalseSchemaIsTakenOnlyWhereTheConverterReadsIt) {
  expect_taken(R"({"type": "object", "properties": {"a": {}}, "additionalProperties": false})");
  expect_taken(R"({"type": "array", "prefixItems": [{}], "items": false})");
  expect_refused(R"({"type": "object", "properties": {"a": false}})", "the schema false");
  expect_refused(R"(false)", "the schema false");
}

TEST(JsonSchemaSupport, ATypelessSchemaGetsEveryTypeItsKeywordsAllow) {
  const ojson out = enforceable_json_schema(ojson::parse(R"({"minimum": 2})"), "schema");
  EXPECT_EQ(out["minimum"], 2);
  EXPECT_EQ(out["type"], ojson::parse(R"(["null", "boolean", "number", "string", "array",
                                           "object"])"));
  // No array can hold minItems items here (strict mode allows no items the schema does not
  // describe): arrays are left out, which only narrows the replies.
  const ojson arrays = enforceable_json_schema(ojson::parse(R"({"minItems": 1})"), "schema");
  EXPECT_EQ(arrays["type"], ojson::parse(R"(["null", "boolean", "number", "string", "object"])"));
  // Inside a $ref's target too.
  const ojson nested = enforceable_json_schema(
      ojson::parse(R"({"$defs": {"s": {"maxLength": 2}}, "$ref": "#/$defs/s"})"), "schema");
  EXPECT_TRUE(nested["$defs"]["s"].contains("type"));
  // A schema with nothing to enforce stays as it is.
  EXPECT_EQ(enforceable_json_schema(ojson::parse(R"({"title": "x"})"), "schema"),
            ojson::parse(R"({"title": "x"})"));
  // The window's check compiles what it checked: it refuses instead.
  EXPECT_THROW(check_schema_keywords(ojson::parse(R"({"minimum": 2})"), "schema"), ApiError);
}

TEST(JsonSchemaSupport, RequestsCheckResponseFormatAndConstrainedToolParameters) {
  const auto refused_param = [](const std::string& body) -> std::string {
    try {
      parse_request(Endpoint::ChatCompletions, body, {});
      return "";
    } catch (const ApiError& e) {
      return e.param;
    }
  };
  const std::string messages = R"("messages": [{"role": "user", "content": "hi"}])";
  EXPECT_EQ(refused_param("{" + messages +
                          R"(, "response_format": {"type": "json_schema", "json_schema":
                          {"name": "x", "schema": {"type": "object", "not": {}}}}})"),
            "response_format.json_schema.schema");
  const std::string tools =
      R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters":
         {"type": "object", "properties": {"a": {"type": "array", "uniqueItems": true}}}}}])";
  // Free tool calls are not constrained: their parameters are not checked.
  EXPECT_EQ(refused_param("{" + messages + tools + "}"), "");
  EXPECT_EQ(refused_param("{" + messages + tools + R"(, "tool_choice": "required"})"),
            "tools[0].function.parameters.properties.a");
  // A typeless response schema is compiled with its types listed.
  const ParsedRequest request =
      parse_request(Endpoint::ChatCompletions,
                    "{" + messages +
                        R"(, "response_format": {"type": "json_schema", "json_schema": {"name": "x",
             "schema": {"maxLength": 3}}}})",
                    {});
  EXPECT_NE(request.constraint.source.find("\"type\""), std::string::npos);
}

#ifdef GRANULE_TEST_HAVE_XGRAMMAR

// JSON as the converter writes it without free whitespace: ", " and ": " between items.
std::string spaced(const ojson& v) {
  if (v.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + spaced(v[i]);
    return out + "]";
  }
  if (v.is_object()) {
    std::string out = "{";
    bool first = true;
    for (const auto& [key, value] : v.items()) {
      out += (first ? "" : ", ") + ojson(key).dump() + ": " + spaced(value);
      first = false;
    }
    return out + "}";
  }
  return v.dump();
}

TEST(JsonSchemaSupport, NoAcceptedSchemaOfTheSuiteLetsAnInvalidInstanceThrough) {
  const std::filesystem::path suite =
      std::filesystem::path(GRANULE_TESTDATA_DIR) / "json-schema-suite";
  if (!std::filesystem::exists(suite / "type.json"))
    GTEST_SKIP() << "the JSON-Schema-Test-Suite is absent (bash packaging/setup.sh schemasuite)";
  // A vocabulary of the 256 bytes: the grammar is matched byte by byte.
  std::vector<std::string> vocab;
  for (int b = 0; b < 256; ++b) vocab.emplace_back(1, static_cast<char>(b));
  vocab.emplace_back("</s>");
  xgrammar::TokenizerInfo info(vocab, xgrammar::VocabType::RAW, 257, std::vector<int32_t>{256},
                               false);
  xgrammar::GrammarCompiler compiler(info, 1, false);

  int schemas = 0, taken = 0, compiled = 0, valid_seen = 0, valid_matched = 0, invalid_seen = 0;
  std::vector<std::string> let_through;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(suite))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  for (const auto& file : files) {
    std::ifstream in(file);
    const ojson groups = ojson::parse(in);
    for (const ojson& group : groups) {
      ++schemas;
      ojson schema;
      try {
        schema = enforceable_json_schema(group["schema"], "schema");
      } catch (const ApiError&) {
        continue;
      }
      ++taken;
      std::optional<xgrammar::CompiledGrammar> grammar;
      try {
        // As ConstraintCompiler compiles a schema: no free whitespace, strict mode.
        grammar = compiler.CompileJSONSchema(schema.dump(), false);
      } catch (const std::exception&) {
        continue;  // the server answers 400 with the converter's message
      }
      ++compiled;
      for (const ojson& test : group["tests"]) {
        xgrammar::GrammarMatcher matcher(*grammar);
        const bool matched = matcher.AcceptString(spaced(test["data"])) &&
                             matcher.AcceptToken(256) && matcher.IsTerminated();
        if (test["valid"] == true) {
          ++valid_seen;
          valid_matched += matched;
        } else {
          ++invalid_seen;
          if (matched)
            let_through.push_back(
                file.stem().string() + ": " + group["description"].get<std::string>() + ": " +
                test["description"].get<std::string>() + ": " + spaced(test["data"]));
        }
      }
    }
  }
  std::printf(
      "%d schemas, %d taken, %d compiled; their grammars match %d of %d valid instances "
      "and %zu of %d invalid ones\n",
      schemas, taken, compiled, valid_matched, valid_seen, let_through.size(), invalid_seen);
  for (const std::string& s : let_through) ADD_FAILURE() << "let through: " << s;
  EXPECT_GT(compiled, 150);
}

#endif

}  // namespace
}  // namespace granule::server
