// QtTest for the expert panel's model (app/gui/expert_activity.h): the window over the last
// second of cumulative expert counts (differences, a counter that went back), the figures a
// synthetic Zipf-routed recording of qwen3-30b-a3b's shape gives when replayed into the
// TelemetryModel (hit rate climbing as re-plans promote hot experts, uniform routing holding
// the resident share), old recordings without experts leaving the panel hidden, and the
// expert section read back from the engine's JSON.
#include <QtQml/qqmlextensionplugin.h>

#include <QQmlApplicationEngine>
#include <QQuickItem>
#include <QQuickWindow>
#include <QtTest>

#include "expert_activity.h"
#include "expert_heat_map.h"
#include "expert_recording.h"
#include "telemetry_replay.h"
#include "time_series_plot.h"

Q_IMPORT_QML_PLUGIN(GranulePlugin)

using namespace granule::app;
using granule::ExpertTelemetry;

namespace {

// A window of width x height holding `item` (QML; the window is `w`, its telemetry `model`);
// null when it does not load.
QQuickWindow* openWindow(QQmlApplicationEngine& qml, TelemetryModel& model, int width, int height,
                         const char* item) {
  qml.addImportPath(QStringLiteral("qrc:/qt/qml"));
  qml.setInitialProperties({{QStringLiteral("telemetry"), QVariant::fromValue(&model)}});
  qml.loadData(QStringLiteral("import QtQuick\nimport Granule\nWindow { id: w; width: %1; "
                              "height: %2; visible: true\nrequired property TelemetryModel "
                              "telemetry\n%3 }")
                   .arg(width)
                   .arg(height)
                   .arg(QLatin1String(item))
                   .toUtf8());
  return qml.rootObjects().isEmpty() ? nullptr
                                     : qobject_cast<QQuickWindow*>(qml.rootObjects().first());
}

TelemetryFrame frameAt(double t, const ExpertTelemetry& experts) {
  TelemetryFrame f;
  f.time_s = t;
  f.has_engine = true;
  f.engine.experts = experts;
  return f;
}

ExpertTelemetry twoByTwo(std::vector<uint32_t> routed, std::vector<uint32_t> streamed,
                         uint64_t hits, uint64_t misses, uint64_t bytes, uint64_t tokens) {
  ExpertTelemetry x;
  x.n_layer = 2;
  x.n_expert = 2;
  x.resident = {1, 0, 0, 1};
  x.routed = std::move(routed);
  x.streamed = std::move(streamed);
  x.hits = hits;
  x.misses = misses;
  x.bytes_streamed = bytes;
  x.tokens = tokens;
  return x;
}

// Feeds every frame of a recording into a TelemetryModel at once, as a replay would.
void feed(TelemetryModel& model, const QByteArray& jsonl) {
  const ReplayFrames frames = parseTelemetryFrames(jsonl, QStringLiteral("experts.jsonl"));
  QVERIFY2(frames.ok(), qPrintable(frames.error));
  for (const TelemetryFrame& f : frames.frames) model.addFrame(f);
}

}  // namespace

class ExpertsTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void initTestCase() { registerWorkerTypes(); }

  void windowIsTheDifferenceOverTheLastSecond() {
    std::deque<TelemetryFrame> history;
    history.push_back(frameAt(0.0, twoByTwo({1, 1, 1, 1}, {0, 1, 1, 0}, 2, 2, 200, 1)));
    history.push_back(frameAt(0.5, twoByTwo({5, 2, 1, 4}, {0, 2, 1, 0}, 9, 3, 300, 3)));
    history.push_back(frameAt(1.2, twoByTwo({9, 2, 1, 8}, {0, 2, 1, 0}, 17, 3, 300, 5)));
    const ExpertWindow w = expertWindow(history, 1.0);
    QCOMPARE(w.n_layer, 2);
    QCOMPARE(w.seconds, 1.2);  // from the frame at 0 s: none is a whole second back otherwise
    QCOMPARE(w.routed, (std::vector<uint32_t>{8, 1, 0, 7}));
    QCOMPARE(w.streamed, (std::vector<uint32_t>{0, 1, 0, 0}));
    QCOMPARE(w.hits, 15u);
    QCOMPARE(w.misses, 1u);
    QCOMPARE(w.bytes_streamed, 100u);
    QCOMPARE(w.tokens, 4u);
    QCOMPARE(w.most_routed, 8u);
    // Half a second back: from the frame at 0.5 s.
    const ExpertWindow half = expertWindow(history, 0.5);
    QCOMPARE(half.routed, (std::vector<uint32_t>{4, 0, 0, 4}));
    // A count that went back (the recording looped) counts from zero.
    history.push_back(frameAt(1.4, twoByTwo({1, 0, 0, 1}, {0, 0, 0, 0}, 2, 0, 0, 1)));
    const ExpertWindow looped = expertWindow(history, 0.1);
    QCOMPARE(looped.routed, (std::vector<uint32_t>{1, 0, 0, 1}));
    QCOMPARE(looped.hits, 2u);
    // One frame: the placement, nothing routed yet.
    std::deque<TelemetryFrame> one{history.front()};
    const ExpertWindow first = expertWindow(one, 1.0);
    QCOMPARE(first.n_expert, 2);
    QCOMPARE(first.seconds, 0.0);
    QCOMPARE(first.routed, (std::vector<uint32_t>{0, 0, 0, 0}));
    // A dense model: nothing.
    std::deque<TelemetryFrame> dense{frameAt(0, ExpertTelemetry{})};
    QCOMPARE(expertWindow(dense, 1.0).n_expert, 0);
  }

  // The streaming panel's plot counts missed experts' bytes beside streamed layers': the
  // counter's growth per second since the frame before.
  void hostToDevicePlotStacksLayersAndExperts() {
    TelemetryFrame a = frameAt(1.0, twoByTwo({0, 0, 0, 0}, {0, 0, 0, 0}, 0, 0, 1000, 0));
    TelemetryFrame b = frameAt(1.5, twoByTwo({1, 1, 1, 1}, {0, 1, 1, 0}, 2, 2, 6000, 1));
    b.engine.streaming.h2d_bytes_per_second = 2e9;
    QCOMPARE(hostToDeviceRates(b, &a), (std::vector<double>{2e9, 10000.0}));
    QCOMPARE(hostToDeviceRates(b, nullptr), (std::vector<double>{2e9, 0.0}));  // first frame
    // A counter that went back (a reopened model, a looped recording) counts nothing.
    QCOMPARE(hostToDeviceRates(a, &b), (std::vector<double>{0.0, 0.0}));
    // A dense model: its layers only.
    TelemetryFrame dense = frameAt(2.0, ExpertTelemetry{});
    dense.engine.streaming.h2d_bytes_per_second = 5e8;
    QCOMPARE(hostToDeviceRates(dense, &b), (std::vector<double>{5e8, 0.0}));
  }

  void activityFiguresFromTheModel() {
    TelemetryModel model;
    ExpertActivity activity;
    activity.setTelemetry(&model);
    QVERIFY(!activity.active());
    QSignalSpy updated(&activity, &ExpertActivity::updated);
    model.addFrame(frameAt(0.0, twoByTwo({0, 0, 0, 0}, {0, 0, 0, 0}, 0, 0, 0, 0)));
    QCOMPARE(activity.cpuShare(), -1.0);  // no misses yet
    ExpertTelemetry second = twoByTwo({6, 1, 1, 0}, {0, 1, 1, 0}, 6, 2, 8000, 4);
    second.host_computed = 1;  // of the 2 misses, one computed by the CPU, reading 3000 bytes
    second.bytes_host = 3000;
    model.addFrame(frameAt(1.0, second));
    QCOMPARE(updated.count(), 2);
    QVERIFY(activity.active());
    QCOMPARE(activity.totalExperts(), 4);
    QCOMPARE(activity.residentExperts(), 2);
    QCOMPARE(activity.fewestResidentInALayer(), 1);
    QCOMPARE(activity.mostResidentInALayer(), 1);
    QCOMPARE(activity.hitRate(), 0.75);
    QCOMPARE(activity.bytesPerToken(), 2000.0);
    QCOMPARE(activity.bytesPerSecond(), 8000.0);
    QCOMPARE(activity.tokensPerSecond(), 4.0);
    QCOMPARE(activity.streamedExperts(), 2);
    QCOMPARE(activity.cpuShare(), 0.5);
    QCOMPARE(activity.cpuBytesPerSecond(), 3000.0);
    QCOMPARE(activity.describeCell(0, 1),
             QStringLiteral("layer 0 · expert 1: in host memory, 1 choice this second, 1 read "
                            "over PCIe"));
    QCOMPARE(activity.describeCell(0, 0),
             QStringLiteral("layer 0 · expert 0: in device memory, 6 choices this second"));
    QVERIFY(activity.describeCell(2, 0).isEmpty());
  }

  void zipfRecordingReplaysWithAClimbingHitRate() {
    testing::ExpertSessionSpec spec;
    spec.seconds = 20;
    const QByteArray jsonl = testing::expertSessionJsonl(spec);
    const ReplayFrames frames = parseTelemetryFrames(jsonl, QStringLiteral("experts.jsonl"));
    QVERIFY2(frames.ok(), qPrintable(frames.error));
    QCOMPARE(frames.frames.size(), 201u);
    const ExpertTelemetry& last = frames.frames.back().engine.experts;
    QCOMPARE(last.n_layer, 48);
    QCOMPARE(last.n_expert, 128);
    QCOMPARE(last.resident_count(), 3072);
    QCOMPARE(last.hits + last.misses, last.tokens * 48 * 8);
    QVERIFY(last.promotions > 0);
    QCOMPARE(last.promotions, last.demotions);  // the budget stays: every move is a swap

    TelemetryModel model;
    ExpertActivity activity;
    activity.setTelemetry(&model);
    double first_second = -1;
    for (const TelemetryFrame& f : frames.frames) {
      model.addFrame(f);
      if (first_second < 0 && f.time_s >= 1.0) first_second = activity.hitRate();
    }
    // Uniformly placed half the experts serve about half the Zipf choices at first; after
    // re-plans keep the hot experts, close to what the best placement for the whole run's
    // counts (each layer's 64 most routed) would have served.
    std::vector<uint32_t> routed = last.routed;
    uint64_t best = 0, all = 0;
    for (int l = 0; l < 48; ++l) {
      auto first = routed.begin() + l * 128;
      std::sort(first, first + 128, std::greater<>());
      for (int e = 0; e < 128; ++e) (e < 64 ? best : all) += first[e];
    }
    all += best;
    const double ideal = static_cast<double>(best) / static_cast<double>(all);
    QVERIFY2(first_second > 0.3 && first_second < 0.75, qPrintable(QString::number(first_second)));
    QVERIFY2(activity.hitRate() > 0.95 * ideal,
             qPrintable(QStringLiteral("%1 of an ideal %2").arg(activity.hitRate()).arg(ideal)));
    QVERIFY(activity.hitRate() > first_second + 0.2);
    QVERIFY(activity.bytesPerToken() > 0);
    QCOMPARE(activity.residentExperts(), 3072);
    QCOMPARE(activity.fewestResidentInALayer() + activity.mostResidentInALayer() > 0, true);
  }

  void uniformRoutingHitsTheResidentShare() {
    testing::ExpertSessionSpec spec;
    spec.zipf_exponent = 0;
    spec.seconds = 6;
    TelemetryModel model;
    ExpertActivity activity;
    activity.setTelemetry(&model);
    feed(model, testing::expertSessionJsonl(spec));
    QVERIFY2(std::abs(activity.lifetimeHitRate() - 0.5) < 0.03,
             qPrintable(QString::number(activity.lifetimeHitRate())));
    // Every layer keeps 64: the sticky plan does not chase noise.
    QCOMPARE(activity.fewestResidentInALayer(), 64);
    QCOMPARE(activity.mostResidentInALayer(), 64);
  }

  void recordingWithoutExpertsLeavesThePanelHidden() {
    const ReplayFrames old =
        readTelemetryFrames(QStringLiteral(GRANULE_TEST_DATA_DIR "/streaming_frames.jsonl"));
    QVERIFY2(old.ok(), qPrintable(old.error));
    TelemetryModel model;
    ExpertActivity activity;
    activity.setTelemetry(&model);
    for (const TelemetryFrame& f : old.frames) model.addFrame(f);
    QVERIFY(!activity.active());
    QCOMPARE(activity.hitRate(), -1.0);
  }

  void badExpertArraysNameTheField() {
    const ReplayFrames bad = parseTelemetryFrames(
        "{\"t\": 1, \"experts\": {\"routed\": [1, -2]}}\n", QStringLiteral("x.jsonl"));
    QCOMPARE(bad.error,
             QStringLiteral("x.jsonl line 1: experts.routed is not an array of integers"));
    const ReplayFrames big = parseTelemetryFrames(
        "{\"t\": 1, \"experts\": {\"resident\": [1, 256]}}\n", QStringLiteral("x.jsonl"));
    QCOMPARE(big.error,
             QStringLiteral("x.jsonl line 1: experts.resident is not an array of integers"));
  }

  // The panel in QML: hidden for a dense model, shown with its grid for a mixture of experts.
  void panelShowsOnlyForAMixtureOfExperts() {
    TelemetryModel model;
    QQmlApplicationEngine qml;
    QQuickWindow* window =
        openWindow(qml, model, 330, 520, "ExpertPanel { width: 320; telemetry: w.telemetry }");
    QVERIFY(window);
    auto* panel = window->findChild<QQuickItem*>(QStringLiteral("expertPanel"));
    QVERIFY(panel);
    QVERIFY(!panel->isVisible());
    testing::ExpertSessionSpec spec;
    spec.seconds = 3;
    feed(model, testing::expertSessionJsonl(spec));
    QTRY_VERIFY(panel->isVisible());
    auto* map = window->findChild<ExpertHeatMap*>();
    QVERIFY(map);
    QVERIFY(map->height() >= 96);
    QCOMPARE(map->layerAt(0), 0);
    QCOMPARE(map->layerAt(map->height() - 0.5), 47);
    // Sorted by routing (the panel's default): layer 0's first column is its most routed
    // expert; in expert order the last column is expert 127.
    QVERIFY(map->sortedByRouting());
    const std::vector<uint32_t>& routed = model.latest().engine.experts.routed;
    const int hottest = map->expertAt(0.5, 0.5);
    QVERIFY(hottest >= 0 && hottest < 128);
    QCOMPARE(routed[static_cast<size_t>(hottest)],
             *std::max_element(routed.begin(), routed.begin() + 128));
    map->setSortedByRouting(false);
    QCOMPARE(map->expertAt(map->width() - 0.5, 0.5), 127);
    QCOMPARE(map->expertAt(0.5, map->height() - 0.5), 0);
  }

  // In the dock, the Experts and Streaming panels show one ExpertActivity (the dock's), and the
  // panels' own readings stay idle: the frames' cells are compared once, not once per panel.
  void dockHandsOneReadingToBothPanels() {
    TelemetryModel model;
    QQmlApplicationEngine qml;
    QQuickWindow* window = openWindow(qml, model, 420, 900,
                                      "MemoryDock { anchors.fill: parent; telemetry: w.telemetry }");
    QVERIFY(window);
    auto* experts = window->findChild<QQuickItem*>(QStringLiteral("expertPanel"));
    auto* streaming = window->findChild<QQuickItem*>(QStringLiteral("streamingPanel"));
    QVERIFY(experts && streaming);
    auto* shown = experts->property("activity").value<ExpertActivity*>();
    QVERIFY(shown);
    QCOMPARE(streaming->property("experts").value<ExpertActivity*>(), shown);
    const QList<ExpertActivity*> all = window->findChildren<ExpertActivity*>();
    int reading = 0;
    for (const ExpertActivity* a : all) reading += a->telemetry() != nullptr;
    QCOMPARE(reading, 1);
    testing::ExpertSessionSpec spec;
    spec.seconds = 3;
    feed(model, testing::expertSessionJsonl(spec));
    QTRY_VERIFY(experts->isVisible());
    QVERIFY(shown->residentExperts() > 0);
  }
};

QTEST_MAIN(ExpertsTest)
#include "app_experts_test.moc"
