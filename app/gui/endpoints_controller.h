// EndpointsController: the OpenAI-compatible servers the window knows (Settings →
// Endpoints): each with a name, a base URL, an API key kept in the system keychain, a stall
// timeout, and the models its /v1/models lists, with one line saying whether it answered. A
// chat that runs on an endpoint's model names it "URL#model" (remote_inference_engine.h); this
// controller gives such a reference its label, its context, its key and its stall timeout — a
// key the keychain is still reading at start-up is waited for. GUI thread only; the model
// lists are fetched on a pool thread.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QObject>
#include <QPointer>
#include <QSet>
#include <QThreadPool>
#include <QVariantList>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "chat_store.h"
#include "list_model.h"
#include "secret_store.h"
#include "worker_types.h"

namespace granule::app {

struct EndpointEntry {
  enum class State { Unchecked, Checking, Reachable, Unauthorized, Unreachable, Failed };
  QString id;  // stable across renames and URL changes: the keychain entry's name
  QString name;
  QString base_url;
  QString api_key;  // from the keychain (or typed this session when there is none)
  // The keychain is reading the key (at start-up); requests wait for it (whenAccessReady).
  bool key_pending = false;
  bool key_saved = false;  // a key was set and stored (saved with the endpoint, not the key)
  QString key_error;       // the keychain's failure to read it, one line
  qint32 stall_timeout_seconds = kDefaultStallTimeoutSeconds;
  State state = State::Unchecked;
  QString status;  // one line: "3 models · llama-server", or the fault's message
  QStringList models;
  QList<qint64> model_contexts;  // tokens per model, 0 where the server does not say
  QString server;                // "vLLM", "llama-server", … from owned_by
  bool has_key() const { return !api_key.isEmpty(); }
};

// A model on an endpoint, as a chat stores it: "URL#model".
QString endpointModelRef(const QString& base_url, const QString& model);
// The base URL and model of a reference ("", "" for the local engine's "").
std::pair<QString, QString> splitEndpointModelRef(const QString& ref);

class EndpointListModel : public granule::app::ListModel {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("Endpoints come from EndpointsController")

 public:
  enum Role {
    EndpointIdRole = Qt::UserRole + 1,
    NameRole,
    BaseUrlRole,
    HasKeyRole,
    ModelsRole,
    ModelsTextRole,  // the models, comma-separated
    StatusRole,
    ReachabilityRole,  // "unchecked", "checking", "reachable", "unauthorized", "unreachable",
                       // "failed"
    StallTimeoutRole,  // seconds
  };
  Q_ENUM(Role)

  explicit EndpointListModel(QObject* parent = nullptr) : ListModel(NameRole, parent) {}
  const QList<EndpointEntry>& endpoints() const { return endpoints_; }
  void setEndpoints(const QList<EndpointEntry>& endpoints);
  void changed(int row, const EndpointEntry& endpoint);

 private:
  int itemCount() const override { return static_cast<int>(endpoints_.size()); }
  QVariant value(int row, int role) const override;
  QList<EndpointEntry> endpoints_;
};

class EndpointsController : public QObject {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("Created by the application")
  Q_PROPERTY(granule::app::EndpointListModel* list READ list CONSTANT)
  // Every model of every endpoint as {ref, label}, for the chat's engine menu.
  Q_PROPERTY(QVariantList engineChoices READ engineChoices NOTIFY endpointsChanged)
  // Whether this build can reach servers (the remote client is built).
  Q_PROPERTY(bool available READ available CONSTANT)

 public:
  // Keys live in `secrets` (the system keychain unless a test passes its own).
  explicit EndpointsController(ChatStore& store, std::shared_ptr<SecretStore> secrets = {},
                               QObject* parent = nullptr);
  ~EndpointsController() override;

  EndpointListModel* list() { return &list_; }
  QVariantList engineChoices() const;
  bool available() const;

