// The editor's seed text, presets and slider spans.
#include "sampling_editor.h"

#include <QFile>

#include "json_output.h"
#include "sampling_presets.h"

namespace granule::app {
namespace {

struct SliderSpan {
  const char* field;
  double from;
  double to;
  double step;
};

// Inside kSamplingRanges (checked below); the full range where it is a usable slider.
constexpr SliderSpan kSliderSpans[] = {
    {"temperature", kSamplingRanges.temperature.min, kSamplingRanges.temperature.max, 0.05},
    {"topP", kSamplingRanges.top_p.min, kSamplingRanges.top_p.max, 0.01},
    {"topK", kSamplingRanges.top_k.min, 200, 1},
    {"minP", kSamplingRanges.min_p.min, 0.5, 0.01},
    {"repetitionPenalty", 1.0, 2.0, 0.01},
    {"maxTokens", 16, 32768, 16},
};
static_assert(kSamplingRanges.top_k.contains(200) && kSamplingRanges.min_p.contains(0.5) &&
              kSamplingRanges.repetition_penalty.contains(1.0) &&
              kSamplingRanges.repetition_penalty.contains(2.0) &&
              kSamplingRanges.max_tokens.contains(16) &&
              kSamplingRanges.max_tokens.contains(32768));

const SliderSpan* span(const QString& field) {
  for (const SliderSpan& s : kSliderSpans)
    if (field == QLatin1String(s.field)) return &s;
  return nullptr;
}

}  // namespace

SamplingEditor::SamplingEditor(Read read, Write write, QObject* parent)
    : QObject(parent), read_(std::move(read)), write_(std::move(write)) {}

QString SamplingEditor::seed() const { return seedText(settings().seed); }

void SamplingEditor::setSeed(const QString& text) {
  const std::optional<quint64> seed = seedFromText(text);
  if (!seed || *seed == settings().seed) return;
  SamplingSettings s = settings();
  s.seed = *seed;
  write_(s);
}

QString SamplingEditor::reasoning() const { return settings().reasoning; }

void SamplingEditor::setReasoning(const QString& reasoning) {
  static const QStringList kKnown = {QString(), QStringLiteral("off"), QStringLiteral("low"),
                                     QStringLiteral("medium"), QStringLiteral("high")};
  if (!kKnown.contains(reasoning) || reasoning == settings().reasoning) return;
  SamplingSettings s = settings();
  s.reasoning = reasoning;
  write_(s);
}

void SamplingEditor::setJsonOutput(const QString& mode) {
  static const QStringList kKnown = {QString(), QStringLiteral("object"), QStringLiteral("schema")};
  if (!kKnown.contains(mode) || mode == settings().json_output) return;
  // A schema mode needs a schema: setJsonSchema() turns it on.
  if (mode == QStringLiteral("schema") && settings().json_schema.isEmpty()) return;
  SamplingSettings s = settings();
  s.json_output = mode;
  write_(s);
}

QString SamplingEditor::setJsonSchema(const QString& text) {
  const QString problem = jsonSchemaProblem(text);
  if (!problem.isEmpty()) return problem;
  SamplingSettings s = settings();
  s.json_schema = text.trimmed();
  s.json_output = QStringLiteral("schema");
  if (s.json_schema != settings().json_schema || s.json_output != settings().json_output) write_(s);
  return {};
}

QString SamplingEditor::loadJsonSchema(const QUrl& file) {
  const QString path = file.isLocalFile() ? file.toLocalFile() : file.toString();
  QFile in(path);
  constexpr qint64 kMaxSchemaBytes = 1 << 20;
  if (!in.open(QIODevice::ReadOnly))
    return QStringLiteral("Cannot read %1: %2").arg(path, in.errorString());
  if (in.size() > kMaxSchemaBytes)
    return QStringLiteral("%1 is over 1 MiB: not a schema").arg(path);
  return setJsonSchema(QString::fromUtf8(in.readAll()));
}

QString SamplingEditor::preset() const {
  const QString name = matchingSamplingPreset(settings());
  return name.isEmpty() ? QStringLiteral("custom") : name;
}

QStringList SamplingEditor::presets() const {
  return samplingPresetNames() << QStringLiteral("custom");
}

void SamplingEditor::applyPreset(const QString& name) {
  if (const auto preset = samplingPreset(name, settings())) write_(*preset);
}

double SamplingEditor::sliderFrom(const QString& field) const {
  const SliderSpan* s = span(field);
  return s ? s->from : 0;
}
double SamplingEditor::sliderTo(const QString& field) const {
  const SliderSpan* s = span(field);
  return s ? s->to : 0;
}
double SamplingEditor::sliderStep(const QString& field) const {
  const SliderSpan* s = span(field);
  return s ? s->step : 0;
}

}  // namespace granule::app
