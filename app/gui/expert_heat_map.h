// ExpertHeatMap: the expert panel's grid — a row of cells per layer, one cell per expert.
// Colour says where the expert lives (device or host memory), brightness how often tokens
// routed to it in the last second, and host experts read over PCIe in that second light up
// in the streamed colour.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QColor>
#include <QPointer>
#include <QQuickPaintedItem>

#include "expert_activity.h"

namespace granule::app {

class ExpertHeatMap : public QQuickPaintedItem {
  Q_OBJECT
  QML_ELEMENT
  Q_PROPERTY(
      granule::app::ExpertActivity* activity READ activity WRITE setActivity NOTIFY activityChanged)
  Q_PROPERTY(
      QColor residentColor READ residentColor WRITE setResidentColor NOTIFY appearanceChanged)
  Q_PROPERTY(QColor hostColor READ hostColor WRITE setHostColor NOTIFY appearanceChanged)
  Q_PROPERTY(
      QColor streamedColor READ streamedColor WRITE setStreamedColor NOTIFY appearanceChanged)
  Q_PROPERTY(
      QColor backgroundColor READ backgroundColor WRITE setBackgroundColor NOTIFY appearanceChanged)
  // Each row in expert order (false), or sorted by routing since load, most routed first, so
  // a row reads as its layer's routing distribution and the placement against it.
  Q_PROPERTY(
      bool sortedByRouting READ sortedByRouting WRITE setSortedByRouting NOTIFY appearanceChanged)

 public:
  explicit ExpertHeatMap(QQuickItem* parent = nullptr);
  void paint(QPainter* painter) override;

  ExpertActivity* activity() const { return activity_; }
  void setActivity(ExpertActivity* activity);
  QColor residentColor() const { return resident_; }
  void setResidentColor(const QColor& c) { setAppearance(resident_, c); }
  QColor hostColor() const { return host_; }
  void setHostColor(const QColor& c) { setAppearance(host_, c); }
  QColor streamedColor() const { return streamed_; }
  void setStreamedColor(const QColor& c) { setAppearance(streamed_, c); }
  QColor backgroundColor() const { return background_; }
  void setBackgroundColor(const QColor& c) { setAppearance(background_, c); }
  bool sortedByRouting() const { return sorted_; }
  void setSortedByRouting(bool sorted) { setAppearance(sorted_, sorted); }

  // The layer and expert under a point of the item, -1 outside the grid (the expert drawn
  // there: with sortedByRouting, not the column's index).
  Q_INVOKABLE int layerAt(double y) const;
  Q_INVOKABLE int expertAt(double x, double y) const;

 Q_SIGNALS:
  void activityChanged();
  void appearanceChanged();

 private:
  // The experts of a layer in the order its row draws them.
  std::vector<int> rowOrder(int layer) const;

  template <class T>
  void setAppearance(T& member, const T& value) {
    if (member == value) return;
    member = value;
    Q_EMIT appearanceChanged();
  }

  QPointer<ExpertActivity> activity_;
  QMetaObject::Connection connection_;
  QColor resident_{0x4c, 0x8b, 0xf5};
  QColor host_{0x80, 0x80, 0x80};
  QColor streamed_{0xf2, 0xc1, 0x4e};
  QColor background_{0xff, 0xff, 0xff};
  bool sorted_ = false;
};

}  // namespace granule::app
