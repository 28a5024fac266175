// QtTest for the telemetry replay (granule --replay): a hand-written recording with weight
// streaming under way is read generically into frames, played into the TelemetryModel at its
// recorded pace (or faster, looping), and reaches QML's camelCase maps; bad files give one
// line naming the line at fault; the Application replays without a model and keeps the
// worker's live frames out of the panels; a long Gemma-shaped chat's recording keeps its window
// KV flat while its KV grows.
#include <QElapsedTimer>
#include <QFile>
#include <QTemporaryDir>
#include <QtTest>
#include <algorithm>

#include "application.h"
#include "fake_inference_engine.h"
#include "telemetry_json_writer.h"
#include "telemetry_replay.h"

using namespace granule::app;
using granule::MemoryCategory;

namespace {

QString handWrittenFrames() {
  return QStringLiteral(GRANULE_TEST_DATA_DIR "/streaming_frames.jsonl");
}

QString writeFile(const QTemporaryDir& dir, const QString& name, const QByteArray& content) {
  const QString path = dir.filePath(name);
  QFile file(path);
  file.open(QIODevice::WriteOnly);
  file.write(content);
  return path;
}

QByteArray handWrittenLine(int index) {
  QFile file(handWrittenFrames());
  file.open(QIODevice::ReadOnly);
  return file.readAll().split('\n').at(index) + '\n';
}

}  // namespace

class ReplayTest : public QObject {
  Q_OBJECT

 private Q_SLOTS:
  void initTestCase() { registerWorkerTypes(); }

  void handWrittenFramesAreReadFieldByField() {
    const ReplayFrames recorded = readTelemetryFrames(handWrittenFrames());
    QVERIFY2(recorded.ok(), qPrintable(recorded.error));
    QCOMPARE(recorded.frames.size(), 3u);
    const TelemetryFrame& first = recorded.frames[0];
    QVERIFY(first.has_engine);
    QCOMPARE(first.time_s, 0.0);
    QCOMPARE(first.engine.kv.committed_bytes, 0u);  // no "kv" section: defaults stay
    QCOMPARE(first.engine.graphs.last_fallback_reason,
             std::string("first step of bucket 1: capturing"));

    const TelemetryFrame& last = recorded.frames[2];
    QCOMPARE(last.time_s, 0.2);
    const auto& device = last.engine.device;
    QCOMPARE(device.name, std::string("NVIDIA H200"));
    QVERIFY(device.gpu);
    QCOMPARE(device.total_bytes, 150754820096ull);
    QCOMPARE(device.budget_bytes, 6442450944ull);
    QCOMPARE(device.ledger_bytes(MemoryCategory::WeightsStaging), 1073741824ull);
    QCOMPARE(device.ledger_bytes(MemoryCategory::KvReservedVa), 34359738368ull);
    QCOMPARE(device.ledger_bytes(MemoryCategory::Graphs), 1048576ull);
    const auto& graphs = last.engine.graphs;
    QCOMPARE(graphs.buckets, (std::vector<int32_t>{1, 2}));
    QCOMPARE(graphs.nodes, 1406);
    QCOMPARE(graphs.segments_per_step, 3);
    QCOMPARE(graphs.replays, 41u);
    QCOMPARE(graphs.recaptures, 2u);
    QCOMPARE(graphs.last_recapture_reason,
             std::string("placement changed: 16 of 32 layers streamed"));
    const auto& streaming = last.engine.streaming;
    QCOMPARE(streaming.layers_resident, 16);
    QCOMPARE(streaming.layers_streamed, 16);
    QCOMPARE(streaming.layer_streamed.size(), 32u);
    QCOMPARE(std::count(streaming.layer_streamed.begin(), streaming.layer_streamed.end(), 1), 16);
    QCOMPARE(streaming.layer_streamed[15], 0);
    QCOMPARE(streaming.layer_streamed[16], 1);
    QCOMPARE(streaming.streamed_bytes_per_pass, 3489660928ull);
    QCOMPARE(streaming.staging_slots, 2);
    QCOMPARE(streaming.staging_occupancy, 0.91);
    QCOMPARE(streaming.h2d_bytes, 116823110656ull);
    QCOMPARE(streaming.h2d_bytes_per_second, 51250000000.5);
    QCOMPARE(streaming.h2d_bytes_per_token, 1744830464.0);
    QCOMPARE(streaming.h2d_bandwidth_bytes_per_second, 55e9);
    QCOMPARE(streaming.replans, 1u);
    QCOMPARE(streaming.last_replan_reason,
             std::string("the budget changed from 8192 to 6144 MiB \"by the user\""));
    QCOMPARE(last.engine.throughput.decode_tokens_per_second, 29.4);
    // Sequences become the chat rows, under their own ids.
    QCOMPARE(last.chats.size(), 2);
    QCOMPARE(last.chats[1].chat_id, 2);
    QVERIFY(last.chats[1].sequence.waiting);
    QCOMPARE(last.chats[1].sequence.preemptions, 1);
  }

