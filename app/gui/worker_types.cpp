// Registration of the worker's value types with Qt's meta-type system, and where a
// ledger category goes in a telemetry frame.
#include "worker_types.h"

namespace granule::app {

size_t ledgerCategoryIndex(std::string_view category) {
  for (size_t i = 0; i < kLedgerCategories.size(); ++i)
    if (category == kLedgerCategories[i]) return i;
  return kLedgerCategories.size() - 1;
}

void registerWorkerTypes() {
  qRegisterMetaType<ModelInfo>();
  qRegisterMetaType<FitReport>();
  qRegisterMetaType<GenerationRequest>();
  qRegisterMetaType<GenerationResult>();
  qRegisterMetaType<TelemetryFrame>();
  qRegisterMetaType<TokenChunk>();
  qRegisterMetaType<QList<TokenChunk>>();
}

}  // namespace granule::app
