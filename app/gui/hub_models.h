// The Hub page's three lists: search results, a repository's quants with their fit, and the
// download queue. Plain rows set by the HubController on the GUI thread.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QString>
#include <vector>

#include "list_model.h"

namespace granule::app {

struct HubRepoRow {
  QString repo;
  qint64 downloads = 0;
  QString updated;  // "2026-10-02"
  QString architecture;
  bool supported = false;
  bool gated = false;
};

class HubSearchModel : public granule::app::ListModel {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("Owned by the HubController")
 public:
  enum Role { RepoRole = Qt::UserRole + 1, DownloadsRole, UpdatedRole, ArchitectureRole, SupportedRole, GatedRole };
  Q_ENUM(Role)
  explicit HubSearchModel(QObject* parent = nullptr) : ListModel(RepoRole, parent) {}
  void setRows(std::vector<HubRepoRow> rows);
  const std::vector<HubRepoRow>& rows() const { return rows_; }

 protected:
  int itemCount() const override { return static_cast<int>(rows_.size()); }
  QVariant value(int row, int role) const override;

 private:
  std::vector<HubRepoRow> rows_;
};

struct HubQuantRow {
  QString label;      // "Q4_K_M"
  QString fileName;   // the first file
  int parts = 1;
  double sizeBytes = 0;
  QString blockMix;   // "Q4_K 60%, Q6_K 40%"
  QString fitText;    // "fits: 32/32 layers resident, KV for 21,253 tokens" or why not
  QString streamText; // what streaming costs when it does not fit whole
  bool fitted = false;  // the header was read
  bool fits = false;
  bool loads = false;
  bool recommended = false;
  bool cached = false;    // already in the cache (also when huggingface_hub put it there)
  QString cachedPath;     // the first file's snapshot path then
  double headerBytes = 0;  // fetched for the fit
  QString error;
};

class HubQuantModel : public granule::app::ListModel {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("Owned by the HubController")
 public:
  enum Role {
    LabelRole = Qt::UserRole + 1, FileNameRole, PartsRole, SizeBytesRole, BlockMixRole, FitTextRole,
    StreamTextRole, FittedRole, FitsRole, LoadsRole, RecommendedRole, CachedRole, HeaderBytesRole, ErrorRole
  };
  Q_ENUM(Role)
  explicit HubQuantModel(QObject* parent = nullptr) : ListModel(LabelRole, parent) {}
  void setRows(std::vector<HubQuantRow> rows);
  void setRow(int row, HubQuantRow value);
  const std::vector<HubQuantRow>& rows() const { return rows_; }

 protected:
  int itemCount() const override { return static_cast<int>(rows_.size()); }
  QVariant value(int row, int role) const override;

 private:
  std::vector<HubQuantRow> rows_;
};

struct HubDownloadRow {
  QString repo;
  QString label;
  QString fileName;  // the file in progress
  double doneBytes = 0;   // over every part
  double totalBytes = 0;
  double bytesPerSecond = 0;
  double etaSeconds = -1;
  QString state;  // "queued", "downloading", "paused", "verifying", "done", "failed", "cancelled"
  QString detail; // the error, or the Hub's wait
  QString path;   // when done: the first file's path in the cache
};

class HubDownloadModel : public granule::app::ListModel {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("Owned by the HubController")
 public:
  enum Role {
    RepoRole = Qt::UserRole + 1, LabelRole, FileNameRole, DoneBytesRole, TotalBytesRole,
    BytesPerSecondRole, EtaSecondsRole, StateRole, DetailRole, PathRole
  };
  Q_ENUM(Role)
  explicit HubDownloadModel(QObject* parent = nullptr) : ListModel(LabelRole, parent) {}
  int append(HubDownloadRow row);
  void setRow(int row, HubDownloadRow value);
  const std::vector<HubDownloadRow>& rows() const { return rows_; }

 protected:
  int itemCount() const override { return static_cast<int>(rows_.size()); }
  QVariant value(int row, int role) const override;

 private:
  std::vector<HubDownloadRow> rows_;
};

}  // namespace granule::app
