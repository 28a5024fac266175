// TimeSeriesPlot: a QQuickPaintedItem drawing the last minute of one telemetry metric —
// the memory ledger as a stacked area with the budget line, or a single rate as an area.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QColor>
#include <QPointer>
#include <QQuickPaintedItem>

#include "telemetry_model.h"

namespace granule::app {

// The host-to-device plot's stack at a frame: the streamed layers' bytes per second (the last
// step's rate), then a mixture of experts' missed experts' (the cumulative counter's growth since
// `previous`, the frame before; none without one, or where the counter went back or the model
// changed).
std::vector<double> hostToDeviceRates(const TelemetryFrame& frame, const TelemetryFrame* previous);

class TimeSeriesPlot : public QQuickPaintedItem {
  Q_OBJECT
  QML_ELEMENT
  Q_PROPERTY(granule::app::TelemetryModel* telemetry READ telemetry WRITE setTelemetry NOTIFY
                 telemetryChanged)
  Q_PROPERTY(Metric metric READ metric WRITE setMetric NOTIFY appearanceChanged)
  Q_PROPERTY(
      QList<QColor> seriesColors READ seriesColors WRITE setSeriesColors NOTIFY appearanceChanged)
  Q_PROPERTY(QColor gridColor READ gridColor WRITE setGridColor NOTIFY appearanceChanged)
  Q_PROPERTY(QColor labelColor READ labelColor WRITE setLabelColor NOTIFY appearanceChanged)
  Q_PROPERTY(QColor limitColor READ limitColor WRITE setLimitColor NOTIFY appearanceChanged)
  Q_PROPERTY(
      double windowSeconds READ windowSeconds WRITE setWindowSeconds NOTIFY appearanceChanged)
  // The top of the y axis after the last paint, for labels beside the plot.
  Q_PROPERTY(double scaleMax READ scaleMax NOTIFY scaleMaxChanged)
  Q_PROPERTY(bool limitOnScale READ limitOnScale NOTIFY scaleMaxChanged)
  // Seconds the x axis spans after the last paint (grows to windowSeconds).
  Q_PROPERTY(double spanSeconds READ spanSeconds NOTIFY scaleMaxChanged)
  // Where the limit line was drawn (pixels from the top) after the last paint; -1 when off
  // the scale or absent. Lets QML put the line's label on the line.
  Q_PROPERTY(double limitY READ limitY NOTIFY scaleMaxChanged)

 public:
  enum class Metric {
    Memory,         // ledger categories stacked, budget line
    DecodeTokens,   // tokens per second over all chats
    ProcessMemory,  // the process's resident memory (host figure)
    HostToDevice,   // host-to-device bytes/s, streamed layers' then missed experts', the
                    // measured PCIe bandwidth as limit
  };
  Q_ENUM(Metric)

  static constexpr double kMinimumSpanSeconds = 10.0;

  explicit TimeSeriesPlot(QQuickItem* parent = nullptr);
  void paint(QPainter* painter) override;

  TelemetryModel* telemetry() const { return telemetry_; }
  void setTelemetry(TelemetryModel* telemetry);
  Metric metric() const { return metric_; }
  void setMetric(Metric metric);
  QList<QColor> seriesColors() const { return series_colors_; }
  void setSeriesColors(const QList<QColor>& colors);
  QColor gridColor() const { return grid_color_; }
  void setGridColor(const QColor& c);
  QColor labelColor() const { return label_color_; }
  void setLabelColor(const QColor& c);
  QColor limitColor() const { return limit_color_; }
  void setLimitColor(const QColor& c);
  double windowSeconds() const { return window_seconds_; }
  void setWindowSeconds(double s);
  double scaleMax() const { return scale_max_; }
  bool limitOnScale() const { return limit_on_scale_; }
  double spanSeconds() const { return span_seconds_; }
  double limitY() const { return limit_y_; }

 Q_SIGNALS:
  void telemetryChanged();
  void appearanceChanged();
  void scaleMaxChanged();

 private:
  // Sets a member that changes how the plot looks, and repaints when it changed.
  template <class T>
  void setAppearance(T& member, const T& value) {
    if (member == value) return;
    member = value;
    Q_EMIT appearanceChanged();
  }

  // The values stacked at one frame, bottom first (one entry for single-series metrics);
  // `previous` (the frame before it, or null) for rates of cumulative counters.
  std::vector<double> stackAt(const TelemetryFrame& frame, const TelemetryFrame* previous) const;
  double limitAt(const TelemetryFrame& frame) const;

  QPointer<TelemetryModel> telemetry_;
  QMetaObject::Connection telemetry_connection_;
  Metric metric_ = Metric::Memory;
  QList<QColor> series_colors_{QColor(0x4c, 0x8b, 0xf5)};
  QColor grid_color_{0x80, 0x80, 0x80, 0x40};
  QColor label_color_{0x80, 0x80, 0x80};
  QColor limit_color_{0xe0, 0x4f, 0x4f};
  double window_seconds_ = TelemetryModel::kHistorySeconds;
  double scale_max_ = 0;
  bool limit_on_scale_ = false;
  double span_seconds_ = 0;
  double limit_y_ = -1;
};

}  // namespace granule::app
