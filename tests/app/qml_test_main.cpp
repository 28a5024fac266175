// Qt Quick Test runner for the QML components (tests/app/qml/tst_*.qml). The tests reach
// real C++ services through a test-only singleton, GranuleTest.Services.
#include <QtQml/qqmlextensionplugin.h>

#include <QQmlEngine>
#include <QQuickStyle>
#include <QTemporaryDir>
#include <QtQuickTest>

#include "application.h"
#include "fake_inference_engine.h"

Q_IMPORT_QML_PLUGIN(GranulePlugin)

using namespace granule::app;

// What the QML tests need: the application's objects and a way to feed telemetry.
class QmlTestServices : public QObject {
  Q_OBJECT
  Q_PROPERTY(granule::app::ChatController* chats READ chats CONSTANT)
  Q_PROPERTY(granule::app::ModelController* model READ model CONSTANT)
  Q_PROPERTY(granule::app::TelemetryModel* telemetry READ telemetry CONSTANT)
  Q_PROPERTY(granule::app::ErrorReporter* errors READ errors CONSTANT)

 public:
  QmlTestServices() : app_(testing::fakeEngineFactory(), dir_.filePath("granule.sqlite")) {}
  ChatController* chats() { return app_.chats(); }
  ModelController* model() { return app_.model(); }
  TelemetryModel* telemetry() { return app_.telemetry(); }
  ErrorReporter* errors() { return app_.errors(); }

  Q_INVOKABLE void addTelemetrySample(double time_s, double weights_bytes, double kv_bytes,
                                      double budget_bytes) {
    TelemetryFrame f;
    f.time_s = time_s;
    f.has_engine = true;
    granule::DeviceTelemetry& device = f.engine.device;
    device.name = "CPU";
    device.budget_bytes = static_cast<quint64>(budget_bytes);
    device.ledger[static_cast<size_t>(granule::MemoryCategory::WeightsResident)] =
        static_cast<quint64>(weights_bytes);
    device.ledger[static_cast<size_t>(granule::MemoryCategory::KvCommitted)] =
        static_cast<quint64>(kv_bytes);
    app_.telemetry()->addFrame(f);
  }

 private:
  QTemporaryDir dir_;
  Application app_;
};

class Setup : public QObject {
  Q_OBJECT

 public Q_SLOTS:
  void applicationAvailable() { QQuickStyle::setStyle(QStringLiteral("Fusion")); }
  void qmlEngineAvailable(QQmlEngine* engine) {
    engine->addImportPath(QStringLiteral("qrc:/qt/qml"));
    services_ = std::make_unique<QmlTestServices>();
    qmlRegisterSingletonInstance("GranuleTest", 1, 0, "Services", services_.get());
  }

 private:
  std::unique_ptr<QmlTestServices> services_;
};

QUICK_TEST_MAIN_WITH_SETUP(granule_qml, Setup)
#include "qml_test_main.moc"
