// Recorded telemetry frames: JSON lines into TelemetryFrames, and their paced playback.
#include "telemetry_replay.h"

#include <QFile>
#include <QFileInfo>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <cmath>
#include <limits>
#include <type_traits>

namespace granule::app {
namespace {

// Fills one section's fields from a JSON object, field by field through for_each_field;
// the first value of the wrong type sets `error` ("streaming.layers_streamed is not an
// integer") and the rest are left alone.
struct FieldReader {
  const QJsonObject& object;
  QString section;
  QString error;

  bool present(std::string_view name, QJsonValue* value) const {
    if (!error.isEmpty()) return false;
    const auto it =
        object.constFind(QLatin1String(name.data(), static_cast<qsizetype>(name.size())));
    if (it == object.constEnd()) return false;  // missing: the default stays
    *value = *it;
    return true;
  }
  void fail(std::string_view name, const char* what) {
    error = QStringLiteral("%1.%2 is not %3")
                .arg(section, QString::fromUtf8(name.data(), static_cast<qsizetype>(name.size())),
                     QLatin1String(what));
  }
  template <class Int>
  bool toInteger(const QJsonValue& v, Int* out) {
    if (!v.isDouble()) return false;
    const double d = v.toDouble();
    // JSON numbers arrive as doubles: integers are exact up to 2^53 (8 PiB of bytes).
    if (std::floor(d) != d || d < static_cast<double>(std::numeric_limits<Int>::lowest()) ||
        d > static_cast<double>(std::numeric_limits<Int>::max()))
      return false;
    *out = static_cast<Int>(d);
    return true;
  }

