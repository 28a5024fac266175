// ModelController: which model is loaded and the way to another one — the file's facts,
// the fit preview shown before loading, load progress, and load errors to the banner.
// GUI thread only; the work happens in the EngineWorker.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QObject>
#include <QUrl>

#include "error_reporter.h"
#include "model_library.h"
#include "worker_types.h"

namespace granule::app {

class ModelController : public QObject {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("Created by the application")
  Q_PROPERTY(Status status READ status NOTIFY statusChanged)
  Q_PROPERTY(bool ready READ ready NOTIFY statusChanged)
  Q_PROPERTY(QString modelName READ modelName NOTIFY infoChanged)
  Q_PROPERTY(QString modelPath READ modelPath NOTIFY infoChanged)
  Q_PROPERTY(QString architecture READ architecture NOTIFY infoChanged)
  Q_PROPERTY(QString blockType READ blockType NOTIFY infoChanged)
  Q_PROPERTY(QString device READ device NOTIFY infoChanged)
  Q_PROPERTY(QString chatTemplate READ chatTemplate NOTIFY infoChanged)
  // How the loaded model reasons: "think" (on/off), "harmony" (an effort), "" (it does not).
  Q_PROPERTY(QString reasoningFormat READ reasoningFormat NOTIFY infoChanged)
  Q_PROPERTY(double fileBytes READ fileBytes NOTIFY infoChanged)
  Q_PROPERTY(double parameters READ parameters NOTIFY infoChanged)
  Q_PROPERTY(int layers READ layers NOTIFY infoChanged)
  Q_PROPERTY(int trainedContext READ trainedContext NOTIFY infoChanged)
  Q_PROPERTY(int contextPerChat READ contextPerChat NOTIFY infoChanged)
  // The fit preview of the file being considered.
  Q_PROPERTY(QString previewName READ previewName NOTIFY previewChanged)
  Q_PROPERTY(QString previewPath READ previewPath NOTIFY previewChanged)
  Q_PROPERTY(QString previewDetails READ previewDetails NOTIFY previewChanged)
  Q_PROPERTY(QString fitSummary READ fitSummary NOTIFY previewChanged)
  Q_PROPERTY(bool fits READ fits NOTIFY previewChanged)
  Q_PROPERTY(double fitWeightsBytes READ fitWeightsBytes NOTIFY previewChanged)
  Q_PROPERTY(double fitKvBytes READ fitKvBytes NOTIFY previewChanged)
  Q_PROPERTY(double fitBudgetBytes READ fitBudgetBytes NOTIFY previewChanged)
  // The preview's placement plan: which layers stay in device memory, which stream.
  Q_PROPERTY(bool fitGpu READ fitGpu NOTIFY previewChanged)
  Q_PROPERTY(bool fitLoads READ fitLoads NOTIFY previewChanged)
  Q_PROPERTY(double fitMinimumBudgetBytes READ fitMinimumBudgetBytes NOTIFY previewChanged)
  Q_PROPERTY(int fitResidentLayers READ fitResidentLayers NOTIFY previewChanged)
  Q_PROPERTY(int fitStreamedLayers READ fitStreamedLayers NOTIFY previewChanged)
  // The host's CPU computes part of the streamed layers' rows at small batches.
  Q_PROPERTY(bool fitHostRows READ fitHostRows NOTIFY previewChanged)
  Q_PROPERTY(QList<int> fitLayerStreamed READ fitLayerStreamed NOTIFY previewChanged)
  Q_PROPERTY(double fitStreamedBytesPerPass READ fitStreamedBytesPerPass NOTIFY previewChanged)
  Q_PROPERTY(double fitStagingBytes READ fitStagingBytes NOTIFY previewChanged)
  Q_PROPERTY(double fitKvCapacityTokens READ fitKvCapacityTokens NOTIFY previewChanged)
  Q_PROPERTY(double fitMaxContextPerChat READ fitMaxContextPerChat NOTIFY previewChanged)
  Q_PROPERTY(double fitH2dBytesPerSecond READ fitH2dBytesPerSecond NOTIFY previewChanged)
  Q_PROPERTY(bool fitH2dMeasured READ fitH2dMeasured NOTIFY previewChanged)
  Q_PROPERTY(double fitPcieTokensPerSecond READ fitPcieTokensPerSecond NOTIFY previewChanged)
  // A mixture of experts' plan (FitEstimate::experts): experts per layer (0: a dense model),
  // top-k, what stays resident whatever the budget, one expert's bytes, the experts the
  // budget holds (fewest and most in a layer) and the expert bytes a token reads over PCIe.
  Q_PROPERTY(int fitExpertsPerLayer READ fitExpertsPerLayer NOTIFY previewChanged)
  Q_PROPERTY(int fitExpertsUsed READ fitExpertsUsed NOTIFY previewChanged)
  Q_PROPERTY(double fitAlwaysResidentBytes READ fitAlwaysResidentBytes NOTIFY previewChanged)
  Q_PROPERTY(double fitExpertBytes READ fitExpertBytes NOTIFY previewChanged)
  Q_PROPERTY(int fitResidentExperts READ fitResidentExperts NOTIFY previewChanged)
  Q_PROPERTY(int fitTotalExperts READ fitTotalExperts NOTIFY previewChanged)
  Q_PROPERTY(int fitFewestExpertsInALayer READ fitFewestExpertsInALayer NOTIFY previewChanged)
  Q_PROPERTY(int fitMostExpertsInALayer READ fitMostExpertsInALayer NOTIFY previewChanged)
  Q_PROPERTY(
      double fitExpertPcieBytesPerToken READ fitExpertPcieBytesPerToken NOTIFY previewChanged)
  // 256ths of batch 1's missed experts the host's CPU computes (0: none).
  Q_PROPERTY(int fitExpertHostShare READ fitExpertHostShare NOTIFY previewChanged)
  Q_PROPERTY(bool fitCpuInt8Experts READ fitCpuInt8Experts NOTIFY previewChanged)
  Q_PROPERTY(double loadProgress READ loadProgress NOTIFY progressChanged)
  Q_PROPERTY(QString loadStage READ loadStage NOTIFY progressChanged)
  Q_PROPERTY(QString defaultModelPath READ defaultModelPath CONSTANT)
  Q_PROPERTY(bool defaultModelPresent READ defaultModelPresent CONSTANT)
  Q_PROPERTY(int contextLength READ contextLength WRITE setContextLength NOTIFY optionsChanged)
  Q_PROPERTY(int maxChats READ maxChats WRITE setMaxChats NOTIFY optionsChanged)
  // The VRAM budget in bytes, 0 for the engine's choice (free memory minus a margin). Passed
  // to every load; a change while a model is loaded is applied to it between steps.
  Q_PROPERTY(
      double vramBudgetBytes READ vramBudgetBytes WRITE setVramBudgetBytes NOTIFY optionsChanged)
  // The loaded model's weights and the least budget its plan can run in (for the budget
  // control's scale); 0 before a model is loaded.
  Q_PROPERTY(double weightsBytes READ weightsBytes NOTIFY infoChanged)
  Q_PROPERTY(double minimumBudgetBytes READ minimumBudgetBytes NOTIFY infoChanged)
  // CPU threads for the next load, 0 for every core.
  Q_PROPERTY(int cpuThreads READ cpuThreads WRITE setCpuThreads NOTIFY optionsChanged)
  // The loaded model runs with other context, chats or threads than the settings say: a
  // reload applies them.
  Q_PROPERTY(bool reloadNeeded READ reloadNeeded NOTIFY optionsChanged)
  // The models page: the GGUF files in the default folder and the chosen one.
  Q_PROPERTY(granule::app::ModelLibrary* library READ library CONSTANT)
  Q_PROPERTY(QString defaultModelsFolder READ defaultModelsFolder CONSTANT)
  Q_PROPERTY(QString modelsFolder READ modelsFolder WRITE setModelsFolder NOTIFY optionsChanged)
  // Where the open dialog starts: the chosen models folder, else the default one.
  Q_PROPERTY(QUrl modelsFolderUrl READ modelsFolderUrl NOTIFY optionsChanged)

