// Turns SIGINT and SIGTERM into QCoreApplication::quit(), so Ctrl+C in a terminal or a
// session logout takes the same shutdown path as closing the window (chats saved).
#pragma once

namespace granule::app {

// Call once, after the QCoreApplication exists.
void quitOnTerminationSignals();

}  // namespace granule::app
