// Window and dock screenshots after a delay, for scripts.
#include "window_screenshot.h"

#include <QCoreApplication>
#include <QDir>
#include <QFileInfo>
#include <QImage>
#include <QPointer>
#include <QQuickItem>
#include <QQuickWindow>
#include <QTimer>

#include "granule/log.h"

namespace granule::app {
namespace {

bool savePng(const QImage& image, const QString& path) {
  QDir().mkpath(QFileInfo(path).absolutePath());
  if (image.isNull() || !image.save(path, "PNG")) {
    granule::logger("app")->error("screenshot: could not write {}", path.toStdString());
    return false;
  }
  granule::logger("app")->info("screenshot: wrote {} ({}x{})", path.toStdString(), image.width(),
                               image.height());
  return true;
}

}  // namespace

QRect memoryDockRect(QQuickWindow* window) {
  auto* dock = window->findChild<QQuickItem*>(QStringLiteral("memoryDock"));
  if (!dock || !dock->isVisible()) return {};
  const QRectF scene = dock->mapRectToScene(QRectF(0, 0, dock->width(), dock->height()));
  const qreal dpr = window->effectiveDevicePixelRatio();
  return QRectF(scene.topLeft() * dpr, scene.size() * dpr).toAlignedRect();
}

void scheduleWindowScreenshot(QQuickWindow* window, const ScreenshotRequest& request) {
  QPointer<QQuickWindow> target(window);
  QTimer::singleShot(request.after_ms, window, [target, request] {
    if (!target) return;
    const QImage image = target->grabWindow();
    savePng(image, request.window_path);
    if (!request.dock_path.isEmpty()) {
      const QRect dock = memoryDockRect(target).intersected(image.rect());
      if (dock.isEmpty())
        granule::logger("app")->warn("screenshot: the memory dock is not visible");
      else
        savePng(image.copy(dock), request.dock_path);
    }
    if (request.quit_after) QCoreApplication::quit();
  });
}

}  // namespace granule::app
