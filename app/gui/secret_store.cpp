// The system keychain through QtKeychain's jobs (which come with the Hub page's build).
#include "secret_store.h"

#ifdef GRANULE_HAVE_HUB
#include <qt6keychain/keychain.h>
#endif

namespace granule::app {
namespace {

#ifdef GRANULE_HAVE_HUB
class QtKeychainStore final : public SecretStore {
 public:
  explicit QtKeychainStore(QString service) : service_(std::move(service)) {}

  void read(const QString& key, QObject* context, Done done) override {
    auto* job = new QKeychain::ReadPasswordJob(service_, context);
    job->setKey(key);
    QObject::connect(job, &QKeychain::Job::finished, context, [job, done = std::move(done)] {
      Answer answer;
      if (job->error() == QKeychain::NoError) {
        answer.status = Status::Found;
        answer.text = job->textData();
      } else if (job->error() == QKeychain::EntryNotFound) {
        answer.status = Status::NotFound;
      } else {
        answer.status = Status::Failed;
        answer.error = job->errorString();
      }
      done(answer);
    });
    job->start();
  }

  void write(const QString& key, const QString& text, QObject* context, Done done) override {
    QKeychain::Job* job = nullptr;
    if (text.isEmpty()) {
      job = new QKeychain::DeletePasswordJob(service_, context);
    } else {
      auto* write = new QKeychain::WritePasswordJob(service_, context);
      write->setTextData(text);
      job = write;
    }
    job->setKey(key);
    QObject::connect(job, &QKeychain::Job::finished, context, [job, done = std::move(done)] {
      Answer answer;
      // Deleting what is not there leaves the store as asked.
      if (job->error() == QKeychain::NoError || job->error() == QKeychain::EntryNotFound) {
        answer.status = Status::Found;
      } else {
        answer.status = Status::Failed;
        answer.error = job->errorString();
      }
      if (done) done(answer);
    });
    job->start();
  }

 private:
  QString service_;
};
#endif

// A build without QtKeychain: nothing is stored across sessions.
class NoKeychain final : public SecretStore {
 public:
  void read(const QString&, QObject* context, Done done) override {
    QMetaObject::invokeMethod(
        context, [done = std::move(done)] { done({}); }, Qt::QueuedConnection);
  }
  void write(const QString&, const QString& text, QObject* context, Done done) override {
    if (!done) return;
    Answer answer;
    answer.status = text.isEmpty() ? Status::Found : Status::Failed;
    if (!text.isEmpty()) answer.error = QStringLiteral("this build has no keychain support");
    QMetaObject::invokeMethod(
        context, [done = std::move(done), answer] { done(answer); }, Qt::QueuedConnection);
  }
};

}  // namespace

std::shared_ptr<SecretStore> systemKeychain(const QString& service) {
#ifdef GRANULE_HAVE_HUB
  return std::make_shared<QtKeychainStore>(service);
#else
  (void)service;
  return std::make_shared<NoKeychain>();
#endif
}

}  // namespace granule::app
