// The expert panel's figures over the last second of telemetry.
#include "expert_activity.h"

#include <algorithm>

namespace granule::app {
namespace {

template <class T>
T since(T now, T before) {
  return now >= before ? now - before : now;
}

}  // namespace

ExpertWindow expertWindow(const std::deque<TelemetryFrame>& history, double seconds) {
  ExpertWindow w;
  if (history.empty()) return w;
  const TelemetryFrame& newest = history.back();
  const ExpertTelemetry& x = newest.engine.experts;
  const size_t cells =
      static_cast<size_t>(std::max(x.n_layer, 0)) * static_cast<size_t>(std::max(x.n_expert, 0));
  if (!newest.has_engine || cells == 0 || x.resident.size() != cells || x.routed.size() != cells)
    return w;
  w.n_layer = x.n_layer;
  w.n_expert = x.n_expert;
  w.resident = x.resident;
  w.routed_since_load = x.routed;
  w.routed.assign(cells, 0);
  w.streamed.assign(cells, 0);
  // The newest frame at least `seconds` before the newest one, else the oldest there is.
  const TelemetryFrame* start = nullptr;
  for (auto it = history.rbegin() + 1; it != history.rend(); ++it) {
    start = &*it;
    if (it->time_s <= newest.time_s - seconds) break;
  }
  if (start == nullptr) return w;  // one frame: no interval to show yet
  const ExpertTelemetry& y = start->engine.experts;
  const bool same_shape = y.n_layer == x.n_layer && y.n_expert == x.n_expert &&
                          y.routed.size() == cells && y.streamed.size() == cells;
  w.seconds = newest.time_s - start->time_s;
  for (size_t i = 0; i < cells; ++i) {
    w.routed[i] = same_shape ? since(x.routed[i], y.routed[i]) : x.routed[i];
    if (i < x.streamed.size())
      w.streamed[i] = same_shape ? since(x.streamed[i], y.streamed[i]) : x.streamed[i];
    w.most_routed = std::max(w.most_routed, w.routed[i]);
  }
  const auto delta = [&](uint64_t now, uint64_t before) {
    return same_shape ? since(now, before) : now;
  };
  w.hits = delta(x.hits, y.hits);
  w.misses = delta(x.misses, y.misses);
  w.bytes_streamed = delta(x.bytes_streamed, y.bytes_streamed);
  w.host_computed = delta(x.host_computed, y.host_computed);
  w.bytes_host = delta(x.bytes_host, y.bytes_host);
  w.tokens = delta(x.tokens, y.tokens);
  return w;
}

ExpertActivity::ExpertActivity(QObject* parent) : QObject(parent) {}

void ExpertActivity::setTelemetry(TelemetryModel* telemetry) {
  if (telemetry_ == telemetry) return;
  disconnect(connection_);
  telemetry_ = telemetry;
  if (telemetry_)
    connection_ = connect(telemetry_, &TelemetryModel::updated, this, &ExpertActivity::refresh);
  Q_EMIT telemetryChanged();
  refresh();
}

void ExpertActivity::refresh() {
  window_ = telemetry_ ? expertWindow(telemetry_->history(), kWindowSeconds) : ExpertWindow{};
  totals_ = ExpertTelemetry{};
  if (telemetry_ && active()) {
    const ExpertTelemetry& x = telemetry_->latest().engine.experts;
    totals_.hits = x.hits;
    totals_.misses = x.misses;
    totals_.promotions = x.promotions;
    totals_.demotions = x.demotions;
    totals_.expert_bytes = x.expert_bytes;
  }
  resident_ = fewest_ = most_ = streamed_experts_ = 0;
  for (int l = 0; l < window_.n_layer; ++l) {
    int in_layer = 0;
    for (int e = 0; e < window_.n_expert; ++e)
      in_layer += window_.resident[static_cast<size_t>(l * window_.n_expert + e)] != 0;
    resident_ += in_layer;
    fewest_ = l == 0 ? in_layer : std::min(fewest_, in_layer);
    most_ = std::max(most_, in_layer);
  }
  for (uint32_t s : window_.streamed) streamed_experts_ += s > 0;
  Q_EMIT updated();
}

double ExpertActivity::hitRate() const {
  const uint64_t choices = window_.hits + window_.misses;
  return choices > 0 ? static_cast<double>(window_.hits) / static_cast<double>(choices) : -1;
}

double ExpertActivity::bytesPerToken() const {
  return window_.tokens > 0
             ? static_cast<double>(window_.bytes_streamed) / static_cast<double>(window_.tokens)
             : 0;
}

double ExpertActivity::bytesPerSecond() const {
  return window_.seconds > 0 ? static_cast<double>(window_.bytes_streamed) / window_.seconds : 0;
}

double ExpertActivity::cpuShare() const {
  return window_.misses > 0
             ? static_cast<double>(window_.host_computed) / static_cast<double>(window_.misses)
             : -1;
}

double ExpertActivity::cpuBytesPerSecond() const {
  return window_.seconds > 0 ? static_cast<double>(window_.bytes_host) / window_.seconds : 0;
}

double ExpertActivity::tokensPerSecond() const {
  return window_.seconds > 0 ? static_cast<double>(window_.tokens) / window_.seconds : 0;
}

double ExpertActivity::lifetimeHitRate() const {
  const uint64_t choices = totals_.hits + totals_.misses;
  return choices > 0 ? static_cast<double>(totals_.hits) / static_cast<double>(choices) : -1;
}

QString ExpertActivity::describeCell(int layer, int expert) const {
  if (layer < 0 || layer >= window_.n_layer || expert < 0 || expert >= window_.n_expert) return {};
  const auto i = static_cast<size_t>(layer * window_.n_expert + expert);
  const bool resident = window_.resident[i] != 0;
  QString text = tr("layer %1 · expert %2: %3")
                     .arg(layer)
                     .arg(expert)
                     .arg(resident ? tr("in device memory") : tr("in host memory"));
  const uint32_t routed = window_.routed[i];
  text += routed == 1 ? tr(", 1 choice this second") : tr(", %1 choices this second").arg(routed);
  if (window_.streamed[i] > 0) text += tr(", %1 read over PCIe").arg(window_.streamed[i]);
  return text;
}

}  // namespace granule::app
