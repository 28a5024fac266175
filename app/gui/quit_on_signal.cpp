// Self-pipe: the signal handler only writes a byte (async-signal-safe); a QSocketNotifier
// on the GUI thread reads it and asks the event loop to quit.
#include "quit_on_signal.h"

#include <sys/socket.h>
#include <unistd.h>

#include <QCoreApplication>
#include <QSocketNotifier>
#include <csignal>

namespace granule::app {
namespace {

int g_signal_fds[2] = {-1, -1};

void onSignal(int) {
  const char byte = 1;
  [[maybe_unused]] const ssize_t written = ::write(g_signal_fds[0], &byte, 1);
}

}  // namespace

void quitOnTerminationSignals() {
  if (g_signal_fds[0] >= 0 || ::socketpair(AF_UNIX, SOCK_STREAM, 0, g_signal_fds) != 0) return;
  auto* notifier =
      new QSocketNotifier(g_signal_fds[1], QSocketNotifier::Read, QCoreApplication::instance());
  QObject::connect(notifier, &QSocketNotifier::activated, notifier, [] {
    char byte = 0;
    [[maybe_unused]] const ssize_t got = ::read(g_signal_fds[1], &byte, 1);
    QCoreApplication::quit();
  });
  struct sigaction action {};
  action.sa_handler = onSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

}  // namespace granule::app
