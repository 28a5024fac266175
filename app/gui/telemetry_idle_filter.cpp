// Frame comparison for the idle window.
#include "telemetry_idle_filter.h"

#include <cmath>

namespace granule::app {
namespace {

bool near(quint64 a, quint64 b, double tolerance_bytes) {
  return std::abs(static_cast<double>(a) - static_cast<double>(b)) <= tolerance_bytes;
}

}  // namespace

bool telemetryLooksTheSame(const TelemetryFrame& shown, const TelemetryFrame& next,
                           double host_tolerance) {
  if (shown.has_engine != next.has_engine) return false;
  if (shown.deviceFields() != next.deviceFields() || shown.kvFields() != next.kvFields() ||
      shown.schedulerFields() != next.schedulerFields() ||
      shown.graphsFields() != next.graphsFields() ||
      shown.streamingFields() != next.streamingFields() ||
      shown.throughputFields() != next.throughputFields() || shown.remote != next.remote)
    return false;
  if (shown.chats.size() != next.chats.size()) return false;
  for (qsizetype i = 0; i < shown.chats.size(); ++i) {
    if (shown.chats[i].chat_id != next.chats[i].chat_id ||
        sectionFields(shown.chats[i].sequence) != sectionFields(next.chats[i].sequence))
      return false;
  }
  if (shown.api_requests.size() != next.api_requests.size()) return false;
  for (qsizetype i = 0; i < shown.api_requests.size(); ++i) {
    const ApiRequestTelemetry& a = shown.api_requests[i];
    const ApiRequestTelemetry& b = next.api_requests[i];
    if (a.request_id != b.request_id || a.state != b.state ||
        a.completion_tokens != b.completion_tokens ||
        sectionFields(a.sequence) != sectionFields(b.sequence))
      return false;
  }
  const double tolerance =
      host_tolerance * static_cast<double>(std::max(shown.host.total_bytes, next.host.total_bytes));
  return shown.host.total_bytes == next.host.total_bytes &&
         near(shown.host.available_bytes, next.host.available_bytes, tolerance) &&
         near(shown.host.process_resident_bytes, next.host.process_resident_bytes, tolerance);
}

}  // namespace granule::app