  void writtenFramesReadBackTheSame() {
    // The generic writer of the tests and the reader agree on every field of a session.
    const QByteArray jsonl = testing::streamingSessionJsonl(2.0, 5.0, 1.0);
    const ReplayFrames recorded = parseTelemetryFrames(jsonl, QStringLiteral("session"));
    QVERIFY2(recorded.ok(), qPrintable(recorded.error));
    QCOMPARE(recorded.frames.size(), 11u);
    QByteArray again;
    for (const TelemetryFrame& f : recorded.frames)
      again += testing::frameJsonLine(f.time_s, f.engine);
    QCOMPARE(again, jsonl);
  }

  // The replay is the one reader of the engine's frames (the engine's own reader is gone):
  // keys it does not know are ignored and missing keys keep their defaults, so an older or
  // newer recording replays; a real frame cut short anywhere is refused, never half read.
  void unknownKeysAreIgnoredAndCutFramesRefused() {
    QByteArray line = testing::streamingSessionJsonl(0.0, 1.0, 1.0);  // one frame
    const ReplayFrames plain = parseTelemetryFrames(line, QStringLiteral("plain"));
    QVERIFY2(plain.ok(), qPrintable(plain.error));
    QByteArray extended = line;
    extended.insert(1, R"("future":{"a":[1,{"b":null}],"c":"x"},"version":3,)");
    const auto insertAfter = [&](const QByteArray& anchor, const QByteArray& text) {
      const qsizetype at = extended.indexOf(anchor);
      QVERIFY2(at >= 0, anchor.constData());
      extended.insert(at + anchor.size(), text);
    };
    insertAfter("\"kv\":{", R"("new_counter":12,"new_list":[1,2],)");
    insertAfter("\"ledger\":{", R"("vram_of_tomorrow":5,)");
    insertAfter("\"sequences\":[{", R"("colour":"blue",)");
    const ReplayFrames read = parseTelemetryFrames(extended, QStringLiteral("extended"));
    QVERIFY2(read.ok(), qPrintable(read.error));
    QCOMPARE(read.frames.size(), 1u);
    QCOMPARE(testing::frameJsonLine(read.frames[0].time_s, read.frames[0].engine), line);

    const ReplayFrames sparse = parseTelemetryFrames(
        R"({"t":0,"kv":{"committed_bytes":5},"device":{"ledger":{"kv":7}},"sequences":[{"id":4},{}]})"
        "\n",
        QStringLiteral("sparse"));
    QVERIFY2(sparse.ok(), qPrintable(sparse.error));
    const granule::TelemetrySnapshot& s = sparse.frames[0].engine;
    QCOMPARE(s.kv.committed_bytes, 5u);
    QCOMPARE(s.kv.pool_bytes, 0u);
    QCOMPARE(s.device.ledger_bytes(MemoryCategory::KvCommitted), 7u);
    QCOMPARE(s.device.ledger_bytes(MemoryCategory::WeightsResident), 0u);
    QCOMPARE(s.sequences.size(), 2u);
    QCOMPARE(s.sequences[0].id, 4);
    QCOMPARE(s.sequences[1].tokens, 0);

    const QByteArray frame = line.chopped(1);  // without its newline
    for (qsizetype cut = 1; cut < frame.size(); cut += 7) {
      const ReplayFrames broken =
          parseTelemetryFrames(frame.left(cut) + '\n', QStringLiteral("cut.jsonl"));
      QVERIFY2(!broken.ok(), qPrintable(QStringLiteral("cut at %1 read").arg(cut)));
      QVERIFY(broken.error.startsWith(QStringLiteral("cut.jsonl line 1: ")));
    }
  }

