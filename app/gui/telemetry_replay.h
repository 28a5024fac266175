// Telemetry replay: reads frames recorded as JSON lines (the engine's writer, see
// TELEMETRY_JSON in the notes: one {"t": …, "device": {…}, …} object a line) into
// TelemetryFrames, filling each section generically through for_each_field (writable), and
// plays them into a TelemetryModel at their recorded pace, so the window's panels show a run
// recorded elsewhere (the H200) without a model loaded here.
#pragma once
#include <QByteArray>
#include <QElapsedTimer>
#include <QObject>
#include <QPointer>
#include <QString>
#include <QTimer>
#include <vector>

#include "telemetry_model.h"
#include "worker_types.h"

namespace granule::app {

// The frames of a recording, or the one-line reason it could not be read.
struct ReplayFrames {
  std::vector<TelemetryFrame> frames;
  QString error;  // "" when the frames are good
  bool ok() const { return error.isEmpty(); }
};

// Parses JSON lines. Unknown keys are ignored and missing ones keep their defaults (an
// older recording replays in a newer window); a value of the wrong type, a line that is not
// a JSON object or frames whose "t" goes backwards are errors naming the line. A last line
// without its newline (a recording cut off mid-write) is left out, not an error. Each
// sequence becomes a chat row whose id is the sequence's.
ReplayFrames parseTelemetryFrames(const QByteArray& jsonl, const QString& source_name);
ReplayFrames readTelemetryFrames(const QString& path);

class TelemetryReplay : public QObject {
  Q_OBJECT

 public:
  enum class AtEnd { Hold, Loop };

  TelemetryReplay(std::vector<TelemetryFrame> frames, TelemetryModel* target,
                  QObject* parent = nullptr);

  // Plays from the first frame; `speed` 2 plays twice as fast. Hold keeps the last frame
  // on screen; Loop starts again, the clock running on so the plots keep moving.
  void start(double speed = 1.0, AtEnd at_end = AtEnd::Hold);
  void stop();
  bool finished() const { return finished_; }
  int framesPlayed() const { return played_; }

 Q_SIGNALS:
  void reachedEnd();

 private:
  void playDue();

  std::vector<TelemetryFrame> frames_;
  QPointer<TelemetryModel> target_;
  QTimer timer_;
  QElapsedTimer clock_;
  double speed_ = 1.0;
  AtEnd at_end_ = AtEnd::Hold;
  size_t next_ = 0;
  double loop_offset_s_ = 0;  // recorded time added to the frames of the current pass
  int played_ = 0;
  bool finished_ = false;
};

}  // namespace granule::app
