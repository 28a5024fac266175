// The endpoints list: stored in the settings table (names, URLs, stall timeouts, whether a key
// is stored) and the keychain (keys), with each endpoint's /v1/models fetched on a pool thread
// and answered on the GUI thread.
#include "endpoints_controller.h"

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QTimer>
#include <QUuid>
#include <algorithm>
#include <chrono>
#ifdef GRANULE_HAVE_REMOTE
#include "remote/openai_client.h"
#endif

namespace granule::app {
namespace {

const QString kEndpointsKey = QStringLiteral("remote/endpoints");
const QString kKeychainService = QStringLiteral("Granule");
QString keychainKey(const QString& id) { return QStringLiteral("endpoint-api-key-") + id; }

const char* stateName(EndpointEntry::State state) {
  switch (state) {
    case EndpointEntry::State::Unchecked:
      return "unchecked";
    case EndpointEntry::State::Checking:
      return "checking";
    case EndpointEntry::State::Reachable:
      return "reachable";
    case EndpointEntry::State::Unauthorized:
      return "unauthorized";
    case EndpointEntry::State::Unreachable:
      return "unreachable";
    case EndpointEntry::State::Failed:
      return "failed";
  }
  return "unchecked";
}

// The URL as typed, less spaces and a trailing slash (so one server is one endpoint).
QString normalizedUrl(const QString& url) {
  QString u = url.trimmed();
  while (u.endsWith(QLatin1Char('/'))) u.chop(1);
  return u;
}

// What a /v1/models request found, carried from the pool thread.
struct ModelListAnswer {
  EndpointEntry::State state = EndpointEntry::State::Failed;
  QString status;
  QStringList models;
  QList<qint64> contexts;
  QString server;
};

ModelListAnswer listModels(const QString& base_url, const QString& api_key) {
  ModelListAnswer answer;
#ifdef GRANULE_HAVE_REMOTE
  remote::Endpoint endpoint{base_url.toStdString(), api_key.toStdString()};
  endpoint.connect_timeout_seconds = 5;  // a check, not a chat: say "unreachable" soon
  endpoint.stall_timeout_seconds = 15;
  const remote::OpenAiClient client(endpoint);
  const remote::ModelList list = client.list_models();
  if (list.fault) {
    answer.status = QString::fromStdString(list.fault.message);
    answer.state =
        list.fault.kind == remote::FaultKind::Unauthorized  ? EndpointEntry::State::Unauthorized
        : list.fault.kind == remote::FaultKind::Unreachable ? EndpointEntry::State::Unreachable
                                                            : EndpointEntry::State::Failed;
    return answer;
  }
  remote::ServerKind kind = remote::ServerKind::Unknown;
  for (const remote::RemoteModel& m : list.models) {
    answer.models.append(QString::fromStdString(m.id));
    answer.contexts.append(m.context_tokens.value_or(0));
    if (kind == remote::ServerKind::Unknown) kind = remote::server_kind(m.owned_by);
  }
  answer.server = QString::fromUtf8(remote::server_kind_name(kind));
  answer.state = EndpointEntry::State::Reachable;
  answer.status = answer.models.size() == 1
                      ? QStringLiteral("reachable · 1 model · %1").arg(answer.server)
                      : QStringLiteral("reachable · %1 models · %2")
                            .arg(answer.models.size())
                            .arg(answer.server);
#else
  (void)base_url;
  (void)api_key;
  answer.status = QStringLiteral("this build has no remote client (libcurl was not found)");
#endif
  return answer;
}

}  // namespace

QString endpointModelRef(const QString& base_url, const QString& model) {
  return normalizedUrl(base_url) + QLatin1Char('#') + model;
}

std::pair<QString, QString> splitEndpointModelRef(const QString& ref) {
  const qsizetype hash = ref.indexOf(QLatin1Char('#'));
  if (hash <= 0) return {};
  return {ref.left(hash), ref.mid(hash + 1)};
}

void EndpointListModel::setEndpoints(const QList<EndpointEntry>& endpoints) {
  beginResetModel();
  endpoints_ = endpoints;
  endResetModel();
  Q_EMIT countChanged();
}

void EndpointListModel::changed(int row, const EndpointEntry& endpoint) {
  if (row < 0 || row >= endpoints_.size()) return;
  endpoints_[row] = endpoint;
  Q_EMIT dataChanged(index(row), index(row));
}

QVariant EndpointListModel::value(int row, int role) const {
  const EndpointEntry& e = endpoints_[row];
  switch (role) {
    case EndpointIdRole:
      return e.id;
    case NameRole:
      return e.name;
    case BaseUrlRole:
      return e.base_url;
    case HasKeyRole:
      return e.has_key();
    case ModelsRole:
      return e.models;
    case ModelsTextRole:
      return e.models.join(QStringLiteral(", "));
    case StatusRole:
      return e.status;
    case ReachabilityRole:
      return QString::fromLatin1(stateName(e.state));
    case StallTimeoutRole:
      return e.stall_timeout_seconds;
    default:
      return {};
  }
}

EndpointsController::EndpointsController(ChatStore& store, std::shared_ptr<SecretStore> secrets,
                                         QObject* parent)
    : QObject(parent),
      store_(store),
      secrets_(secrets ? std::move(secrets) : systemKeychain(kKeychainService)) {
  // Lists run one or two at a time; each is bounded by its connect and stall timeouts.
  pool_.setMaxThreadCount(2);
  QList<EndpointEntry> endpoints;
  const QJsonArray saved =
      QJsonDocument::fromJson(store_.setting(kEndpointsKey, QStringLiteral("[]")).toUtf8()).array();
  for (const QJsonValue& v : saved) {
    const QJsonObject o = v.toObject();
    EndpointEntry e;
    e.id = o.value(QStringLiteral("id")).toString();
    e.name = o.value(QStringLiteral("name")).toString();
    e.base_url = normalizedUrl(o.value(QStringLiteral("base_url")).toString());
    if (e.id.isEmpty() || e.base_url.isEmpty()) continue;
    e.stall_timeout_seconds =
        std::clamp(o.value(QStringLiteral("stall_timeout_s")).toInt(kDefaultStallTimeoutSeconds),
                   kMinStallTimeoutSeconds, kMaxStallTimeoutSeconds);
    // An entry saved before "has_key" existed may have a key stored: it is read too.
    e.key_saved = o.value(QStringLiteral("has_key")).toBool(false);
    e.key_pending = e.key_saved || !o.contains(QStringLiteral("has_key"));
    endpoints.append(e);
  }
  list_.setEndpoints(endpoints);
  publishKeys();
  // Each then lists its models; one that stored no key lists them at once.
  for (const EndpointEntry& e : endpoints) {
    if (e.key_pending)
      readKey(e.id);
    else
      refresh(e.id);
  }
}

namespace {
QString withoutV1(const QString& url) {
  QString u = normalizedUrl(url);
  if (u.endsWith(QStringLiteral("/v1"))) u.chop(3);
  return u;
}
}  // namespace

void EndpointsController::publishKeys() {
  std::vector<KeyTable::Entry> entries;
  for (const EndpointEntry& e : list_.endpoints())
    entries.push_back({withoutV1(e.base_url), accessOf(e), e.key_pending});
  {
    std::lock_guard lock(keys_->mutex);
    keys_->entries = std::move(entries);
  }
  keys_->changed.notify_all();
}

EndpointAccess EndpointsController::accessOf(const EndpointEntry& e) const {
  EndpointAccess access;
  access.api_key = e.api_key;
  access.stall_timeout_seconds = e.stall_timeout_seconds;
  // A stored key the keychain would not give: sending without it would only be refused.
  if (e.api_key.isEmpty() && e.key_saved && !e.key_error.isEmpty())
    access.error = tr("The API key of endpoint \"%1\" could not be read from the system "
                      "keychain (%2): enter it again in Settings → Endpoints")
                       .arg(e.name, e.key_error);
  return access;
}

void EndpointsController::whenAccessReady(const QString& base_url, QObject* context,
                                          std::function<void(const EndpointAccess&)> ready) {
  const QString url = withoutV1(base_url);
  for (const EndpointEntry& e : list_.endpoints()) {
    if (withoutV1(e.base_url) != url) continue;
    if (e.key_pending) {
      waiters_[e.id].append({QPointer<QObject>(context), std::move(ready)});
      return;
    }
    ready(accessOf(e));
    return;
  }
  ready({});  // not an endpoint of Settings (removed since): no key, the default timeout
}

std::function<EndpointAccess(const std::string&)> EndpointsController::accessLookup() const {
  return [keys = keys_](const std::string& base_url) {
    const QString url = withoutV1(QString::fromStdString(base_url));
    std::unique_lock lock(keys->mutex);
    const auto find = [&]() -> const KeyTable::Entry* {
      for (const KeyTable::Entry& e : keys->entries)
        if (e.url == url) return &e;
      return nullptr;
    };
    // The GUI thread's read ends by its own timeout; this bound only guards against a GUI
    // thread that no longer runs.
    keys->changed.wait_for(lock, std::chrono::milliseconds(kKeyReadTimeoutMs + 5000), [&] {
      const KeyTable::Entry* e = find();
      return !e || !e->pending;
    });
    const KeyTable::Entry* e = find();
    if (!e) return EndpointAccess{};
    if (e->pending) {
      EndpointAccess timed_out = e->access;
      timed_out.error =
          QStringLiteral("the system keychain did not answer for the key of %1").arg(url);
      return timed_out;
    }
    return e->access;
  };
}

EndpointsController::~EndpointsController() {
  // A list in flight answers into this object: wait for it (bounded by its timeouts).
  pool_.waitForDone();
}

bool EndpointsController::available() const {
#ifdef GRANULE_HAVE_REMOTE
  return true;
#else
  return false;
#endif
}

int EndpointsController::rowOf(const QString& id) const {
  const QList<EndpointEntry>& all = list_.endpoints();
  for (int i = 0; i < all.size(); ++i)
    if (all[i].id == id) return i;
  return -1;
}

void EndpointsController::update(const QString& id,
                                 const std::function<void(EndpointEntry&)>& change) {
  const int row = rowOf(id);
  if (row < 0) return;
  const EndpointEntry before = list_.endpoints()[row];
  EndpointEntry e = before;
  change(e);
  list_.changed(row, e);
  if (e.api_key != before.api_key || e.base_url != before.base_url ||
      e.key_pending != before.key_pending || e.key_error != before.key_error ||
      e.key_saved != before.key_saved || e.stall_timeout_seconds != before.stall_timeout_seconds ||
      e.name != before.name)
    publishKeys();
  // The menus' choices change only with a name, a URL or a model list (not with a status line
  // while a check runs, which would rebuild an open menu).
  if (e.name != before.name || e.base_url != before.base_url || e.models != before.models ||
      e.model_contexts != before.model_contexts)
    Q_EMIT endpointsChanged();
}

void EndpointsController::save() {
  QJsonArray out;
  for (const EndpointEntry& e : list_.endpoints())
    out.append(QJsonObject{{"id", e.id},
                           {"name", e.name},
                           {"base_url", e.base_url},
                           {"stall_timeout_s", e.stall_timeout_seconds},
                           {"has_key", e.key_saved}});
  store_.setSetting(kEndpointsKey,
                    QString::fromUtf8(QJsonDocument(out).toJson(QJsonDocument::Compact)));
}

QString EndpointsController::add(const QString& name, const QString& base_url,
                                 const QString& api_key) {
  EndpointEntry e;
  e.base_url = normalizedUrl(base_url);
  if (e.base_url.isEmpty()) return {};
  e.id = QUuid::createUuid().toString(QUuid::WithoutBraces).left(8);
  e.name = name.trimmed().isEmpty() ? e.base_url : name.trimmed();
  e.api_key = api_key.trimmed();
  e.key_saved = !e.api_key.isEmpty();
  QList<EndpointEntry> all = list_.endpoints();
  all.append(e);
  list_.setEndpoints(all);
  publishKeys();
  save();
  if (!e.api_key.isEmpty()) storeKey(e.id, e.api_key);
  Q_EMIT endpointsChanged();
  refresh(e.id);
  return e.id;
}

void EndpointsController::edit(const QString& id, const QString& name, const QString& base_url) {
  const QString url = normalizedUrl(base_url);
  if (url.isEmpty()) return;
  bool url_changed = false;
  update(id, [&](EndpointEntry& e) {
    url_changed = e.base_url != url;
    e.base_url = url;
    e.name = name.trimmed().isEmpty() ? url : name.trimmed();
  });
  save();
  if (url_changed) refresh(id);
}

void EndpointsController::setApiKey(const QString& id, const QString& api_key) {
  const QString key = api_key.trimmed();
  reading_.remove(id);  // a late keychain answer does not undo what was typed
  update(id, [&](EndpointEntry& e) {
    e.api_key = key;
    e.key_saved = !key.isEmpty();
    e.key_pending = false;
    e.key_error.clear();
  });
  save();
  storeKey(id, key);
  if (const int row = rowOf(id); row >= 0)
    for (const Waiter& w : waiters_.take(id))
      if (w.context) w.ready(accessOf(list_.endpoints()[row]));
  refresh(id);  // the key may be what it lacked (401)
}

QString EndpointsController::setStallTimeout(const QString& id, int seconds) {
  if (rowOf(id) < 0) return tr("no such endpoint");
  if (seconds < kMinStallTimeoutSeconds || seconds > kMaxStallTimeoutSeconds)
    return tr("the stall timeout must be from %1 to %2 seconds")
        .arg(kMinStallTimeoutSeconds)
        .arg(kMaxStallTimeoutSeconds);
  update(id, [&](EndpointEntry& e) { e.stall_timeout_seconds = seconds; });
  save();
  return {};
}

void EndpointsController::remove(const QString& id) {
  const int row = rowOf(id);
  if (row < 0) return;
  QList<EndpointEntry> all = list_.endpoints();
  all.removeAt(row);
  list_.setEndpoints(all);
  publishKeys();
  refresh_of_.remove(id);
  save();
  storeKey(id, {});
  // Requests that waited for its key go without one (their chat's engine is no endpoint now).
  for (const Waiter& w : waiters_.take(id))
    if (w.context) w.ready({});
  Q_EMIT endpointsChanged();
}

void EndpointsController::refresh(const QString& id) {
  const int row = rowOf(id);
  if (row < 0) return;
  const EndpointEntry& e = list_.endpoints()[row];
  const quint64 serial = ++refresh_serial_;
  refresh_of_[id] = serial;
  const QString url = e.base_url;
  const QString key = e.api_key;
  update(id, [](EndpointEntry& entry) {
    entry.state = EndpointEntry::State::Checking;
    entry.status = tr("checking…");
  });
  pool_.start([this, id, url, key, serial] {
    const ModelListAnswer answer = listModels(url, key);
    // Queued to the GUI thread; dropped with this object if it is gone (Qt discards events
    // posted to a deleted receiver), and the destructor waits for the pool anyway.
    QMetaObject::invokeMethod(
        this,
        [this, id, serial, answer] {
          if (refresh_of_.value(id) != serial) return;  // edited or removed since
          update(id, [&](EndpointEntry& entry) {
            entry.state = answer.state;
            entry.status = answer.status;
            entry.server = answer.server;
            // A failed check keeps the last list: a chat on it still says which model it is.
            if (answer.state == EndpointEntry::State::Reachable) {
              entry.models = answer.models;
              entry.model_contexts = answer.contexts;
            }
          });
        },
        Qt::QueuedConnection);
  });
}

void EndpointsController::refreshAll() {
  for (const EndpointEntry& e : list_.endpoints()) refresh(e.id);
}

QVariantList EndpointsController::engineChoices() const {
  QVariantList out;
  for (const EndpointEntry& e : list_.endpoints()) {
    for (const QString& m : e.models) {
      out.append(QVariantMap{{QStringLiteral("ref"), endpointModelRef(e.base_url, m)},
                             {QStringLiteral("label"), QStringLiteral("%1 · %2").arg(e.name, m)}});
    }
  }
  return out;
}

QString EndpointsController::engineLabel(const QString& ref) const {
  if (ref.isEmpty()) return tr("Loaded model");
  const auto [url, model] = splitEndpointModelRef(ref);
  for (const EndpointEntry& e : list_.endpoints())
    if (e.base_url == url) return QStringLiteral("%1 · %2").arg(e.name, model);
  return QStringLiteral("%1 · %2").arg(url, model);  // an endpoint removed since
}

QString EndpointsController::engineFacts(const QString& ref) const {
  if (ref.isEmpty()) return {};
  const auto [url, model] = splitEndpointModelRef(ref);
  for (const EndpointEntry& e : list_.endpoints()) {
    if (e.base_url != url) continue;
    QStringList facts;
    if (!e.server.isEmpty()) facts << e.server;
    facts << e.base_url;
    if (e.state != EndpointEntry::State::Reachable && !e.status.isEmpty()) facts << e.status;
    return facts.join(QStringLiteral("  ·  "));
  }
  return tr("%1 (not in Settings → Endpoints)").arg(url);
}

qint64 EndpointsController::contextOf(const QString& ref) const {
  const auto [url, model] = splitEndpointModelRef(ref);
  for (const EndpointEntry& e : list_.endpoints()) {
    if (e.base_url != url) continue;
    const qsizetype at = e.models.indexOf(model);
    if (at >= 0 && at < e.model_contexts.size()) return e.model_contexts[at];
  }
  return 0;
}

void EndpointsController::readKey(const QString& id) {
  update(id, [](EndpointEntry& e) {
    e.key_pending = true;
    e.state = EndpointEntry::State::Checking;
    e.status = tr("reading the key from the keychain…");
  });
  reading_.insert(id);
  secrets_->read(keychainKey(id), this,
                 [this, id](const SecretStore::Answer& answer) { keyRead(id, answer); });
  QTimer::singleShot(kKeyReadTimeoutMs, this, [this, id] { keyReadTimedOut(id); });
}

void EndpointsController::keyRead(const QString& id, const SecretStore::Answer& answer) {
  // A key typed meanwhile (setApiKey) wins over a late answer; an answer after the timeout
  // still brings the key.
  if (rowOf(id) < 0 || !reading_.remove(id)) return;
  update(id, [&](EndpointEntry& e) {
    e.key_pending = false;
    if (answer.status == SecretStore::Status::Found) {
      e.api_key = answer.text;
      e.key_saved = true;
      e.key_error.clear();
    } else if (answer.status == SecretStore::Status::Failed) {
      e.key_error = answer.error;
    }
  });
  for (const Waiter& w : waiters_.take(id))
    if (w.context) w.ready(accessOf(list_.endpoints()[rowOf(id)]));
  refresh(id);
}

void EndpointsController::keyReadTimedOut(const QString& id) {
  const int row = rowOf(id);
  if (row < 0 || !list_.endpoints()[row].key_pending) return;
  update(id, [&](EndpointEntry& e) {
    e.key_pending = false;
    e.key_error = tr("it did not answer in %1 s").arg(kKeyReadTimeoutMs / 1000);
    e.state = EndpointEntry::State::Failed;
    e.status = tr("the system keychain did not answer for the key");
  });
  for (const Waiter& w : waiters_.take(id))
    if (w.context) w.ready(accessOf(list_.endpoints()[rowOf(id)]));
}

void EndpointsController::storeKey(const QString& id, const QString& key) {
  secrets_->write(keychainKey(id), key, this, [this, id, key](const SecretStore::Answer& answer) {
    // No keychain (no Secret Service on this desktop): the key works until Granule closes,
    // and the row says so.
    if (answer.status == SecretStore::Status::Failed && !key.isEmpty())
      update(id, [&](EndpointEntry& e) {
        e.status =
            tr("no system keychain (%1): the key is kept until Granule closes").arg(answer.error);
      });
  });
}

}  // namespace granule::app