  void replayFeedsTheModelAtTheRecordedPaceAndHoldsTheLastFrame() {
    TelemetryModel model;
    TelemetryReplay replay(readTelemetryFrames(handWrittenFrames()).frames, &model);
    QSignalSpy ended(&replay, &TelemetryReplay::reachedEnd);
    QElapsedTimer clock;
    clock.start();
    replay.start(1.0, TelemetryReplay::AtEnd::Hold);
    QCOMPARE(model.history().size(), 1u);  // t = 0 plays at once
    QTRY_COMPARE_WITH_TIMEOUT(model.history().size(), 3u, 2000);
    // The third frame was recorded at 0.2 s; it does not arrive much before that.
    QVERIFY2(clock.elapsed() >= 180, qPrintable(QString::number(clock.elapsed())));
    QCOMPARE(ended.count(), 1);
    QVERIFY(replay.finished());
    QTest::qWait(300);
    QCOMPARE(model.history().size(), 3u);  // held, not repeated

    // What QML reads: the latest frame's sections as camelCase maps.
    const TelemetryFrame& latest = model.latest();
    const QVariantMap streaming = latest.streamingFields();
    QCOMPARE(streaming.value("layersStreamed").toInt(), 16);
    QCOMPARE(streaming.value("layerStreamed").toList().size(), 32);
    QCOMPARE(streaming.value("layerStreamed").toList().at(31).toInt(), 1);
    QCOMPARE(streaming.value("h2dBytesPerSecond").toDouble(), 51250000000.5);
    QCOMPARE(streaming.value("h2dBytesPerToken").toDouble(), 1744830464.0);
    QCOMPARE(streaming.value("stagingOccupancy").toDouble(), 0.91);
    QCOMPARE(streaming.value("lastReplanReason").toString(),
             QStringLiteral("the budget changed from 8192 to 6144 MiB \"by the user\""));
    const QVariantMap graphs = latest.graphsFields();
    QCOMPARE(graphs.value("recaptures").toInt(), 2);
    QCOMPARE(graphs.value("buckets").toList().size(), 2);
    const QVariantMap ledger = latest.deviceFields().value("ledger").toMap();
    QCOMPARE(ledger.value("staging").toDouble(), 1073741824.0);
    QCOMPARE(model.rowCount(), 2);
    QVERIFY(model.isWaiting(2));
  }