 public:
  enum class Status { NoModel, Inspecting, Previewing, Loading, Ready };
  Q_ENUM(Status)

  explicit ModelController(ErrorReporter& errors, QObject* parent = nullptr);

  // $GRANULE_DEFAULT_MODEL, else $XDG_DATA_HOME (~/.local/share)/granule/models/SmolLM2-….gguf.
  static QString findDefaultModelPath();

  Status status() const { return status_; }
  // A model is loaded and answers; previewing another file's fit leaves it so.
  bool ready() const { return !loaded_.path.isEmpty() && status_ != Status::Loading; }
  QString modelName() const { return loaded_.name; }
  QString modelPath() const { return loaded_.path; }
  QString architecture() const { return loaded_.architecture; }
  QString blockType() const { return loaded_.block_type; }
  QString device() const { return loaded_.device; }
  QString chatTemplate() const { return loaded_.chat_template; }
  QString reasoningFormat() const { return loaded_.reasoning_format; }
  double fileBytes() const { return static_cast<double>(loaded_.file_bytes); }
  double parameters() const { return static_cast<double>(loaded_.parameters); }
  int layers() const { return static_cast<int>(loaded_.layers); }
  int trainedContext() const { return static_cast<int>(loaded_.trained_context); }
  int contextPerChat() const { return static_cast<int>(loaded_.engine_context); }
  QString previewName() const { return preview_info_.name; }
  QString previewPath() const { return preview_info_.path; }
  QString previewDetails() const;
  QString fitSummary() const { return fit_summary_; }
  bool fits() const { return fit_.fits; }
  double fitWeightsBytes() const { return static_cast<double>(fit_.weights_bytes); }
  double fitKvBytes() const;
  double fitBudgetBytes() const { return static_cast<double>(fit_.budget_bytes); }
  bool fitGpu() const { return fit_.gpu; }
  bool fitLoads() const { return fit_.loads; }
  double fitMinimumBudgetBytes() const { return static_cast<double>(fit_.minimum_budget_bytes); }
  int fitResidentLayers() const { return fit_.resident_layers; }
  int fitStreamedLayers() const { return fit_.streamed_layers; }
  bool fitHostRows() const { return fit_.host_rows; }
  QList<int> fitLayerStreamed() const;
  double fitStreamedBytesPerPass() const {
    return static_cast<double>(fit_.streamed_bytes_per_pass);
  }
  double fitStagingBytes() const { return static_cast<double>(fit_.staging_bytes); }
  double fitKvCapacityTokens() const { return static_cast<double>(fit_.kv_capacity_tokens); }
  double fitMaxContextPerChat() const { return static_cast<double>(fit_.max_context_per_chat); }
  double fitH2dBytesPerSecond() const { return fit_.h2d_bytes_per_second; }
  bool fitH2dMeasured() const { return fit_.h2d_measured; }
  double fitPcieTokensPerSecond() const { return fit_.pcie_tokens_per_second; }
  int fitExpertsPerLayer() const { return static_cast<int>(fit_.experts.n_expert); }
  int fitExpertsUsed() const { return static_cast<int>(fit_.experts.n_expert_used); }
  double fitAlwaysResidentBytes() const {
    return static_cast<double>(fit_.experts.always_resident_bytes);
  }
  double fitExpertBytes() const { return static_cast<double>(fit_.experts.expert_bytes); }
  int fitResidentExperts() const { return static_cast<int>(fit_.experts.resident_experts); }
  int fitTotalExperts() const {
    return static_cast<int>(fit_.experts.n_expert) *
           static_cast<int>(fit_.experts.resident_per_layer.size());
  }
  int fitFewestExpertsInALayer() const;
  int fitMostExpertsInALayer() const;
  double fitExpertPcieBytesPerToken() const { return fit_.experts.pcie_bytes_per_token; }
  int fitExpertHostShare() const { return fit_.experts.host_share; }
  // The CPU: the experts on int8 copies (true) or on the exact f32 path (ExpertFitEstimate).
  bool fitCpuInt8Experts() const { return fit_.experts.cpu_int8_experts; }
  double loadProgress() const { return load_progress_; }
  QString loadStage() const { return load_stage_; }
  QString defaultModelPath() const { return default_model_path_; }
  bool defaultModelPresent() const;
  int contextLength() const { return context_length_; }
  void setContextLength(int tokens);
  int maxChats() const { return max_chats_; }
  void setMaxChats(int chats);
  double vramBudgetBytes() const { return static_cast<double>(vram_budget_bytes_); }
  void setVramBudgetBytes(double bytes);
  double weightsBytes() const { return static_cast<double>(loaded_.weights_bytes); }
  double minimumBudgetBytes() const { return static_cast<double>(loaded_.minimum_budget_bytes); }
  int cpuThreads() const { return cpu_threads_; }
  void setCpuThreads(int threads);
  bool reloadNeeded() const;
  ModelLibrary* library() { return &library_; }
  static QString defaultModelsFolderPath();
  QString defaultModelsFolder() const { return defaultModelsFolderPath(); }
  QString modelsFolder() const { return models_folder_; }
  void setModelsFolder(const QString& folder);
  QUrl modelsFolderUrl() const;

