// SecretStore: where the window keeps the endpoints' API keys — the system keychain
// (QtKeychain) in the application, a double in the tests. Every call answers later, on the
// caller's (GUI) thread, through its callback; an answer for a context object that is gone is
// dropped.
#pragma once
#include <QObject>
#include <QString>
#include <functional>
#include <memory>

namespace granule::app {

class SecretStore {
 public:
  enum class Status { Found, NotFound, Failed };
  struct Answer {
    Status status = Status::NotFound;
    QString text;   // the secret (Found)
    QString error;  // one line: why the store failed (Failed)
  };
  using Done = std::function<void(const Answer&)>;

  virtual ~SecretStore() = default;
  virtual void read(const QString& key, QObject* context, Done done) = 0;
  // An empty `text` deletes the entry. `done` may be empty.
  virtual void write(const QString& key, const QString& text, QObject* context, Done done) = 0;
};

// The desktop's keychain (Secret Service, KWallet, …) under `service`; in a build without
// QtKeychain, a store that holds nothing and says so when written to.
std::shared_ptr<SecretStore> systemKeychain(const QString& service);

}  // namespace granule::app
