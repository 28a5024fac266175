// The system clipboard through QGuiApplication.
#include "clipboard.h"

#include <QClipboard>
#include <QGuiApplication>

namespace granule::app {

void Clipboard::copy(const QString& text) const { QGuiApplication::clipboard()->setText(text); }

QString Clipboard::text() const { return QGuiApplication::clipboard()->text(); }

}  // namespace granule::app