  // Adds an endpoint and asks it for its models; returns its id ("" for an empty URL).
  Q_INVOKABLE QString add(const QString& name, const QString& base_url, const QString& api_key);
  Q_INVOKABLE void edit(const QString& id, const QString& name, const QString& base_url);
  // An empty key removes it from the keychain (and sends none).
  Q_INVOKABLE void setApiKey(const QString& id, const QString& api_key);
  // How long a stream from this endpoint may send nothing before it ends as stalled: from
  // kMinStallTimeoutSeconds to kMaxStallTimeoutSeconds; saved with the endpoint, used by the
  // requests after it. Returns "" or why the value was refused (one line).
  Q_INVOKABLE QString setStallTimeout(const QString& id, int seconds);
  Q_INVOKABLE int minStallTimeout() const { return kMinStallTimeoutSeconds; }
  Q_INVOKABLE int maxStallTimeout() const { return kMaxStallTimeoutSeconds; }
  Q_INVOKABLE void remove(const QString& id);
  // Lists the endpoint's models again (GET /v1/models); the row says "checking" meanwhile.
  Q_INVOKABLE void refresh(const QString& id);
  Q_INVOKABLE void refreshAll();
  // "gpu-box · Llama-3.1-8B" for an endpoint's model, "Loaded model" for "" (the window's
  // model: the local engine, or the endpoint model Models → Server opened).
  Q_INVOKABLE QString engineLabel(const QString& ref) const;
  // What the model bar says under an endpoint model's name: "Granule · http://box:8080/v1",
  // with the endpoint's status line when it did not answer.
  Q_INVOKABLE QString engineFacts(const QString& ref) const;
  // The model's context in tokens as its server lists it; 0 when it does not say.
  Q_INVOKABLE qint64 contextOf(const QString& ref) const;
  // The key and stall timeout of the endpoint at `base_url` (a URL with or without its "/v1"
  // finds it; an unknown URL gets no key and the default timeout), once the keychain has
  // answered for the endpoint's key (at once when it has): `ready` runs on the GUI thread,
  // unless `context` is gone by then. A keychain that fails to read a stored key, or does not
  // answer within kKeyReadTimeoutMs, gives an access with `error` set.
  void whenAccessReady(const QString& base_url, QObject* context,
                       std::function<void(const EndpointAccess&)> ready);
  // The key and stall timeout for any thread (the engine thread opens a "URL#model" from
  // Models → Server with it): it reads a copy kept current as the endpoints change, and waits
  // while the keychain reads the endpoint's key. Never call it on the GUI thread (the keychain
  // answers there).
  std::function<EndpointAccess(const std::string&)> accessLookup() const;
  static constexpr int kKeyReadTimeoutMs = 30000;
  // Waits for the model lists in flight (tests, shutdown).
  void waitForRefreshes() { pool_.waitForDone(); }

 Q_SIGNALS:
  void endpointsChanged();

 private:
  int rowOf(const QString& id) const;
  void save();
  void readKey(const QString& id);
  void keyRead(const QString& id, const SecretStore::Answer& answer);
  void keyReadTimedOut(const QString& id);
  EndpointAccess accessOf(const EndpointEntry& e) const;
  void storeKey(const QString& id, const QString& key);
  void update(const QString& id, const std::function<void(EndpointEntry&)>& change);
  void publishKeys();

  struct KeyTable {
    std::mutex mutex;
    std::condition_variable changed;
    struct Entry {
      QString url;  // the base URL without "/v1"
      EndpointAccess access;
      bool pending = false;
    };
    std::vector<Entry> entries;
  };

  ChatStore& store_;
  EndpointListModel list_;
  QThreadPool pool_;
  quint64 refresh_serial_ = 0;  // a late answer for a changed endpoint is dropped
  QHash<QString, quint64> refresh_of_;
  std::shared_ptr<KeyTable> keys_ = std::make_shared<KeyTable>();
  std::shared_ptr<SecretStore> secrets_;
  // Requests waiting for an endpoint's key, by endpoint id.
  struct Waiter {
    QPointer<QObject> context;
    std::function<void(const EndpointAccess&)> ready;
  };
  QHash<QString, QList<Waiter>> waiters_;
  QSet<QString> reading_;  // endpoints whose key the keychain is reading
};

}  // namespace granule::app
