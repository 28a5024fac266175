// The models folders' GGUF files and their fit, read off the GUI thread.
#include "model_library.h"

#include <QDir>
#include <QFileInfo>
#include <QLocale>
#include <QPointer>
#include <QThread>
#include <filesystem>

#include "granule/engine.h"
#include "model_inspector.h"

namespace granule::app {

// No display role: a library row is shown through its roles.
ModelLibrary::ModelLibrary(QObject* parent) : ListModel(Qt::DisplayRole, parent) {}

ModelLibrary::~ModelLibrary() {
  if (thread_) {
    thread_->requestInterruption();
    thread_->wait();
  }
}

QVariant ModelLibrary::value(int row, int role) const {
  const LocalModel& m = models_[static_cast<size_t>(row)];
  switch (role) {
    case PathRole:
      return m.path;
    case NameRole:
      return m.name;
    case FileNameRole:
      return m.file_name;
    case FileBytesRole:
      return static_cast<double>(m.file_bytes);
    case BlockTypeRole:
      return m.block_type;
    case ArchitectureRole:
      return m.architecture;
    case ParametersRole:
      return m.parameters;
    case ReadableRole:
      return m.readable;
    case FitsRole:
      return m.fits;
    case LoadsRole:
      return m.loads;
    case FitTextRole:
      return m.fit_text;
    case DetailsRole: {
      QStringList parts{m.file_name, formatBytes(static_cast<quint64>(m.file_bytes))};
      if (!m.block_type.isEmpty()) parts.append(m.block_type);
      if (!m.architecture.isEmpty()) parts.append(m.architecture);
      return parts.join(QStringLiteral("  ·  "));
    }
    default:
      return {};
  }
}

void ModelLibrary::setFolders(const QStringList& folders) {
  if (folders == folders_) return;
  folders_ = folders;
  Q_EMIT foldersChanged();
}

QStringList ModelLibrary::findModelFiles(const QStringList& folders) {
  QStringList files;
  for (const QString& folder : folders) {
    const QFileInfoList entries =
        QDir(folder).entryInfoList({QStringLiteral("*.gguf"), QStringLiteral("*.GGUF")},
                                   QDir::Files | QDir::Readable, QDir::Name | QDir::IgnoreCase);
    for (const QFileInfo& entry : entries) {
      const QString path = entry.canonicalFilePath();
      if (!files.contains(path)) files.append(path);
    }
  }
  return files;
}

// What the file system says about a model file: its path, names and size.
LocalModel ModelLibrary::fileFacts(const QString& path) {
  LocalModel m;
  const QFileInfo file(path);
  m.path = path;
  m.file_name = file.fileName();
  m.name = file.completeBaseName();
  m.file_bytes = file.size();
  return m;
}

LocalModel ModelLibrary::inspect(const QString& path, qint64 context_length, qint32 chats,
                                 quint64 vram_budget_bytes) {
  LocalModel m = fileFacts(path);
  try {
    EngineOptions options;
    options.context_length = context_length;
    options.max_sequences = chats;
    options.vram_budget_bytes = vram_budget_bytes;
    const FitEstimate fit = Engine::estimate(std::filesystem::path(path.toStdString()), options);
    if (!fit.config.name.empty()) m.name = QString::fromStdString(fit.config.name);
    m.block_type = QString::fromStdString(fit.block_type);
    m.architecture = QString::fromStdString(fit.config.architecture);
    m.parameters = static_cast<double>(fit.parameters);
    m.readable = true;
    m.fits = fit.fits;
    m.loads = fit.loads;
    if (!fit.loads)
      m.fit_text = QStringLiteral("does not load");
    else if (fit.streamed_layers > 0)
      m.fit_text = QStringLiteral("%1 of %2 layers streamed")
                       .arg(fit.streamed_layers)
                       .arg(fit.resident_layers + fit.streamed_layers);
    else if (fit.fits)
      m.fit_text = QStringLiteral("fits");
    else
      m.fit_text = QStringLiteral("fits %1 tokens per chat")
                       .arg(QLocale().toString(static_cast<qint64>(fit.max_context_per_chat)));
  } catch (const std::exception& e) {
    m.fit_text = QString::fromUtf8(e.what());
  }
  return m;
}

void ModelLibrary::refresh(qint64 context_length, qint32 chats, quint64 vram_budget_bytes) {
  const quint64 generation = ++generation_;
  const QStringList files = findModelFiles(folders_);
  beginResetModel();
  models_.clear();
  for (const QString& path : files) {
    LocalModel m = fileFacts(path);
    m.fit_text = QStringLiteral("reading…");
    models_.push_back(m);
  }
  endResetModel();
  Q_EMIT countChanged();
  if (files.isEmpty()) return;

  if (thread_) {  // an older scan: let it end, its results are dropped by generation
    thread_->requestInterruption();
    thread_->wait();
    delete thread_;
    thread_ = nullptr;
  }
  scanning_ = true;
  Q_EMIT scanningChanged();
  QPointer<ModelLibrary> self(this);
  thread_ = QThread::create([self, files, generation, context_length, chats, vram_budget_bytes] {
    for (const QString& path : files) {
      if (QThread::currentThread()->isInterruptionRequested()) return;
      const LocalModel m = inspect(path, context_length, chats, vram_budget_bytes);
      QMetaObject::invokeMethod(
          self.data(),
          [self, generation, m] {
            if (self) self->onInspected(generation, m);
          },
          Qt::QueuedConnection);
    }
    QMetaObject::invokeMethod(
        self.data(),
        [self, generation] {
          if (self) self->onScanDone(generation);
        },
        Qt::QueuedConnection);
  });
  thread_->start();
}

void ModelLibrary::onInspected(quint64 generation, const LocalModel& model) {
  if (generation != generation_) return;
  for (size_t i = 0; i < models_.size(); ++i) {
    if (models_[i].path != model.path) continue;
    models_[i] = model;
    const QModelIndex at = index(static_cast<int>(i));
    Q_EMIT dataChanged(at, at);
    return;
  }
}

void ModelLibrary::onScanDone(quint64 generation) {
  if (generation != generation_) return;
  scanning_ = false;
  Q_EMIT scanningChanged();
}

}  // namespace granule::app
