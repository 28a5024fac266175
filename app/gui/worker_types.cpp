// Registration of the worker's value types with Qt's meta-type system.
#include "worker_types.h"

namespace granule::app {

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
