// A chat's "JSON output" setting as the engine's constraint, and the check a schema gets when
// it is entered in the window.
#pragma once
#include <QString>

#include "granule/constraint.h"
#include "worker_types.h"

namespace granule::app {

// "" when `text` is a JSON Schema the engine can enforce; else one line saying why not.
QString jsonSchemaProblem(const QString& text);

// The constraint of the chat's setting (ConstraintKind::None when it is off).
Constraint jsonOutputConstraint(const SamplingSettings& sampling);

}  // namespace granule::app
