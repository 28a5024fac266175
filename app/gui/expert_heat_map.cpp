// Painting of the expert grid: at most a few thousand rectangles ten times a second, cheap
// for QPainter in software (offscreen) and GL alike.
#include "expert_heat_map.h"

#include <QPainter>
#include <algorithm>
#include <cmath>
#include <numeric>

namespace granule::app {
namespace {

// `a` blended towards `b` by t in [0, 1].
QColor mix(const QColor& a, const QColor& b, double t) {
  t = std::clamp(t, 0.0, 1.0);
  return QColor::fromRgbF(static_cast<float>(a.redF() + (b.redF() - a.redF()) * t),
                          static_cast<float>(a.greenF() + (b.greenF() - a.greenF()) * t),
                          static_cast<float>(a.blueF() + (b.blueF() - a.blueF()) * t));
}

}  // namespace

ExpertHeatMap::ExpertHeatMap(QQuickItem* parent) : QQuickPaintedItem(parent) {
  connect(this, &ExpertHeatMap::appearanceChanged, this, [this] { update(); });
}

void ExpertHeatMap::setActivity(ExpertActivity* activity) {
  if (activity_ == activity) return;
  disconnect(connection_);
  activity_ = activity;
  if (activity_)
    connection_ = connect(activity_, &ExpertActivity::updated, this, [this] { update(); });
  Q_EMIT activityChanged();
  update();
}

int ExpertHeatMap::layerAt(double y) const {
  if (!activity_ || !activity_->active() || y < 0 || y >= height()) return -1;
  return std::min(static_cast<int>(y / height() * activity_->layers()), activity_->layers() - 1);
}

std::vector<int> ExpertHeatMap::rowOrder(int layer) const {
  const ExpertWindow& w = activity_->window();
  std::vector<int> order(static_cast<size_t>(w.n_expert));
  std::iota(order.begin(), order.end(), 0);
  if (sorted_ && w.routed_since_load.size() == w.resident.size()) {
    const uint32_t* counts = w.routed_since_load.data() + layer * w.n_expert;
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return counts[a] > counts[b]; });
  }
  return order;
}

int ExpertHeatMap::expertAt(double x, double y) const {
  const int layer = layerAt(y);
  if (layer < 0 || x < 0 || x >= width()) return -1;
  const int n_expert = activity_->expertsPerLayer();
  const int column = std::min(static_cast<int>(x / width() * n_expert), n_expert - 1);
  return rowOrder(layer)[static_cast<size_t>(column)];
}

void ExpertHeatMap::paint(QPainter* painter) {
  if (!activity_ || !activity_->active()) return;
  const ExpertWindow& w = activity_->window();
  const double pitch_x = width() / w.n_expert, pitch_y = height() / w.n_layer;
  // A one-pixel gap between rows and columns while cells stay large enough to keep one.
  const int gap_x = pitch_x >= 5 ? 1 : 0, gap_y = pitch_y >= 4 ? 1 : 0;
  // Cold cells stay visible but quiet: each colour at a third of the way from the background.
  const QColor resident_cold = mix(background_, resident_, 0.28);
  const QColor host_cold = mix(background_, host_, 0.16);
  const QColor streamed_cold = mix(background_, streamed_, 0.30);
  // Heat on a square-root scale against the hottest cell, so the long tail of a skewed
  // router still shows.
  const double hottest = std::max<uint32_t>(w.most_routed, 1);
  for (int l = 0; l < w.n_layer; ++l) {
    const std::vector<int> row = rowOrder(l);
    const int top = static_cast<int>(std::lround(l * pitch_y));
    const int bottom = static_cast<int>(std::lround((l + 1) * pitch_y)) - gap_y;
    for (int column = 0; column < w.n_expert; ++column) {
      const int e = row[static_cast<size_t>(column)];
      const auto i = static_cast<size_t>(l * w.n_expert + e);
      const int left = static_cast<int>(std::lround(column * pitch_x));
      const int right = static_cast<int>(std::lround((column + 1) * pitch_x)) - gap_x;
      const double heat = std::sqrt(w.routed[i] / hottest);
      QColor colour;
      if (w.resident[i])
        colour = mix(resident_cold, resident_, heat);
      else if (w.streamed[i] > 0)
        colour = mix(streamed_cold, streamed_, 0.2 + 0.8 * heat);
      else
        colour = mix(host_cold, host_, heat);
      painter->fillRect(QRect(left, top, std::max(1, right - left), std::max(1, bottom - top)),
                        colour);
    }
  }
}

}  // namespace granule::app