  // A recording of a long Gemma-shaped chat (granule-cli run --telemetry-out on the small-gemma3
  // preset, CPU, a prompt of 2,976 tokens and 800 generated; thinned to 54 frames): past the
  // prompt the chat's KV grows while its sliding-window layers' KV stays flat (KV by layer kind),
  // and QML reads both from the chat's row.
  void gemmaWindowRecordingKeepsWindowKvFlat() {
    const ReplayFrames recorded =
        readTelemetryFrames(QStringLiteral(GRANULE_TEST_DATA_DIR "/gemma_window_frames.jsonl"));
    QVERIFY2(recorded.ok(), qPrintable(recorded.error));
    quint64 first_kv = 0, last_kv = 0, window_low = ~quint64{0}, window_high = 0;
    int decoding = 0;
    const TelemetryFrame* last = nullptr;
    for (const TelemetryFrame& frame : recorded.frames) {
      if (frame.chats.isEmpty()) continue;
      const granule::SequenceTelemetry& s = frame.chats.front().sequence;
      if (s.tokens <= 2976) continue;  // the prompt's chunks hold a chunk beside the window
      ++decoding;
      if (first_kv == 0) first_kv = s.kv_committed_bytes;
      last_kv = s.kv_committed_bytes;
      window_low = std::min<quint64>(window_low, s.kv_window_committed_bytes);
      window_high = std::max<quint64>(window_high, s.kv_window_committed_bytes);
      last = &frame;
    }
    QVERIFY(decoding >= 30);
    QVERIFY2(last_kv >= first_kv + (16ull << 20), qPrintable(QString::number(last_kv - first_kv)));
    QVERIFY(window_high > 0);
    // Flat: a granule mapped ahead, one unmapped behind (2 MiB granules; 160 KiB a token).
    QVERIFY2(window_high - window_low <= (2ull << 20),
             qPrintable(QString::number(window_high - window_low)));
    QVERIFY(window_high < last_kv);

    TelemetryModel model;
    model.addFrame(*last);
    QCOMPARE(model.rowCount(), 1);
    const QVariantMap sequence = model.data(model.index(0), TelemetryModel::SequenceRole).toMap();
    QCOMPARE(sequence.value("kvWindowCommittedBytes").toDouble(),
             static_cast<double>(last->chats.front().sequence.kv_window_committed_bytes));
    QCOMPARE(sequence.value("kvCommittedBytes").toDouble(), static_cast<double>(last_kv));
  }

  void loopingReplayKeepsTimeMovingForward() {
    TelemetryModel model;
    TelemetryReplay replay(readTelemetryFrames(handWrittenFrames()).frames, &model);
    replay.start(10.0, TelemetryReplay::AtEnd::Loop);  // a pass takes ~20 ms
    QTRY_VERIFY_WITH_TIMEOUT(replay.framesPlayed() >= 9, 3000);
    QVERIFY(!replay.finished());
    double previous = -1;
    for (const TelemetryFrame& f : model.history()) {
      QVERIFY2(f.time_s > previous, qPrintable(QString("%1 after %2").arg(f.time_s).arg(previous)));
      previous = f.time_s;
    }
    replay.stop();
  }

