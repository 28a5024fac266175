// Registration of the worker's value types with Qt's meta-type system, and how a telemetry
// section's fields become the map QML reads.
#include "worker_types.h"

namespace granule::app {

const std::vector<MemoryCategory>& stackedLedgerCategories() {
  static const std::vector<MemoryCategory> stacked = [] {
    std::vector<MemoryCategory> categories;
    // Device memory only: reserved address space and pinned host memory are not VRAM.
    for (size_t c = 0; c < kMemoryCategoryCount; ++c)
      if (static_cast<MemoryCategory>(c) != MemoryCategory::KvReservedVa &&
          static_cast<MemoryCategory>(c) != MemoryCategory::HostPinned)
        categories.push_back(static_cast<MemoryCategory>(c));
    return categories;
  }();
  return stacked;
}

namespace detail {

QString camelCase(std::string_view snake) {
  QString name;
  bool upper = false;
  for (char c : snake) {
    if (c == '_') {
      upper = true;
      continue;
    }
    name += upper ? QChar::fromLatin1(c).toUpper() : QChar::fromLatin1(c);
    upper = false;
  }
  return name;
}

QVariant fieldValue(bool value) { return value; }
QVariant fieldValue(double value) { return value; }
QVariant fieldValue(const std::string& value) { return QString::fromStdString(value); }

QVariant fieldValue(const std::vector<int32_t>& value) {
  QVariantList list;
  for (int32_t v : value) list.append(v);
  return list;
}

QVariant fieldValue(const Ledger& value) {
  QVariantMap bytes;
  for (size_t c = 0; c < value.size(); ++c)
    bytes.insert(camelCase(memory_category_name(static_cast<MemoryCategory>(c))),
                 static_cast<double>(value[c]));
  return bytes;
}

}  // namespace detail

void registerWorkerTypes() {
  qRegisterMetaType<ModelInfo>();
  qRegisterMetaType<FitEstimate>();
  qRegisterMetaType<GenerationRequest>();
  qRegisterMetaType<GenerationResult>();
  qRegisterMetaType<TelemetryFrame>();
  qRegisterMetaType<TokenChunk>();
  qRegisterMetaType<QList<TokenChunk>>();
  qRegisterMetaType<ServeSettings>();
  qRegisterMetaType<ServingStatus>();
}

}  // namespace granule::app
