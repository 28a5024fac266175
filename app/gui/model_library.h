// ModelLibrary: the GGUF files in the models folders (the default one under the data
// directory and the one chosen in the settings), each with its name, size, block type and
// how it fits (Engine::estimate), for the models page. Files are read on a helper thread;
// the list lives on the GUI thread.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QStringList>
#include <vector>

#include "list_model.h"

namespace granule::app {

struct LocalModel {
  QString path;
  QString name;  // from the GGUF's metadata, else the file name
  QString file_name;
  qint64 file_bytes = 0;
  QString block_type;  // "" until read, or when the file could not be read
  QString architecture;
  double parameters = 0;
  bool readable = false;
  bool fits = false;
  bool loads = false;
  QString fit_text;  // "fits", "7 of 30 layers streamed", "does not load", or the error
};

class ModelLibrary : public granule::app::ListModel {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("Owned by the ModelController")
  Q_PROPERTY(bool scanning READ scanning NOTIFY scanningChanged)
  Q_PROPERTY(QStringList folders READ folders NOTIFY foldersChanged)
  // The folders as one line: "/a and /b".
  Q_PROPERTY(QString foldersText READ foldersText NOTIFY foldersChanged)

 public:
  enum Role {
    PathRole = Qt::UserRole + 1,
    NameRole,
    FileNameRole,
    FileBytesRole,
    BlockTypeRole,
    ArchitectureRole,
    ParametersRole,
    ReadableRole,
    FitsRole,
    LoadsRole,
    FitTextRole,
    DetailsRole,  // "name.gguf · 93.8 MiB · Q4_1 · llama"
  };
  Q_ENUM(Role)

  explicit ModelLibrary(QObject* parent = nullptr);
  ~ModelLibrary() override;

  bool scanning() const { return scanning_; }
  QStringList folders() const { return folders_; }
  QString foldersText() const { return folders_.join(QStringLiteral(" and ")); }
  void setFolders(const QStringList& folders);
  const std::vector<LocalModel>& models() const { return models_; }

  // Lists the folders' *.gguf now (names and sizes) and reads each file's facts and fit for
  // these engine options on a helper thread; rows fill in as they come.
  void refresh(qint64 context_length, qint32 chats, quint64 vram_budget_bytes);

  // The GGUF files directly in `folders`, sorted by name, without duplicates.
  static QStringList findModelFiles(const QStringList& folders);
  // A file's path, names and size (the rest unknown yet).
  static LocalModel fileFacts(const QString& path);
  // Reads one file's facts and fit (blocking; the helper thread calls it).
  static LocalModel inspect(const QString& path, qint64 context_length, qint32 chats,
                            quint64 vram_budget_bytes);

 Q_SIGNALS:
  void scanningChanged();
  void foldersChanged();

 private:
  int itemCount() const override { return static_cast<int>(models_.size()); }
  QVariant value(int row, int role) const override;
  void onInspected(quint64 generation, const LocalModel& model);
  void onScanDone(quint64 generation);

  std::vector<LocalModel> models_;
  QStringList folders_;
  bool scanning_ = false;
  quint64 generation_ = 0;  // a newer refresh drops an older scan's results
  QThread* thread_ = nullptr;
};

}  // namespace granule::app
