// JSON output: the setting's check (the server's rules for a schema, so the window refuses the
// keywords a constrained reply could silently break) and its constraint.
#include "json_output.h"

#include <nlohmann/json.hpp>

#ifdef GRANULE_WINDOW_SERVER
#include "openai_request.h"
#endif

namespace granule::app {

QString jsonSchemaProblem(const QString& text) {
  if (text.trimmed().isEmpty()) return QStringLiteral("The schema is empty.");
  nlohmann::ordered_json schema;
  try {
    schema = nlohmann::ordered_json::parse(text.toStdString());
  } catch (const nlohmann::json::parse_error& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 2: ..." → after "error ".
    std::string what = e.what();
    const size_t at = what.find("parse error ");
    if (at != std::string::npos) what = what.substr(at);
    return QStringLiteral("Not JSON: %1").arg(QString::fromStdString(what));
  }
  if (!schema.is_object())
    return QStringLiteral("A JSON Schema is an object, like {\"type\": \"object\"}.");
#ifdef GRANULE_WINDOW_SERVER
  try {
    server::check_schema_keywords(schema, "schema");
  } catch (const server::ApiError& e) {
    return QString::fromStdString(e.what());
  }
#endif
  return {};
}

Constraint jsonOutputConstraint(const SamplingSettings& sampling) {
  if (sampling.json_output == QStringLiteral("object")) return Constraint::json_object();
  if (sampling.json_output == QStringLiteral("schema") && !sampling.json_schema.isEmpty())
    return Constraint::json_schema(sampling.json_schema.toStdString());
  return {};
}

}  // namespace granule::app
