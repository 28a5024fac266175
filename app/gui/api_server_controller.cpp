// The server switch's settings, its state as the worker reports it, and the request list.
#include "api_server_controller.h"

#include <QRegularExpression>

#ifdef GRANULE_HAVE_HUB
#include <qt6keychain/keychain.h>  // QtKeychain comes with the Hub page's build
#endif

namespace granule::app {
namespace {
const QString kEnabledKey = QStringLiteral("server/enabled");
const QString kHostKey = QStringLiteral("server/host");
const QString kPortKey = QStringLiteral("server/port");
// Where earlier versions kept the key in plain text: read once, moved to the keychain.
const QString kApiKeyKey = QStringLiteral("server/api_key");
const QString kKeychainService = QStringLiteral("Granule");
const QString kKeychainKey = QStringLiteral("server-api-key");
}  // namespace

ApiServerController::ApiServerController(ChatStore& store, ErrorReporter& errors, QObject* parent)
    : QObject(parent), store_(store), errors_(errors) {
  const ServeSettings defaults;
  settings_.enabled = store.setting(kEnabledKey, QStringLiteral("0")) == QLatin1String("1");
  settings_.host = store.setting(kHostKey, defaults.host);
  bool ok = false;
  const int port = store.setting(kPortKey, QString::number(defaults.port)).toInt(&ok);
  settings_.port = ok && port >= 0 && port <= 65535 ? port : defaults.port;
  const QString plain_text_key = store.setting(kApiKeyKey);
  if (!plain_text_key.isEmpty()) {
    // An older version's key: used now, moved to the keychain (the plain text is erased once
    // the keychain holds it).
    settings_.api_key = plain_text_key;
    storeKey(plain_text_key);
  } else {
    readKeyFromKeychain();
  }
}

void ApiServerController::readKeyFromKeychain() {
#ifdef GRANULE_HAVE_HUB
  key_loading_ = true;
  auto* job = new QKeychain::ReadPasswordJob(kKeychainService, this);
  job->setKey(kKeychainKey);
  connect(job, &QKeychain::Job::finished, this, [this, job] {
    key_loading_ = false;
    if (job->error() == QKeychain::NoError) settings_.api_key = job->textData();
    Q_EMIT settingsChanged();
    if (apply_pending_) {
      apply_pending_ = false;
      apply();
    }
  });
  job->start();
#endif
}

void ApiServerController::storeKey(const QString& key) {
#ifdef GRANULE_HAVE_HUB
  QKeychain::Job* job = nullptr;
  if (key.isEmpty()) {
    job = new QKeychain::DeletePasswordJob(kKeychainService, this);
  } else {
    auto* write = new QKeychain::WritePasswordJob(kKeychainService, this);
    write->setTextData(key);
    job = write;
  }
  job->setKey(kKeychainKey);
  connect(job, &QKeychain::Job::finished, this, [this, job, key] {
    const bool stored = job->error() == QKeychain::NoError || key.isEmpty();
    if (stored && !store_.setting(kApiKeyKey).isEmpty()) store_.setSetting(kApiKeyKey, QString());
    key_note_ = stored ? QString()
                       : tr("No system keychain (%1): the key is kept until Granule closes.")
                             .arg(job->errorString());
    Q_EMIT settingsChanged();
  });
  job->start();
#else
  key_note_ = key.isEmpty() ? QString() : tr("This build has no keychain: the key is kept until Granule closes.");
#endif
}

void ApiServerController::setEnabled(bool enabled) {
  if (enabled == settings_.enabled) return;
  settings_.enabled = enabled;
  store_.setSetting(kEnabledKey, enabled ? QStringLiteral("1") : QStringLiteral("0"));
  changed(true);
}

void ApiServerController::setHost(const QString& host) {
  const QString trimmed = host.trimmed();
  if (trimmed.isEmpty() || trimmed == settings_.host) return;
  settings_.host = trimmed;
  store_.setSetting(kHostKey, trimmed);
  changed(settings_.enabled);
}

void ApiServerController::setPort(int port) {
  if (port < 0 || port > 65535 || port == settings_.port) return;
  settings_.port = port;
  store_.setSetting(kPortKey, QString::number(port));
  changed(settings_.enabled);
}

void ApiServerController::setApiKey(const QString& key) {
  const QString trimmed = key.trimmed();
  if (trimmed == settings_.api_key) return;
  settings_.api_key = trimmed;
  // A key from an older version stays in plain text no longer than this.
  if (!store_.setting(kApiKeyKey).isEmpty()) store_.setSetting(kApiKeyKey, QString());
  storeKey(trimmed);
  changed(settings_.enabled);
}

bool ApiServerController::hostExposed() const {
  // Loopback: localhost, ::1 and 127.0.0.0/8. Any other name may resolve to anything: warn.
  static const QRegularExpression ipv4_loopback(
      QStringLiteral("^127\\.\\d{1,3}\\.\\d{1,3}\\.\\d{1,3}$"));
  const QString& host = settings_.host;
  return !(host == QLatin1String("localhost") || host == QLatin1String("::1") ||
           ipv4_loopback.match(host).hasMatch());
}

void ApiServerController::changed(bool restart) {
  Q_EMIT settingsChanged();
  if (restart) apply();
}

void ApiServerController::apply() {
  if (key_loading_ && settings_.enabled) {  // not without the key it may need
    apply_pending_ = true;
    state_ = State::Starting;
    Q_EMIT statusChanged();
    return;
  }
  if (settings_.enabled) {
    state_ = State::Starting;
  } else if (state_ != State::Off) {
    // Stopping takes the worker a moment; the switch says off at once.
    state_ = State::Off;
    status_ = {};
    requests_.setRequests({});
  }
  Q_EMIT statusChanged();
  Q_EMIT servingRequested(settings_);
}

void ApiServerController::onServingChanged(const ServingStatus& status) {
  // A late answer for settings changed since is followed by the answer for the new ones;
  // one that says "serving" after the switch went off is the old server's, already stopping.
  if (!settings_.enabled && status.state != ServingStatus::State::Off) return;
  const bool new_error =
      status.state == ServingStatus::State::Failed && status.error != status_.error;
  status_ = status;
  switch (status.state) {
    case ServingStatus::State::Off:
      state_ = settings_.enabled ? State::Starting : State::Off;
      requests_.setRequests({});
      break;
    case ServingStatus::State::Waiting:
      state_ = State::Waiting;
      break;
    case ServingStatus::State::Serving:
      state_ = State::Serving;
      break;
    case ServingStatus::State::Failed:
      state_ = State::Failed;
      requests_.setRequests({});
      break;
  }
  Q_EMIT statusChanged();
  if (new_error) {
    errors_.report(status.error,
                   QStringLiteral("The window works as usual; choose another port in Settings."));
  }
}

void ApiServerController::onTelemetry(const TelemetryFrame& frame) {
  if (state_ != State::Serving && requests_.count() == 0) return;
  const int before = requests_.count();
  requests_.setRequests(state_ == State::Serving ? frame.api_requests
                                                 : QList<ApiRequestTelemetry>{});
  if (requests_.count() != before) Q_EMIT statusChanged();
}

QString ApiServerController::url() const {
  if (state_ != State::Serving) return {};
  // An IPv6 address goes in brackets.
  const QString host = status_.host.contains(QLatin1Char(':'))
                           ? QStringLiteral("[%1]").arg(status_.host)
                           : status_.host;
  return QStringLiteral("http://%1:%2").arg(host).arg(status_.port);
}

QString ApiServerController::statusText() const {
  switch (state_) {
    case State::Off:
      return tr("Off");
    case State::Starting:
      return tr("Starting…");
    case State::Waiting:
      return tr("Serves once a model is loaded");
    case State::Failed:
      return status_.error;
    case State::Serving: {
      const int n = runningRequests();
      const QString running = n == 0   ? tr("idle")
                              : n == 1 ? tr("1 request running")
                                       : tr("%1 requests running").arg(n);
      return tr("Serving on %1 — %2").arg(url(), running);
    }
  }
  return {};
}

}  // namespace granule::app