  void badRecordingsGiveOneLineNamingTheLine() {
    auto error = [](const QByteArray& jsonl) {
      return parseTelemetryFrames(jsonl, QStringLiteral("frames.jsonl")).error;
    };
    const QByteArray good = handWrittenLine(0);
    QCOMPARE(error(good + "{\"t\": 0.5, \"device\": \n"),
             QStringLiteral("frames.jsonl line 2: not JSON (unterminated object)"));
    QCOMPARE(error(good + "[1, 2]\n"), QStringLiteral("frames.jsonl line 2: not a JSON object"));
    QCOMPARE(error("{\"t\": 1, \"streaming\": {\"layers_streamed\": 2.5}}\n"),
             QStringLiteral(
                 "frames.jsonl line 1: streaming.layers_streamed is not an integer in range"));
    QCOMPARE(error("{\"t\": 1, \"streaming\": {\"layer_streamed\": [0, \"x\"]}}\n"),
             QStringLiteral(
                 "frames.jsonl line 1: streaming.layer_streamed is not an array of integers"));
    QCOMPARE(error("{\"t\": 1, \"device\": {\"budget_bytes\": -4}}\n"),
             QStringLiteral("frames.jsonl line 1: device.budget_bytes is not an integer in range"));
    QCOMPARE(error("{\"t\": 1, \"graphs\": {\"last_recapture_reason\": 3}}\n"),
             QStringLiteral("frames.jsonl line 1: graphs.last_recapture_reason is not a string"));
    QCOMPARE(error("{\"device\": {}}\n"),
             QStringLiteral("frames.jsonl line 1: \"t\" is missing or not a number"));
    QCOMPARE(error("{\"t\": 2}\n{\"t\": 1}\n"),
             QStringLiteral("frames.jsonl line 2: \"t\" goes back from 2 to 1 s"));
    QCOMPARE(error(""), QStringLiteral("frames.jsonl holds no telemetry frames"));
    QCOMPARE(error("\n\n"), QStringLiteral("frames.jsonl holds no telemetry frames"));
    // A recording cut off in the middle of its last line keeps the frames before it.
    const ReplayFrames cut =
        parseTelemetryFrames(good + handWrittenLine(1).left(200), QStringLiteral("cut.jsonl"));
    QVERIFY2(cut.ok(), qPrintable(cut.error));
    QCOMPARE(cut.frames.size(), 1u);
    const ReplayFrames missing = readTelemetryFrames(QStringLiteral("/nonexistent/frames.jsonl"));
    QVERIFY(missing.error.startsWith(QStringLiteral("/nonexistent/frames.jsonl cannot be read")));
    QVERIFY(!missing.error.contains(QLatin1Char('\n')));
  }

  void applicationReplaysWithoutAModelAndKeepsLiveFramesOut() {
    QTemporaryDir dir;
    testing::FakeEngineLog log;
    Application app(testing::fakeEngineFactory({}, &log), dir.filePath("granule.sqlite"));
    QVERIFY(app.startReplay(handWrittenFrames(), 4.0, false));
    QCOMPARE(app.telemetry()->replaySource(), QStringLiteral("streaming_frames.jsonl"));
    QTRY_VERIFY_WITH_TIMEOUT(app.replay() && app.replay()->finished(), 3000);
    QTest::qWait(400);  // the worker ticks at 10 Hz: none of its frames may arrive
    QCOMPARE(app.telemetry()->history().size(), 3u);
    QCOMPARE(app.telemetry()->latest().engine.streaming.layers_streamed, 16);
    QCOMPARE(app.telemetry()->data(app.telemetry()->index(0), TelemetryModel::TitleRole).toString(),
             QStringLiteral("sequence 1"));
    QVERIFY(!app.model()->ready());
    QCOMPARE(log.submitted.load(), 0);
    QVERIFY(!app.errors()->active());
    app.shutdown();
  }

  void applicationWithABadRecordingShowsTheBannerAndRunsOn() {
    QTemporaryDir dir;
    const QString bad = writeFile(dir, "bad.jsonl", handWrittenLine(0) + "{\"t\": oops}\n");
    Application app(testing::fakeEngineFactory(), dir.filePath("granule.sqlite"));
    QVERIFY(!app.startReplay(bad, 1.0, false));
    QVERIFY(app.errors()->active());
    QVERIFY2(app.errors()->message().startsWith(QStringLiteral("bad.jsonl line 2: not JSON")),
             qPrintable(app.errors()->message()));
    QVERIFY(!app.errors()->message().contains(QLatin1Char('\n')));
    // The live telemetry is back (its first frame shown; the later ones, showing nothing
    // new while idle, are dropped before the panels), and a model still loads.
    QTRY_VERIFY_WITH_TIMEOUT(
        app.telemetry()->history().size() >= 1 &&
            app.telemetry()->history().size() + app.droppedTelemetryFrames() >= 2,
        3000);
    app.model()->load(writeFile(dir, "fake.gguf", {}));
    QTRY_VERIFY_WITH_TIMEOUT(app.model()->ready(), 5000);
    app.shutdown();
  }
};

QTEST_GUILESS_MAIN(ReplayTest)
#include "app_replay_test.moc"
