// HubController: the window's Hub page — search the Hub for GGUF repositories, a
// repository's quants with the fit of each read from its header (for the context, chats
// and budget the model settings hold), the largest that fits recommended, and a queue of
// downloads (progress, pause/resume, cancel) into huggingface_hub's cache. The Hub token
// lives in the system keychain (QtKeychain), never in a file; HF_TOKEN wins when set.
// Network work runs on helper threads; results come back as queued calls.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QObject>
#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "hub_models.h"

namespace granule::hub {
struct GgufModel;
struct RepoListing;
}  // namespace granule::hub

namespace granule::app {

class ErrorReporter;
class ModelController;

class HubController : public QObject {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("Created by the application")
  Q_PROPERTY(granule::app::HubSearchModel* searchResults READ searchResults CONSTANT)
  Q_PROPERTY(granule::app::HubQuantModel* quants READ quants CONSTANT)
  Q_PROPERTY(granule::app::HubDownloadModel* downloads READ downloads CONSTANT)
  Q_PROPERTY(bool busy READ busy NOTIFY stateChanged)
  // What the page is doing or what went wrong, one line.
  Q_PROPERTY(QString status READ status NOTIFY stateChanged)
  Q_PROPERTY(QString repo READ repo NOTIFY stateChanged)
  Q_PROPERTY(QString endpoint READ endpoint CONSTANT)
  Q_PROPERTY(QString cacheFolder READ cacheFolder CONSTANT)
  // "none", "HF_TOKEN", "keychain", "session" (no keychain: kept in memory only).
  Q_PROPERTY(QString tokenSource READ tokenSource NOTIFY tokenChanged)
  Q_PROPERTY(bool available READ available CONSTANT)  // built with the Hub client

 public:
  HubController(ModelController& model, ErrorReporter& errors, QObject* parent = nullptr);
  ~HubController() override;

  HubSearchModel* searchResults() { return &search_; }
  HubQuantModel* quants() { return &quants_; }
  HubDownloadModel* downloads() { return &downloads_; }
  bool busy() const { return busy_ > 0; }
  QString status() const { return status_; }
  QString repo() const { return repo_; }
  QString endpoint() const;
  QString cacheFolder() const;
  QString tokenSource() const { return token_source_; }
  bool available() const;

  Q_INVOKABLE void search(const QString& text, bool recent);
  // Lists the repository's GGUF models and reads each one's header for its fit.
  Q_INVOKABLE void openRepo(const QString& repo);
  Q_INVOKABLE void download(int quant_row);
  Q_INVOKABLE void pause(int download_row);
  Q_INVOKABLE void resume(int download_row);
  Q_INVOKABLE void cancel(int download_row);
  // The downloaded model through the fit preview, as Open file does.
  Q_INVOKABLE void load(int download_row);
  // A quant already in the cache, through the fit preview.
  Q_INVOKABLE void loadCached(int quant_row);
  Q_INVOKABLE void setToken(const QString& token);
  Q_INVOKABLE void forgetToken();

 Q_SIGNALS:
  void stateChanged();
  void tokenChanged();

 private:
  struct Job;
  void run(std::function<void()> work);
  void setStatus(const QString& text);
  void startNextDownload();
  void readTokenFromKeychain();
  std::string token() const;

  ModelController& model_;
  ErrorReporter& errors_;
  HubSearchModel search_;
  HubQuantModel quants_;
  HubDownloadModel downloads_;
  int busy_ = 0;
  QString status_;
  QString repo_;
  QString token_source_ = QStringLiteral("none");
  mutable std::mutex token_mutex_;
  std::string token_;
  int search_generation_ = 0;
  int repo_generation_ = 0;
  std::shared_ptr<hub::RepoListing> listing_;
  std::vector<std::shared_ptr<hub::GgufModel>> models_;  // per quant row
  struct Queued {
    std::shared_ptr<hub::GgufModel> model;
    std::string repo;
    std::shared_ptr<std::atomic<bool>> stop;
    bool discard = false;  // cancel (drop the partial file), not pause
  };
  std::vector<Queued> queue_;  // per download row
  int active_download_ = -1;
  std::atomic<bool> closing_{false};
  std::mutex threads_mutex_;
  std::vector<std::thread> threads_;
};

}  // namespace granule::app