  void operator()(std::string_view name, bool& field) {
    QJsonValue v;
    if (!present(name, &v)) return;
    if (!v.isBool()) return fail(name, "true or false");
    field = v.toBool();
  }
  void operator()(std::string_view name, double& field) {
    QJsonValue v;
    if (!present(name, &v)) return;
    if (!v.isDouble()) return fail(name, "a number");
    field = v.toDouble();
  }
  template <class Int>
  requires std::is_integral_v<Int>
  void operator()(std::string_view name, Int& field) {
    QJsonValue v;
    if (!present(name, &v)) return;
    if (!toInteger(v, &field)) return fail(name, "an integer in range");
  }
  void operator()(std::string_view name, std::string& field) {
    QJsonValue v;
    if (!present(name, &v)) return;
    if (!v.isString()) return fail(name, "a string");
    field = v.toString().toStdString();
  }
  template <class Int>
  requires std::is_integral_v<Int>
  void operator()(std::string_view name, std::vector<Int>& field) {
    QJsonValue v;
    if (!present(name, &v)) return;
    if (!v.isArray()) return fail(name, "an array of integers");
    const QJsonArray items = v.toArray();
    std::vector<Int> values;
    values.reserve(static_cast<size_t>(items.size()));
    for (const QJsonValue& item : items) {
      Int x = 0;
      if (!toInteger(item, &x)) return fail(name, "an array of integers");
      values.push_back(x);
    }
    field = std::move(values);
  }
  void operator()(std::string_view name, Ledger& field) {
    QJsonValue v;
    if (!present(name, &v)) return;
    if (!v.isObject()) return fail(name, "an object of byte counts");
    const QJsonObject bytes = v.toObject();
    for (size_t c = 0; c < kMemoryCategoryCount; ++c) {
      const std::string_view key = memory_category_name(static_cast<MemoryCategory>(c));
      const auto it =
          bytes.constFind(QLatin1String(key.data(), static_cast<qsizetype>(key.size())));
      if (it != bytes.constEnd() && !toInteger(*it, &field[c]))
        return fail(name, "an object of byte counts");
    }
  }
};

// Reads `key` of the frame into `section`; returns the error, "" when fine.
template <class Section>
QString readSection(const QJsonObject& frame, const char* key, Section& section) {
  const auto it = frame.constFind(QLatin1String(key));
  if (it == frame.constEnd()) return {};
  if (!it->isObject()) return QStringLiteral("%1 is not an object").arg(QLatin1String(key));
  const QJsonObject object = it->toObject();
  FieldReader reader{object, QLatin1String(key), {}};
  for_each_field(section, reader);
  return reader.error;
}

QString readFrame(const QJsonObject& object, TelemetryFrame& frame) {
  const auto t = object.constFind(QLatin1String("t"));
  if (t == object.constEnd() || !t->isDouble())
    return QStringLiteral("\"t\" is missing or not a number");
  frame.time_s = t->toDouble();
  frame.has_engine = true;
  TelemetrySnapshot& s = frame.engine;
  for (const QString& e :
       {readSection(object, "device", s.device), readSection(object, "kv", s.kv),
        readSection(object, "scheduler", s.scheduler), readSection(object, "graphs", s.graphs),
        readSection(object, "streaming", s.streaming), readSection(object, "experts", s.experts),
        readSection(object, "throughput", s.throughput)})
    if (!e.isEmpty()) return e;
  const auto sequences = object.constFind(QLatin1String("sequences"));
  if (sequences != object.constEnd()) {
    if (!sequences->isArray()) return QStringLiteral("sequences is not an array");
    for (const QJsonValue& item : sequences->toArray()) {
      if (!item.isObject()) return QStringLiteral("sequences holds a value that is not an object");
      const QJsonObject fields = item.toObject();
      SequenceTelemetry sequence;
      FieldReader reader{fields, QStringLiteral("sequences[]"), {}};
      for_each_field(sequence, reader);
      if (!reader.error.isEmpty()) return reader.error;
      s.sequences.push_back(sequence);
      // A recording knows no chats: each sequence stands for one, under its own id.
      frame.chats.append({sequence.id, sequence});
    }
  }
  return {};
}

}  // namespace

ReplayFrames parseTelemetryFrames(const QByteArray& jsonl, const QString& source_name) {
  ReplayFrames result;
  const QList<QByteArray> lines = jsonl.split('\n');
  // split() leaves an empty last piece after the final newline; anything else there is a
  // line cut off mid-write.
  const bool cut_off = !jsonl.isEmpty() && !jsonl.endsWith('\n');
  for (qsizetype i = 0; i < lines.size(); ++i) {
    const QByteArray line = lines[i].trimmed();
    if (line.isEmpty()) continue;
    const bool last_unterminated = cut_off && i == lines.size() - 1;
    QJsonParseError parse_error;
    const QJsonDocument doc = QJsonDocument::fromJson(line, &parse_error);
    auto fail = [&](const QString& why) {
      result.frames.clear();
      result.error = QStringLiteral("%1 line %2: %3").arg(source_name).arg(i + 1).arg(why);
    };
    if (doc.isNull() || !doc.isObject()) {
      if (last_unterminated && !result.frames.empty()) break;  // the writer was stopped
      fail(doc.isNull() ? QStringLiteral("not JSON (%1)").arg(parse_error.errorString())
                        : QStringLiteral("not a JSON object"));
      return result;
    }
    TelemetryFrame frame;
    if (const QString why = readFrame(doc.object(), frame); !why.isEmpty()) {
      fail(why);
      return result;
    }
    if (!result.frames.empty() && frame.time_s < result.frames.back().time_s) {
      fail(QStringLiteral("\"t\" goes back from %1 to %2 s")
               .arg(result.frames.back().time_s)
               .arg(frame.time_s));
      return result;
    }
    result.frames.push_back(std::move(frame));
  }
  if (result.frames.empty())
    result.error = QStringLiteral("%1 holds no telemetry frames").arg(source_name);
  return result;
}

ReplayFrames readTelemetryFrames(const QString& path) {
  QFile file(path);
  const QString name = QFileInfo(path).fileName();
  if (!file.open(QIODevice::ReadOnly)) {
    ReplayFrames result;
    result.error = QStringLiteral("%1 cannot be read: %2").arg(path, file.errorString());
    return result;
  }
  return parseTelemetryFrames(file.readAll(), name);
}

TelemetryReplay::TelemetryReplay(std::vector<TelemetryFrame> frames, TelemetryModel* target,
                                 QObject* parent)
    : QObject(parent), frames_(std::move(frames)), target_(target) {
  timer_.setSingleShot(true);
  connect(&timer_, &QTimer::timeout, this, &TelemetryReplay::playDue);
}

void TelemetryReplay::start(double speed, AtEnd at_end) {
  speed_ = speed > 0 ? speed : 1.0;
  at_end_ = at_end;
  next_ = 0;
  loop_offset_s_ = 0;
  played_ = 0;
  finished_ = frames_.empty();
  clock_.start();
  if (!finished_) playDue();
}

void TelemetryReplay::stop() {
  timer_.stop();
  finished_ = true;
}

void TelemetryReplay::playDue() {
  if (finished_ || !target_) return;
  const double first_t = frames_.front().time_s;
  // Recorded seconds since the first frame that the replay clock has reached.
  const double now_s = static_cast<double>(clock_.elapsed()) / 1000.0 * speed_;
  while (next_ < frames_.size() &&
         loop_offset_s_ + frames_[next_].time_s - first_t <= now_s + 1e-9) {
    TelemetryFrame frame = frames_[next_++];
    frame.time_s += loop_offset_s_;
    target_->addFrame(frame);
    ++played_;
    if (next_ == frames_.size()) {
      if (at_end_ == AtEnd::Hold) {
        finished_ = true;
        Q_EMIT reachedEnd();
        return;
      }
      // The next pass starts one frame interval after the last frame, so time never stands
      // still (the plots scroll on) and never goes back.
      const double span = frames_.back().time_s - first_t;
      const double interval =
          frames_.size() > 1 ? span / static_cast<double>(frames_.size() - 1) : 0.1;
      loop_offset_s_ += span + std::max(interval, 0.01);
      next_ = 0;
      Q_EMIT reachedEnd();
    }
  }
  const double due_s = loop_offset_s_ + frames_[next_].time_s - first_t;
  const double wait_ms = std::max(0.0, (due_s - now_s) / speed_ * 1000.0);
  timer_.start(static_cast<int>(std::ceil(wait_ms)));
}

}  // namespace granule::app
