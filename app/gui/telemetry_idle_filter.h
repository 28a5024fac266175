// Which telemetry frames the window needs: the worker sends one ~10 times a second even
// when nothing happens, and each one re-evaluates every panel's bindings and repaints the
// plots. A frame that shows what the last shown one showed is dropped, so an idle window
// draws nothing.
#pragma once
#include "worker_types.h"

namespace granule::app {

// Whether `next` would show the same as `shown`: every engine and chat figure equal (time
// aside), and the host's memory figures within `host_tolerance` of the host's total (other
// programs move the free memory by a few MiB all the time; a plot pixel is far more).
bool telemetryLooksTheSame(const TelemetryFrame& shown, const TelemetryFrame& next,
                           double host_tolerance = 0.002);

}  // namespace granule::app
