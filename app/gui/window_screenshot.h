// Screenshots of the running window for scripts (granule --screenshot PATH): after a delay
// the window is grabbed to a PNG, and optionally the memory dock cut out of it, then the
// application quits. Used to look at a replayed recording under Xvfb.
#pragma once
#include <QRect>
#include <QString>

class QQuickWindow;

namespace granule::app {

struct ScreenshotRequest {
  QString window_path;  // the whole window
  QString dock_path;    // the memory dock alone ("" for none)
  int after_ms = 3000;
  bool quit_after = true;
};

// Schedules the grab on `window`'s thread; logs what was written or why not.
void scheduleWindowScreenshot(QQuickWindow* window, const ScreenshotRequest& request);

// The dock's rectangle in the window's pixels (device pixels), or an empty one when the
// window has no item named "memoryDock".
QRect memoryDockRect(QQuickWindow* window);

}  // namespace granule::app
