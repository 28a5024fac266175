// Which JSON Schemas structured output enforces: a walk that mirrors how xgrammar's JSON Schema
// converter reads a schema and refuses, naming it, every keyword the converter would ignore.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace granule::server {

// The schema as the constraint compiles it, or a 400 ApiError naming the first keyword (and
// where it sits under `param`) that a constrained reply could break silently. A schema without
// "type" whose keywords constrain some type (e.g. {"minimum": 1}) is returned with every JSON
// type listed, which the converter then reads per type, as JSON Schema means it. With
// `allow_rewrite` false such a schema is refused instead (for callers that compile the schema
// they checked).
nlohmann::ordered_json enforceable_json_schema(const nlohmann::ordered_json& schema,
                                               const std::string& param, bool allow_rewrite = true);

}  // namespace granule::server
