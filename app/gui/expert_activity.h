// ExpertActivity: a mixture of experts' placement and routing over the last second, read from
// the telemetry history for the expert panel. The engine's counts are cumulative, so "this
// second" is the difference between the newest frame and the frame a second before it.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QObject>
#include <QPointer>
#include <deque>
#include <vector>

#include "telemetry_model.h"

namespace granule::app {

// The experts' counts over a window of frames.
struct ExpertWindow {
  int n_layer = 0, n_expert = 0;  // 0: no mixture of experts in the newest frame
  std::vector<uint8_t> resident;  // [layer * n_expert + e], the newest frame's placement
  std::vector<uint32_t> routed;   // choices within the window
  std::vector<uint32_t> streamed;
  std::vector<uint32_t> routed_since_load;  // the newest frame's cumulative counts
  uint64_t hits = 0, misses = 0, bytes_streamed = 0, tokens = 0;
  uint64_t host_computed = 0, bytes_host = 0;  // misses the CPU computed, and its expert bytes
  uint32_t most_routed = 0;  // the largest of `routed`
  double seconds = 0;        // the window's length (0: one frame, nothing to compare)
};

// The window ending at the newest frame of `history` and starting at the newest frame at
// least `seconds` older (the oldest one when none is). A count that went down (another
// model, a recording looping) counts from zero.
ExpertWindow expertWindow(const std::deque<TelemetryFrame>& history, double seconds);

class ExpertActivity : public QObject {
  Q_OBJECT
  QML_ELEMENT
  Q_PROPERTY(granule::app::TelemetryModel* telemetry READ telemetry WRITE setTelemetry NOTIFY
                 telemetryChanged)
  // The latest frame is of a mixture of experts (the panel hides otherwise).
  Q_PROPERTY(bool active READ active NOTIFY updated)
  Q_PROPERTY(int layers READ layers NOTIFY updated)
  Q_PROPERTY(int expertsPerLayer READ expertsPerLayer NOTIFY updated)
  Q_PROPERTY(int totalExperts READ totalExperts NOTIFY updated)
  Q_PROPERTY(int residentExperts READ residentExperts NOTIFY updated)
  Q_PROPERTY(int fewestResidentInALayer READ fewestResidentInALayer NOTIFY updated)
  Q_PROPERTY(int mostResidentInALayer READ mostResidentInALayer NOTIFY updated)
  // This second: the share of routing choices served from device memory (-1 when none were
  // made), expert bytes read over PCIe per routed token and per second, routed tokens per
  // second, and how many distinct experts were streamed.
  Q_PROPERTY(double hitRate READ hitRate NOTIFY updated)
  Q_PROPERTY(double bytesPerToken READ bytesPerToken NOTIFY updated)
  Q_PROPERTY(double bytesPerSecond READ bytesPerSecond NOTIFY updated)
  Q_PROPERTY(double tokensPerSecond READ tokensPerSecond NOTIFY updated)
  Q_PROPERTY(int streamedExperts READ streamedExperts NOTIFY updated)
  // This second: the share of the choices served from host memory that the CPU computed (-1
  // when there were none), and the expert bytes it read per second doing so.
  Q_PROPERTY(double cpuShare READ cpuShare NOTIFY updated)
  Q_PROPERTY(double cpuBytesPerSecond READ cpuBytesPerSecond NOTIFY updated)
  // Since the model opened.
  Q_PROPERTY(double lifetimeHitRate READ lifetimeHitRate NOTIFY updated)
  Q_PROPERTY(double promotions READ promotions NOTIFY updated)
  Q_PROPERTY(double demotions READ demotions NOTIFY updated)
  Q_PROPERTY(double expertBytes READ expertBytes NOTIFY updated)

 public:
  static constexpr double kWindowSeconds = 1.0;

  explicit ExpertActivity(QObject* parent = nullptr);

  TelemetryModel* telemetry() const { return telemetry_; }
  void setTelemetry(TelemetryModel* telemetry);
  const ExpertWindow& window() const { return window_; }

  bool active() const { return window_.n_expert > 0; }
  int layers() const { return window_.n_layer; }
  int expertsPerLayer() const { return window_.n_expert; }
  int totalExperts() const { return window_.n_layer * window_.n_expert; }
  int residentExperts() const { return resident_; }
  int fewestResidentInALayer() const { return fewest_; }
  int mostResidentInALayer() const { return most_; }
  double hitRate() const;
  double bytesPerToken() const;
  double bytesPerSecond() const;
  double tokensPerSecond() const;
  int streamedExperts() const { return streamed_experts_; }
  double cpuShare() const;
  double cpuBytesPerSecond() const;
  double lifetimeHitRate() const;
  double promotions() const { return static_cast<double>(totals_.promotions); }
  double demotions() const { return static_cast<double>(totals_.demotions); }
  double expertBytes() const { return static_cast<double>(totals_.expert_bytes); }

  // "layer 12 · expert 87: resident, 14 choices this second" for the cell under the pointer.
  Q_INVOKABLE QString describeCell(int layer, int expert) const;

 Q_SIGNALS:
  void telemetryChanged();
  void updated();

 private:
  void refresh();

  QPointer<TelemetryModel> telemetry_;
  QMetaObject::Connection connection_;
  ExpertWindow window_;
  ExpertTelemetry totals_;  // the newest frame's, without its per-expert vectors
  int resident_ = 0, fewest_ = 0, most_ = 0, streamed_experts_ = 0;
};

}  // namespace granule::app