  // Shows the fit preview for a file (from the file dialog's URL or a path).
  Q_INVOKABLE void preview(const QUrl& file);
  Q_INVOKABLE void previewFile(const QString& path);
  // Loads the previewed file.
  Q_INVOKABLE void confirmLoad();
  Q_INVOKABLE void cancelPreview();
  // Loads without a preview (the default or last model at start).
  Q_INVOKABLE void load(const QString& path);
  // Loads the loaded model again with the settings' context, chats and threads.
  Q_INVOKABLE void reload();
  // Lists the models folders again, with fits for the current settings.
  Q_INVOKABLE void refreshLibrary();
  // A folder from the folder dialog (URL) or a path.
  Q_INVOKABLE void setModelsFolderUrl(const QUrl& folder);

 Q_SIGNALS:
  void statusChanged();
  void infoChanged();
  void previewChanged();
  void progressChanged();
  void optionsChanged();
  void modelLoadedFrom(const QString& path);
  // To the worker (queued).
  void inspectRequested(const QString& path, qint64 context_length, qint32 chats,
                        quint64 vram_budget_bytes);
  void loadRequested(const QString& path, qint64 context_length, qint32 chats,
                     quint64 vram_budget_bytes);
  void vramBudgetRequested(quint64 bytes);
  void cpuThreadsRequested(qint32 threads);

