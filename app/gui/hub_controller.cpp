// HubController: the Hub client (app/hub) behind the window's Hub page.
#include "hub_controller.h"

#include <QDir>
#include <QLocale>

#include "error_reporter.h"
#include "model_controller.h"

#ifdef GRANULE_HAVE_HUB
#include <qt6keychain/keychain.h>

#include "hub/downloader.h"
#include "hub/hub_support.h"
#include "hub/model_files.h"
#include "hub/remote_fit.h"
#else
namespace granule::hub {
struct GgufModel {};
struct RepoListing {};
}  // namespace granule::hub
#endif

namespace granule::app {
namespace {

const QString kKeychainService = QStringLiteral("Granule");
const QString kKeychainKey = QStringLiteral("huggingface-token");

QString bytesText(double bytes) {
  return QLocale().formattedDataSize(static_cast<qint64>(bytes), 1, QLocale::DataSizeIecFormat);
}

}  // namespace

HubController::HubController(ModelController& model, ErrorReporter& errors, QObject* parent)
    : QObject(parent), model_(model), errors_(errors) {
#ifdef GRANULE_HAVE_HUB
  const hub::HubSettings settings = hub::HubSettings::from_environment();
  if (!qgetenv("HF_TOKEN").trimmed().isEmpty()) {
    token_ = settings.token;
    token_source_ = QStringLiteral("HF_TOKEN");
  } else {
    readTokenFromKeychain();
  }
#endif
}

HubController::~HubController() {
  closing_ = true;
  for (Queued& q : queue_)
    if (q.stop) q.stop->store(true);
  std::vector<std::thread> threads;
  {
    std::lock_guard lock(threads_mutex_);
    threads.swap(threads_);
  }
  for (std::thread& t : threads)
    if (t.joinable()) t.join();
}

bool HubController::available() const {
#ifdef GRANULE_HAVE_HUB
  return true;
#else
  return false;
#endif
}

QString HubController::endpoint() const {
#ifdef GRANULE_HAVE_HUB
  return QString::fromStdString(hub::HubSettings::from_environment().endpoint);
#else
  return {};
#endif
}

QString HubController::cacheFolder() const {
#ifdef GRANULE_HAVE_HUB
  return QString::fromStdString(hub::HubSettings::from_environment().cache_dir.string());
#else
  return {};
#endif
}

std::string HubController::token() const {
  std::lock_guard lock(token_mutex_);
  return token_;
}

void HubController::run(std::function<void()> work) {
  std::lock_guard lock(threads_mutex_);
  // Finished helpers are joined as new ones start; the rest at destruction.
  threads_.emplace_back(std::move(work));
}

void HubController::setStatus(const QString& text) {
  status_ = text;
  Q_EMIT stateChanged();
}

#ifdef GRANULE_HAVE_HUB

namespace {

hub::HubSettings settingsWithToken(const std::string& token) {
  hub::HubSettings s = hub::HubSettings::from_environment();
  if (!token.empty()) s.token = token;
  return s;
}

HubQuantRow quantRow(const hub::GgufModel& m, const hub::HubCache& cache, const std::string& repo) {
  HubQuantRow row;
  row.label = QString::fromStdString(m.label);
  row.fileName = QString::fromStdString(m.first().path);
  row.parts = static_cast<int>(m.parts.size());
  row.sizeBytes = static_cast<double>(m.size_bytes);
  if (const auto path = cache.find(repo, m.first().path)) {
    row.cached = true;
    row.cachedPath = QString::fromStdString(path->string());
  }
  row.fitText = QObject::tr("reading the header…");
  return row;
}

void describeFit(HubQuantRow& row, const hub::QuantFit& q) {
  row.fitted = true;
  row.blockMix = QString::fromStdString(q.block_mix);
  row.headerBytes = static_cast<double>(q.header_bytes_fetched);
  if (!q.fit) {
    row.error = QString::fromStdString(q.error);
    row.fitText = row.error;
    return;
  }
  const FitEstimate& e = *q.fit;
  row.fits = e.fits;
  row.loads = e.loads;
  const int layers = e.resident_layers + e.streamed_layers;
  const QString kv = QObject::tr("KV room %1 tokens").arg(QLocale().toString(static_cast<qlonglong>(e.kv_capacity_tokens)));
  if (!e.loads) {
    row.fitText = QObject::tr("does not load: needs a budget of %1").arg(bytesText(static_cast<double>(e.minimum_budget_bytes)));
  } else if (e.streamed_layers == 0) {
    row.fitText = QObject::tr("fits: %1/%1 layers resident, %2").arg(layers).arg(kv);
  } else {
    row.fitText = QObject::tr("streams %1 of %2 layers, %3").arg(e.streamed_layers).arg(layers).arg(kv);
    row.streamText = QObject::tr("%1 over PCIe per token: at most %2 tokens/s at batch 1")
                         .arg(bytesText(static_cast<double>(e.streamed_bytes_per_pass)))
                         .arg(QString::number(e.pcie_tokens_per_second, 'f', 1));
  }
  if (e.loads && !e.fits)
    row.fitText += QObject::tr(" (context per chat %1 of %2 asked)")
                       .arg(e.max_context_per_chat)
                       .arg(e.context_per_chat);
}

}  // namespace

void HubController::search(const QString& text, bool recent) {
  const int generation = ++search_generation_;
  ++busy_;
  setStatus(tr("Searching %1 for “%2”…").arg(endpoint(), text));
  const std::string query = text.trimmed().toStdString();
  const std::string token = this->token();
  run([this, generation, query, recent, token] {
    std::vector<HubRepoRow> rows;
    QString error;
    try {
      const hub::HubClient client(settingsWithToken(token));
      for (const hub::RepoSummary& r :
           client.search(query, recent ? hub::SearchSort::Recent : hub::SearchSort::Downloads)) {
        HubRepoRow row;
        row.repo = QString::fromStdString(r.id);
        row.downloads = r.downloads;
        row.updated = QString::fromStdString(r.last_modified.substr(0, 10));
        row.architecture = QString::fromStdString(r.architecture);
        row.supported = !r.architecture.empty() && hub::architecture_supported(r.architecture);
        row.gated = r.gated;
        rows.push_back(std::move(row));
      }
    } catch (const std::exception& e) {
      error = QString::fromUtf8(e.what());
    }
    QMetaObject::invokeMethod(this, [this, generation, rows = std::move(rows), error]() mutable {
      --busy_;
      if (generation != search_generation_) return Q_EMIT stateChanged();
      search_.setRows(std::move(rows));
      setStatus(!error.isEmpty() ? error
                : search_.count() == 0 ? tr("No GGUF repositories found.")
                                       : tr("%n repositories", nullptr, search_.count()));
    }, Qt::QueuedConnection);
  });
}

void HubController::openRepo(const QString& repo_text) {
  const int generation = ++repo_generation_;
  repo_ = repo_text.trimmed();
  quants_.setRows({});
  models_.clear();
  ++busy_;
  setStatus(tr("Listing %1…").arg(repo_));
  EngineOptions options;
  options.context_length = model_.contextLength();
  options.max_sequences = model_.maxChats();
  options.vram_budget_bytes = static_cast<uint64_t>(model_.vramBudgetBytes());
  // A budget set in the settings plans for a GPU of that size, also where none is usable
  // (as `granule-cli fit --vram-budget` does); without one, the device this machine has.
  if (options.vram_budget_bytes > 0) options.device = DeviceKind::Cuda;
  const QString plan =
      (options.vram_budget_bytes > 0 ? tr("a GPU budget of %1").arg(bytesText(static_cast<double>(options.vram_budget_bytes)))
                                     : tr("this machine's memory")) +
      tr(", %1 tokens per chat, %n chat(s)", nullptr, options.max_sequences).arg(options.context_length);
  const std::string repo = repo_.toStdString();
  const std::string token = this->token();
  run([this, generation, repo, token, options, plan] {
    try {
      const hub::HubClient client(settingsWithToken(token));
      auto listing = std::make_shared<hub::RepoListing>(client.list_files(repo));
      std::vector<std::shared_ptr<hub::GgufModel>> models;
      std::vector<HubQuantRow> rows;
      const hub::HubCache cache(client.settings().cache_dir);
      for (hub::GgufModel& m : hub::gguf_models(*listing)) {
        if (m.projector) continue;
        rows.push_back(quantRow(m, cache, repo));
        models.push_back(std::make_shared<hub::GgufModel>(std::move(m)));
      }
      QMetaObject::invokeMethod(this, [this, generation, listing, models, rows]() mutable {
        if (generation != repo_generation_) return;
        listing_ = listing;
        models_ = models;
        quants_.setRows(std::move(rows));
        setStatus(tr("%n GGUF models; reading their headers for the fit…", nullptr, quants_.count()));
      }, Qt::QueuedConnection);
      // Each header, then its fit, one row at a time.
      std::vector<hub::QuantFit> fits;
      for (size_t i = 0; i < models.size() && !closing_ && generation == repo_generation_; ++i) {
        hub::QuantFit q = hub::fit_remote(client, *listing, *models[i], options);
        fits.push_back(q);
        HubQuantRow row = quantRow(*models[i], cache, repo);
        describeFit(row, q);
        QMetaObject::invokeMethod(this, [this, generation, i, row] {
          if (generation == repo_generation_) quants_.setRow(static_cast<int>(i), row);
        }, Qt::QueuedConnection);
      }
      const int best = hub::recommended_quant(fits);
      uint64_t header_bytes = 0;
      for (const auto& q : fits) header_bytes += q.header_bytes_fetched;
      QMetaObject::invokeMethod(this, [this, generation, best, header_bytes, plan] {
        --busy_;
        if (generation != repo_generation_) return Q_EMIT stateChanged();
        if (best >= 0) {
          HubQuantRow row = quants_.rows()[static_cast<size_t>(best)];
          row.recommended = true;
          quants_.setRow(best, row);
        }
        setStatus(best >= 0 ? tr("Fit for %1. %2 recommended: the largest that %3. Headers read: %4.")
                                  .arg(plan)
                                  .arg(quants_.rows()[static_cast<size_t>(best)].label)
                                  .arg(quants_.rows()[static_cast<size_t>(best)].fits ? tr("fits") : tr("loads"))
                                  .arg(bytesText(static_cast<double>(header_bytes)))
                            : tr("Fit for %1: none of these loads.").arg(plan));
      }, Qt::QueuedConnection);
    } catch (const std::exception& e) {
      const QString error = QString::fromUtf8(e.what());
      QMetaObject::invokeMethod(this, [this, generation, error] {
        --busy_;
        if (generation == repo_generation_) setStatus(error);
        else Q_EMIT stateChanged();
      }, Qt::QueuedConnection);
    }
  });
}

void HubController::download(int quant_row) {
  if (quant_row < 0 || quant_row >= static_cast<int>(models_.size())) return;
  const HubQuantRow& q = quants_.rows()[static_cast<size_t>(quant_row)];
  HubDownloadRow row;
  row.repo = repo_;
  row.label = q.label;
  row.fileName = q.fileName;
  row.totalBytes = q.sizeBytes;
  row.state = QStringLiteral("queued");
  downloads_.append(row);
  queue_.push_back({models_[static_cast<size_t>(quant_row)], repo_.toStdString(),
                    std::make_shared<std::atomic<bool>>(false), false});
  startNextDownload();
}

void HubController::startNextDownload() {
  if (active_download_ >= 0 || closing_) return;
  for (size_t i = 0; i < queue_.size(); ++i) {
    if (downloads_.rows()[i].state != QLatin1String("queued")) continue;
    active_download_ = static_cast<int>(i);
    Queued job = queue_[i];
    job.stop->store(false);
    HubDownloadRow row = downloads_.rows()[i];
    row.state = QStringLiteral("downloading");
    row.detail.clear();
    downloads_.setRow(static_cast<int>(i), row);
    const std::string token = this->token();
    run([this, i, job, token] {
      const hub::HubClient client(settingsWithToken(token));
      const hub::Downloader downloader(client, hub::HubCache(client.settings().cache_dir));
      QString state = QStringLiteral("done");
      QString detail;
      QString path;
      uint64_t before = 0;  // bytes of the parts already done
      try {
        for (const hub::RepoFile& part : job.model->parts) {
          const auto done = downloader.download(
              job.repo, part, "main",
              [&](const hub::DownloadProgress& p) {
                const double done_bytes = static_cast<double>(before + p.done_bytes);
                QMetaObject::invokeMethod(this, [this, i, p, done_bytes] {
                  HubDownloadRow r = downloads_.rows()[i];
                  if (r.state == QLatin1String("paused") || r.state == QLatin1String("cancelled")) return;
                  r.fileName = QString::fromStdString(p.file);
                  r.doneBytes = done_bytes;
                  r.bytesPerSecond = p.bytes_per_second;
                  r.etaSeconds = p.eta_seconds;
                  r.state = p.state.starts_with("waiting") ? QStringLiteral("waiting")
                            : p.state == "verifying"       ? QStringLiteral("verifying")
                                                           : QStringLiteral("downloading");
                  r.detail = p.state == "downloading" ? QString() : QString::fromStdString(p.state);
                  downloads_.setRow(static_cast<int>(i), r);
                }, Qt::QueuedConnection);
              },
              job.stop.get());
          if (path.isEmpty()) path = QString::fromStdString(done.string());
          before += part.size;
        }
      } catch (const hub::DownloadStopped&) {
        state = QStringLiteral("paused");  // the GUI thread drops the partial file on cancel
      } catch (const std::exception& e) {
        state = QStringLiteral("failed");
        detail = QString::fromUtf8(e.what());
      }
      QMetaObject::invokeMethod(this, [this, i, state, detail, path] {
        HubDownloadRow r = downloads_.rows()[i];
        if (queue_[i].discard) {
          const hub::HubClient client(settingsWithToken(this->token()));
          const hub::Downloader downloader(client, hub::HubCache(client.settings().cache_dir));
          for (const hub::RepoFile& part : queue_[i].model->parts) downloader.discard_partial(queue_[i].repo, part);
        }
        r.state = queue_[i].discard ? QStringLiteral("cancelled") : state;
        r.detail = detail;
        r.path = path;
        if (state == QLatin1String("done")) {
          r.doneBytes = r.totalBytes;
          for (int q = 0; q < quants_.count(); ++q) {
            HubQuantRow row = quants_.rows()[static_cast<size_t>(q)];
            if (r.repo == repo_ && row.label == r.label && !row.cached) {
              row.cached = true;
              row.cachedPath = r.path;
              quants_.setRow(q, row);
            }
          }
        }
        r.bytesPerSecond = 0;
        downloads_.setRow(static_cast<int>(i), r);
        if (state == QLatin1String("failed")) errors_.report(detail);
        active_download_ = -1;
        startNextDownload();
      }, Qt::QueuedConnection);
    });
    return;
  }
}

void HubController::pause(int row) {
  if (row < 0 || row >= static_cast<int>(queue_.size())) return;
  HubDownloadRow r = downloads_.rows()[static_cast<size_t>(row)];
  if (r.state == QLatin1String("done") || r.state == QLatin1String("cancelled")) return;
  queue_[static_cast<size_t>(row)].stop->store(true);
  r.state = QStringLiteral("paused");
  r.bytesPerSecond = 0;
  downloads_.setRow(row, r);
}

void HubController::resume(int row) {
  if (row < 0 || row >= static_cast<int>(queue_.size())) return;
  HubDownloadRow r = downloads_.rows()[static_cast<size_t>(row)];
  if (r.state != QLatin1String("paused") && r.state != QLatin1String("failed")) return;
  r.state = QStringLiteral("queued");
  downloads_.setRow(row, r);
  startNextDownload();
}

void HubController::cancel(int row) {
  if (row < 0 || row >= static_cast<int>(queue_.size())) return;
  Queued& q = queue_[static_cast<size_t>(row)];
  HubDownloadRow r = downloads_.rows()[static_cast<size_t>(row)];
  if (r.state == QLatin1String("done")) return;
  q.discard = true;
  q.stop->store(true);
  if (row != active_download_) {  // nothing runs for it: drop what it left now
    const hub::HubClient client(settingsWithToken(token()));
    const hub::Downloader downloader(client, hub::HubCache(client.settings().cache_dir));
    for (const hub::RepoFile& part : q.model->parts) downloader.discard_partial(q.repo, part);
  }
  r.state = QStringLiteral("cancelled");
  r.bytesPerSecond = 0;
  downloads_.setRow(row, r);
}

void HubController::load(int row) {
  if (row < 0 || row >= downloads_.count()) return;
  const HubDownloadRow& r = downloads_.rows()[static_cast<size_t>(row)];
  if (r.state == QLatin1String("done") && !r.path.isEmpty()) model_.previewFile(r.path);
}

void HubController::loadCached(int row) {
  if (row < 0 || row >= quants_.count()) return;
  const HubQuantRow& q = quants_.rows()[static_cast<size_t>(row)];
  if (q.cached && !q.cachedPath.isEmpty()) model_.previewFile(q.cachedPath);
}

void HubController::readTokenFromKeychain() {
  auto* job = new QKeychain::ReadPasswordJob(kKeychainService, this);
  job->setKey(kKeychainKey);
  connect(job, &QKeychain::Job::finished, this, [this, job] {
    if (job->error() == QKeychain::NoError && !job->textData().isEmpty()) {
      std::lock_guard lock(token_mutex_);
      token_ = job->textData().toStdString();
      token_source_ = QStringLiteral("keychain");
    }
    Q_EMIT tokenChanged();
  });
  job->start();
}

void HubController::setToken(const QString& token_text) {
  const QString token = token_text.trimmed();
  if (token.isEmpty()) return forgetToken();
  {
    std::lock_guard lock(token_mutex_);
    token_ = token.toStdString();
  }
  auto* job = new QKeychain::WritePasswordJob(kKeychainService, this);
  job->setKey(kKeychainKey);
  job->setTextData(token);
  connect(job, &QKeychain::Job::finished, this, [this, job] {
    // Without a keychain (no Secret Service running) the token is kept for this session
    // only: never written to a file.
    token_source_ = job->error() == QKeychain::NoError ? QStringLiteral("keychain") : QStringLiteral("session");
    if (job->error() != QKeychain::NoError)
      setStatus(tr("No system keychain (%1): the token is kept until Granule closes.").arg(job->errorString()));
    Q_EMIT tokenChanged();
  });
  job->start();
}

void HubController::forgetToken() {
  {
    std::lock_guard lock(token_mutex_);
    token_.clear();
  }
  token_source_ = QStringLiteral("none");
  auto* job = new QKeychain::DeletePasswordJob(kKeychainService, this);
  job->setKey(kKeychainKey);
  job->start();
  Q_EMIT tokenChanged();
}

#else  // no Hub client in this build

void HubController::search(const QString&, bool) { setStatus(tr("This build has no Hub client (libcurl).")); }
void HubController::openRepo(const QString&) { search({}, false); }
void HubController::download(int) {}
void HubController::startNextDownload() {}
void HubController::pause(int) {}
void HubController::resume(int) {}
void HubController::cancel(int) {}
void HubController::load(int) {}
void HubController::loadCached(int) {}
void HubController::readTokenFromKeychain() {}
void HubController::setToken(const QString&) {}
void HubController::forgetToken() {}

#endif

}  // namespace granule::app
