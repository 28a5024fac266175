// Model choice, fit preview and loading, on the GUI side.
#include "model_controller.h"

#include <QDir>
#include <QFileInfo>
#include <QLocale>
#include <algorithm>

#include "model_inspector.h"

namespace granule::app {

ModelController::ModelController(ErrorReporter& errors, QObject* parent)
    : QObject(parent), errors_(errors), default_model_path_(findDefaultModelPath()) {
  library_.setFolders({defaultModelsFolderPath()});
}

QString ModelController::defaultModelsFolderPath() {
  QString data = qEnvironmentVariable("XDG_DATA_HOME");
  if (data.isEmpty()) data = QDir::homePath() + QStringLiteral("/.local/share");
  return data + QStringLiteral("/granule/models");
}

void ModelController::setModelsFolder(const QString& folder) {
  const QString cleaned = folder.isEmpty() ? QString() : QDir::cleanPath(folder);
  if (cleaned == models_folder_) return;
  models_folder_ = cleaned;
  QStringList folders{defaultModelsFolderPath()};
  if (!models_folder_.isEmpty() && QDir(models_folder_) != QDir(folders.first()))
    folders.append(models_folder_);
  library_.setFolders(folders);
  Q_EMIT optionsChanged();
}

void ModelController::setModelsFolderUrl(const QUrl& folder) {
  setModelsFolder(folder.isLocalFile() ? folder.toLocalFile() : folder.toString());
  refreshLibrary();
}

QUrl ModelController::modelsFolderUrl() const {
  const QString folder = !models_folder_.isEmpty() && QDir(models_folder_).exists()
                             ? models_folder_
                             : defaultModelsFolderPath();
  return QUrl::fromLocalFile(QDir(folder).exists() ? folder : QDir::homePath());
}

void ModelController::refreshLibrary() {
  library_.refresh(context_length_, max_chats_, vram_budget_bytes_);
}

void ModelController::setCpuThreads(int threads) {
  threads = std::clamp(threads, 0, 256);
  if (threads == cpu_threads_) return;
  cpu_threads_ = threads;
  Q_EMIT cpuThreadsRequested(threads);
  Q_EMIT optionsChanged();
}

bool ModelController::reloadNeeded() const {
  if (loaded_.path.isEmpty()) return false;
  return loaded_context_length_ != context_length_ || loaded_max_chats_ != max_chats_ ||
         loaded_cpu_threads_ != cpu_threads_;
}

void ModelController::reload() {
  if (loaded_.path.isEmpty() || status_ == Status::Loading) return;
  load(loaded_.path);
}

QString ModelController::findDefaultModelPath() {
  const QString from_env = qEnvironmentVariable("GRANULE_DEFAULT_MODEL");
  if (!from_env.isEmpty()) return from_env;
  QString data = qEnvironmentVariable("XDG_DATA_HOME");
  if (data.isEmpty()) data = QDir::homePath() + QStringLiteral("/.local/share");
  return data + QStringLiteral("/granule/models/SmolLM2-135M-Instruct.Q4_1.gguf");
}

bool ModelController::defaultModelPresent() const {
  return QFileInfo(default_model_path_).isFile();
}

QString ModelController::previewDetails() const {
  if (preview_info_.path.isEmpty()) return {};
  const QLocale c;
  const double params = static_cast<double>(preview_info_.parameters);
  const QString params_text = params >= 1e9 ? c.toString(params / 1e9, 'f', 1) + QStringLiteral("B")
                              : params >= 1e6
                                  ? c.toString(params / 1e6, 'f', 0) + QStringLiteral("M")
                                  : c.toString(params / 1e3, 'f', 0) + QStringLiteral("K");
  return QStringLiteral("%1 · %2 · %3 parameters · %4 layers · %5 trained context")
      .arg(preview_info_.architecture, preview_info_.block_type, params_text)
      .arg(preview_info_.layers)
      .arg(c.toString(preview_info_.trained_context));
}

double ModelController::fitKvBytes() const {
  // The sliding-window layers' KV counts up to the window only (FitEstimate::kv_bytes_per_chat).
  return static_cast<double>(fit_.kv_bytes_per_chat(fit_.context_per_chat)) * fit_.chats;
}

void ModelController::setContextLength(int tokens) {
  tokens = std::clamp(tokens, 256, 1 << 20);
  if (tokens == context_length_) return;
  context_length_ = tokens;
  Q_EMIT optionsChanged();
  refreshPreview();
}

void ModelController::setMaxChats(int chats) {
  chats = std::clamp(chats, 1, 64);
  if (chats == max_chats_) return;
  max_chats_ = chats;
  Q_EMIT optionsChanged();
  refreshPreview();
}

QList<int> ModelController::fitLayerStreamed() const {
  QList<int> streamed;
  for (bool s : fit_.layer_streamed) streamed.append(s ? 1 : 0);
  return streamed;
}

int ModelController::fitFewestExpertsInALayer() const {
  const auto& counts = fit_.experts.resident_per_layer;
  return counts.empty() ? 0 : *std::min_element(counts.begin(), counts.end());
}

int ModelController::fitMostExpertsInALayer() const {
  const auto& counts = fit_.experts.resident_per_layer;
  return counts.empty() ? 0 : *std::max_element(counts.begin(), counts.end());
}

void ModelController::setVramBudgetBytes(double bytes) {
  const quint64 value = bytes > 0 ? static_cast<quint64>(bytes) : 0;
  if (value == vram_budget_bytes_) return;
  vram_budget_bytes_ = value;
  Q_EMIT optionsChanged();
  refreshPreview();
  // "Auto" (0) cannot be applied to a running engine: it is the free memory at open.
  if (status_ == Status::Ready && value > 0 && value != budget_in_force_)
    Q_EMIT vramBudgetRequested(value);
}

void ModelController::onBudgetApplied(quint64 bytes) { budget_in_force_ = bytes; }

void ModelController::onBudgetRefused(quint64 bytes, const QString& error) {
  if (vram_budget_bytes_ == bytes) {
    vram_budget_bytes_ = budget_in_force_;
    Q_EMIT optionsChanged();
  }
  errors_.report(error,
                 budget_in_force_ > 0
                     ? QStringLiteral("The budget stays at %1.").arg(formatBytes(budget_in_force_))
                     : QStringLiteral("The budget stays as it was."));
}

void ModelController::preview(const QUrl& file) {
  previewFile(file.isLocalFile() ? file.toLocalFile() : file.toString());
}

void ModelController::previewFile(const QString& path) {
  if (status_ == Status::Loading) return;
  setStatus(Status::Inspecting);
  Q_EMIT inspectRequested(path, context_length_, max_chats_, vram_budget_bytes_);
}

void ModelController::confirmLoad() {
  if (status_ != Status::Previewing) return;
  load(preview_info_.path);
}

void ModelController::cancelPreview() {
  if (status_ != Status::Previewing && status_ != Status::Inspecting) return;
  preview_info_ = {};
  fit_ = {};
  fit_summary_.clear();
  Q_EMIT previewChanged();
  setStatus(restingStatus());
}

void ModelController::load(const QString& path) {
  if (status_ == Status::Loading) return;
  load_progress_ = 0;
  loading_context_length_ = context_length_;
  loading_max_chats_ = max_chats_;
  loading_cpu_threads_ = cpu_threads_;
  load_stage_ = QStringLiteral("Opening %1").arg(QFileInfo(path).fileName());
  Q_EMIT progressChanged();
  setStatus(Status::Loading);
  Q_EMIT loadRequested(path, context_length_, max_chats_, vram_budget_bytes_);
}

void ModelController::refreshPreview() {
  // The dialog stays open while the estimate for the new context or chat count comes back.
  if (status_ == Status::Previewing)
    Q_EMIT inspectRequested(preview_info_.path, context_length_, max_chats_, vram_budget_bytes_);
}

void ModelController::onModelInspected(const ModelInfo& info, const FitEstimate& fit) {
  if (status_ != Status::Inspecting && status_ != Status::Previewing)
    return;  // cancelled meanwhile
  preview_info_ = info;
  fit_ = fit;
  fit_summary_ = granule::app::fitSummary(fit);
  Q_EMIT previewChanged();
  setStatus(Status::Previewing);
}

void ModelController::onInspectFailed(const QString& path, const QString& error) {
  setStatus(restingStatus());
  errors_.report(error, QStringLiteral("%1 could not be read; choose another GGUF file.")
                            .arg(QFileInfo(path).fileName()));
}

void ModelController::onLoadProgress(double fraction, const QString& stage) {
  load_progress_ = fraction;
  load_stage_ = stage;
  Q_EMIT progressChanged();
}

void ModelController::onModelLoaded(const ModelInfo& info) {
  loaded_ = info;
  budget_in_force_ = vram_budget_bytes_;
  loaded_context_length_ = loading_context_length_;
  loaded_max_chats_ = loading_max_chats_;
  loaded_cpu_threads_ = loading_cpu_threads_;
  preview_info_ = {};
  Q_EMIT infoChanged();
  Q_EMIT previewChanged();
  errors_.dismiss();
  setStatus(Status::Ready);
  Q_EMIT optionsChanged();  // reloadNeeded
  Q_EMIT modelLoadedFrom(info.path);
}

void ModelController::onLoadFailed(const QString& path, const QString& error) {
  // Loading replaced the previous engine, so nothing is loaded now.
  loaded_ = {};
  Q_EMIT infoChanged();
  setStatus(Status::NoModel);
  errors_.report(
      error,
      QStringLiteral("%1 did not load; open another model.").arg(QFileInfo(path).fileName()));
}

void ModelController::setStatus(Status status) {
  if (status_ == status) return;
  status_ = status;
  Q_EMIT statusChanged();
}

}  // namespace granule::app
