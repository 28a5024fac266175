// Painting of the telemetry plots. At 10 Hz and a few hundred points, QPainter on the
// scene graph's texture is cheap and renders the same in software (offscreen) and GL.
#include "time_series_plot.h"

#include <QPainter>
#include <QPainterPath>
#include <algorithm>
#include <cmath>
#include <iterator>

namespace granule::app {
namespace {

// Rounds up to a readable number (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 times a power of ten),
// fine enough that the data fill most of the plot (10.5 GiB gets a 12 GiB axis, not 20).
double niceCeiling(double value) {
  if (value <= 0) return 1;
  if (value < 1) return 1;  // nothing to show yet: a unit axis
  const double magnitude = std::pow(10.0, std::floor(std::log10(value)));
  for (double step : {1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0})
    if (value <= step * magnitude * (1 + 1e-12)) return step * magnitude;
  return 10 * magnitude;
}

}  // namespace

TimeSeriesPlot::TimeSeriesPlot(QQuickItem* parent) : QQuickPaintedItem(parent) {
  setAntialiasing(true);
  connect(this, &TimeSeriesPlot::appearanceChanged, this, [this] { update(); });
}

void TimeSeriesPlot::setTelemetry(TelemetryModel* telemetry) {
  if (telemetry_ == telemetry) return;
  disconnect(telemetry_connection_);
  telemetry_ = telemetry;
  if (telemetry_)
    telemetry_connection_ =
        connect(telemetry_, &TelemetryModel::updated, this, [this] { update(); });
  Q_EMIT telemetryChanged();
  update();
}

void TimeSeriesPlot::setMetric(Metric metric) { setAppearance(metric_, metric); }
void TimeSeriesPlot::setSeriesColors(const QList<QColor>& colors) {
  setAppearance(series_colors_, colors);
}
void TimeSeriesPlot::setGridColor(const QColor& c) { setAppearance(grid_color_, c); }
void TimeSeriesPlot::setLabelColor(const QColor& c) { setAppearance(label_color_, c); }
void TimeSeriesPlot::setLimitColor(const QColor& c) { setAppearance(limit_color_, c); }

std::vector<double> hostToDeviceRates(const TelemetryFrame& frame,
                                      const TelemetryFrame* previous) {
  double experts = 0;
  const ExpertTelemetry& x = frame.engine.experts;
  if (previous != nullptr && frame.time_s > previous->time_s) {
    const ExpertTelemetry& y = previous->engine.experts;
    if (x.n_layer == y.n_layer && x.n_expert == y.n_expert && x.bytes_streamed >= y.bytes_streamed)
      experts = static_cast<double>(x.bytes_streamed - y.bytes_streamed) /
                (frame.time_s - previous->time_s);
  }
  return {frame.engine.streaming.h2d_bytes_per_second, experts};
}

void TimeSeriesPlot::setWindowSeconds(double s) {
  if (s > 0) setAppearance(window_seconds_, s);
}

std::vector<double> TimeSeriesPlot::stackAt(const TelemetryFrame& frame,
                                            const TelemetryFrame* previous) const {
  switch (metric_) {
    case Metric::Memory: {
      std::vector<double> values;
      for (MemoryCategory c : stackedLedgerCategories())
        values.push_back(static_cast<double>(frame.engine.device.ledger_bytes(c)));
      return values;
    }
    case Metric::DecodeTokens:
      return {frame.engine.throughput.decode_tokens_per_second};
    case Metric::ProcessMemory:
      return {static_cast<double>(frame.host.process_resident_bytes)};
    case Metric::HostToDevice:
      return hostToDeviceRates(frame, previous);
  }
  return {};
}

double TimeSeriesPlot::limitAt(const TelemetryFrame& frame) const {
  switch (metric_) {
    case Metric::Memory:
      return static_cast<double>(frame.engine.device.budget_bytes);
    case Metric::HostToDevice:
      return frame.engine.streaming.h2d_bandwidth_bytes_per_second;
    default:
      return 0.0;
  }
}

void TimeSeriesPlot::paint(QPainter* painter) {
  const QRectF area(0.5, 0.5, width() - 1, height() - 1);
  painter->setRenderHint(QPainter::Antialiasing);
  painter->setPen(QPen(grid_color_, 1));
  for (int i = 1; i < 4; ++i) {
    const double y = area.top() + area.height() * i / 4.0;
    painter->drawLine(QPointF(area.left(), y), QPointF(area.right(), y));
  }
  painter->drawRect(area);
  if (!telemetry_ || telemetry_->history().empty() || area.width() < 4 || area.height() < 4) return;

  const auto& history = telemetry_->history();
  const double now = history.back().time_s;
  // Until a full window of history exists, the plot spans what there is (at least
  // kMinimumSpanSeconds), so a fresh window shows a plot rather than a sliver at the edge.
  const double span =
      std::clamp(now - history.front().time_s, kMinimumSpanSeconds, window_seconds_);
  const double start = now - span;
  // Only frames inside the window (plus the one just before it, so the area starts at the edge).
  auto first = std::lower_bound(history.begin(), history.end(), start,
                                [](const TelemetryFrame& f, double t) { return f.time_s < t; });
  if (first != history.begin()) --first;

  double peak = 0;
  const double limit = limitAt(history.back());
  double highest_limit = limit;
  std::vector<double> limits;  // per frame: a budget that changed shows as a step
  std::vector<std::vector<double>> stacks;
  std::vector<double> times;
  for (auto it = first; it != history.end(); ++it) {
    std::vector<double> stack = stackAt(*it, it == history.begin() ? nullptr : &*std::prev(it));
    double total = 0;
    for (double& v : stack) {
      total += v;
      v = total;  // cumulative: each series is drawn from the one below it
    }
    peak = std::max(peak, total);
    limits.push_back(limitAt(*it));
    highest_limit = std::max(highest_limit, limits.back());
    stacks.push_back(std::move(stack));
    times.push_back(it->time_s);
  }
  // The budget line is drawn only when it is within reach of the data; a 120 GiB budget
  // over 200 MiB of use would flatten the stack into the axis.
  const bool limit_on_scale = limit > 0 && highest_limit <= std::max(peak, 1.0) * 4;
  // Byte axes round in MiB (200 MiB, not 191 MiB); rates round in their own unit.
  // Byte axes round in GiB from 1 GiB up, else in MiB (as Units.bytes labels them); rates
  // in GB/s or MB/s (Units.rate); counts as they are.
  const double wanted = std::max(limit_on_scale ? highest_limit * 1.05 : 0.0, peak * 1.15);
  const bool bytes = metric_ == Metric::Memory || metric_ == Metric::ProcessMemory;
  const double gib = 1024.0 * 1024.0 * 1024.0;
  const double unit = bytes                             ? (wanted >= gib ? gib : 1024.0 * 1024.0)
                      : metric_ == Metric::HostToDevice ? (wanted >= 1e9 ? 1e9 : 1e6)
                                                        : 1.0;
  const double top = niceCeiling(wanted / unit) * unit;
  const double limit_y =
      limit_on_scale ? area.bottom() - std::clamp(limit / top, 0.0, 1.0) * area.height() : -1.0;
  if (top != scale_max_ || limit_on_scale != limit_on_scale_ || span != span_seconds_ ||
      limit_y != limit_y_) {
    scale_max_ = top;
    limit_on_scale_ = limit_on_scale;
    span_seconds_ = span;
    limit_y_ = limit_y;
    Q_EMIT scaleMaxChanged();
  }

  auto x_of = [&](double t) {
    return area.left() + std::max(0.0, t - start) / span * area.width();
  };
  auto y_of = [&](double v) {
    return area.bottom() - std::clamp(v / top, 0.0, 1.0) * area.height();
  };

  const size_t series = stacks.front().size();
  painter->setPen(Qt::NoPen);
  for (size_t s = series; s-- > 0;) {
    // Draw from the top series down: each area reaches the axis, the lower ones cover it.
    QPainterPath path;
    path.moveTo(x_of(times.front()), area.bottom());
    for (size_t i = 0; i < stacks.size(); ++i) path.lineTo(x_of(times[i]), y_of(stacks[i][s]));
    path.lineTo(x_of(times.back()), area.bottom());
    path.closeSubpath();
    const QColor color = series_colors_.isEmpty()
                             ? label_color_
                             : series_colors_[static_cast<qsizetype>(s) % series_colors_.size()];
    QColor fill = color;
    fill.setAlphaF(0.75);
    painter->setBrush(fill);
    painter->drawPath(path);
  }
  if (series == 1 || metric_ == Metric::HostToDevice) {
    // A single series (and the host-to-device total) also gets an outline, so a flat zero
    // still shows where it is.
    QPainterPath line;
    for (size_t i = 0; i < stacks.size(); ++i) {
      const QPointF p(x_of(times[i]), y_of(stacks[i][series - 1]));
      i == 0 ? line.moveTo(p) : line.lineTo(p);
    }
    painter->setBrush(Qt::NoBrush);
    painter->setPen(QPen(series_colors_.isEmpty()
                             ? label_color_
                             : series_colors_[static_cast<qsizetype>(series - 1) %
                                              series_colors_.size()],
                         1.5));
    painter->drawPath(line);
  }
  if (limit_on_scale) {
    // The limit over time, as steps (a budget changed between frames moves at that frame),
    // carried to the right edge.
    QPainterPath line;
    for (size_t i = 0; i < limits.size(); ++i) {
      const QPointF p(x_of(times[i]), y_of(limits[i]));
      if (i == 0) {
        line.moveTo(QPointF(area.left(), p.y()));
      } else if (limits[i] != limits[i - 1]) {
        line.lineTo(QPointF(p.x(), y_of(limits[i - 1])));
      }
      line.lineTo(p);
    }
    line.lineTo(QPointF(area.right(), y_of(limit)));
    painter->setBrush(Qt::NoBrush);
    painter->setPen(QPen(limit_color_, 1.5, Qt::DashLine));
    painter->drawPath(line);
  }
}

}  // namespace granule::app