 public Q_SLOTS:
  void onModelInspected(const granule::app::ModelInfo& info, const granule::FitEstimate& fit);
  void onInspectFailed(const QString& path, const QString& error);
  void onLoadProgress(double fraction, const QString& stage);
  void onModelLoaded(const granule::app::ModelInfo& info);
  void onLoadFailed(const QString& path, const QString& error);
  void onBudgetApplied(quint64 bytes);
  // The engine kept its budget: the setting goes back to the one in force, and the banner
  // shows the engine's reason.
  void onBudgetRefused(quint64 bytes, const QString& error);

 private:
  void setStatus(Status status);
  void refreshPreview();
  // After a failed preview or load: back to the loaded model, or to none.
  Status restingStatus() const { return loaded_.path.isEmpty() ? Status::NoModel : Status::Ready; }

  ErrorReporter& errors_;
  Status status_ = Status::NoModel;
  ModelInfo loaded_;
  ModelInfo preview_info_;
  FitEstimate fit_;
  QString fit_summary_;
  double load_progress_ = 0;
  QString load_stage_;
  QString default_model_path_;
  int context_length_ = 4096;
  int max_chats_ = 8;
  quint64 vram_budget_bytes_ = 0;
  quint64 budget_in_force_ = 0;  // what the loaded engine runs with (0: its own choice)
  int cpu_threads_ = 0;
  // The options the loaded model was loaded with (reloadNeeded compares them).
  int loaded_context_length_ = 0;
  int loaded_max_chats_ = 0;
  int loaded_cpu_threads_ = 0;
  int loading_context_length_ = 0;
  int loading_max_chats_ = 0;
  int loading_cpu_threads_ = 0;
  QString models_folder_;
  ModelLibrary library_;
};

}  // namespace granule::app
