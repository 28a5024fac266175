// The Hub page's list models: rows in, roles out.
#include "hub_models.h"

namespace granule::app {

void HubSearchModel::setRows(std::vector<HubRepoRow> rows) {
  beginResetModel();
  rows_ = std::move(rows);
  endResetModel();
  Q_EMIT countChanged();
}

QVariant HubSearchModel::value(int row, int role) const {
  const HubRepoRow& r = rows_[static_cast<size_t>(row)];
  switch (role) {
    case RepoRole: return r.repo;
    case DownloadsRole: return static_cast<double>(r.downloads);
    case UpdatedRole: return r.updated;
    case ArchitectureRole: return r.architecture;
    case SupportedRole: return r.supported;
    case GatedRole: return r.gated;
    default: return {};
  }
}

void HubQuantModel::setRows(std::vector<HubQuantRow> rows) {
  beginResetModel();
  rows_ = std::move(rows);
  endResetModel();
  Q_EMIT countChanged();
}

void HubQuantModel::setRow(int row, HubQuantRow value) {
  if (row < 0 || row >= static_cast<int>(rows_.size())) return;
  rows_[static_cast<size_t>(row)] = std::move(value);
  Q_EMIT dataChanged(index(row), index(row));
}

QVariant HubQuantModel::value(int row, int role) const {
  const HubQuantRow& r = rows_[static_cast<size_t>(row)];
  switch (role) {
    case LabelRole: return r.label;
    case FileNameRole: return r.fileName;
    case PartsRole: return r.parts;
    case SizeBytesRole: return r.sizeBytes;
    case BlockMixRole: return r.blockMix;
    case FitTextRole: return r.fitText;
    case StreamTextRole: return r.streamText;
    case FittedRole: return r.fitted;
    case FitsRole: return r.fits;
    case LoadsRole: return r.loads;
    case RecommendedRole: return r.recommended;
    case CachedRole: return r.cached;
    case HeaderBytesRole: return r.headerBytes;
    case ErrorRole: return r.error;
    default: return {};
  }
}

int HubDownloadModel::append(HubDownloadRow row) {
  const int at = static_cast<int>(rows_.size());
  beginInsertRows({}, at, at);
  rows_.push_back(std::move(row));
  endInsertRows();
  Q_EMIT countChanged();
  return at;
}

void HubDownloadModel::setRow(int row, HubDownloadRow value) {
  if (row < 0 || row >= static_cast<int>(rows_.size())) return;
  rows_[static_cast<size_t>(row)] = std::move(value);
  Q_EMIT dataChanged(index(row), index(row));
}

QVariant HubDownloadModel::value(int row, int role) const {
  const HubDownloadRow& r = rows_[static_cast<size_t>(row)];
  switch (role) {
    case RepoRole: return r.repo;
    case LabelRole: return r.label;
    case FileNameRole: return r.fileName;
    case DoneBytesRole: return r.doneBytes;
    case TotalBytesRole: return r.totalBytes;
    case BytesPerSecondRole: return r.bytesPerSecond;
    case EtaSecondsRole: return r.etaSeconds;
    case StateRole: return r.state;
    case DetailRole: return r.detail;
    case PathRole: return r.path;
    default: return {};
  }
}

}  // namespace granule::app
