// SamplingEditor: one SamplingSettings as QML properties, each clamped to the engine's range
// for it (kSamplingRanges). WindowSettings edits the global defaults through one and
// ChatController the open chat's, so both show and check the fields the same way.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QObject>
#include <QStringList>
#include <QUrl>
#include <functional>

#include "worker_types.h"

namespace granule::app {

class SamplingEditor : public QObject {
  Q_OBJECT
  QML_ELEMENT
  QML_UNCREATABLE("Owned by WindowSettings and ChatController")
  Q_PROPERTY(double temperature READ temperature WRITE setTemperature NOTIFY changed)
  Q_PROPERTY(double topP READ topP WRITE setTopP NOTIFY changed)
  Q_PROPERTY(int topK READ topK WRITE setTopK NOTIFY changed)
  Q_PROPERTY(double minP READ minP WRITE setMinP NOTIFY changed)
  Q_PROPERTY(
      double repetitionPenalty READ repetitionPenalty WRITE setRepetitionPenalty NOTIFY changed)
  Q_PROPERTY(int maxTokens READ maxTokens WRITE setMaxTokens NOTIFY changed)
  // "random" (a new seed per reply) or the seed's digits; 0 is a seed like any other. Text
  // that is neither is ignored.
  Q_PROPERTY(QString seed READ seed WRITE setSeed NOTIFY changed)
  // The chat's reasoning setting: "" the model's default, "off", or "low"/"medium"/"high".
  Q_PROPERTY(QString reasoning READ reasoning WRITE setReasoning NOTIFY changed)
  // The chat's JSON output: "" off, "object" any JSON object, "schema" (needs jsonSchema).
  Q_PROPERTY(QString jsonOutput READ jsonOutput WRITE setJsonOutput NOTIFY changed)
  Q_PROPERTY(QString jsonSchema READ jsonSchema NOTIFY changed)
  // The engine's preset the values match, or "custom".
  Q_PROPERTY(QString preset READ preset NOTIFY changed)
  // The engine's presets and "custom", for a preset box.
  Q_PROPERTY(QStringList presets READ presets CONSTANT)

 public:
  using Read = std::function<const SamplingSettings&()>;
  using Write = std::function<void(const SamplingSettings&)>;
  // `read` gives the settings shown; `write` stores a change (the owner then emits changed()).
  SamplingEditor(Read read, Write write, QObject* parent = nullptr);

  const SamplingSettings& settings() const { return read_(); }
  double temperature() const { return settings().temperature; }
  void setTemperature(double v) {
    set(&SamplingSettings::temperature, kSamplingRanges.temperature, v);
  }
  double topP() const { return settings().top_p; }
  void setTopP(double v) { set(&SamplingSettings::top_p, kSamplingRanges.top_p, v); }
  int topK() const { return settings().top_k; }
  void setTopK(int v) { set(&SamplingSettings::top_k, kSamplingRanges.top_k, v); }
  double minP() const { return settings().min_p; }
  void setMinP(double v) { set(&SamplingSettings::min_p, kSamplingRanges.min_p, v); }
  double repetitionPenalty() const { return settings().repetition_penalty; }
  void setRepetitionPenalty(double v) {
    set(&SamplingSettings::repetition_penalty, kSamplingRanges.repetition_penalty, v);
  }
  int maxTokens() const { return settings().max_tokens; }
  void setMaxTokens(int v) { set(&SamplingSettings::max_tokens, kSamplingRanges.max_tokens, v); }
  QString seed() const;
  void setSeed(const QString& text);
  QString reasoning() const;
  void setReasoning(const QString& reasoning);
  QString jsonOutput() const { return settings().json_output; }
  void setJsonOutput(const QString& mode);
  QString jsonSchema() const { return settings().json_schema; }
  // Checks a schema and, when it is sound, stores it and turns JSON output to "schema".
  // Returns "" or the one-line reason it was refused (nothing stored then).
  Q_INVOKABLE QString setJsonSchema(const QString& text);
  // The same with a file's text.
  Q_INVOKABLE QString loadJsonSchema(const QUrl& file);
  QString preset() const;
  QStringList presets() const;
  Q_INVOKABLE void applyPreset(const QString& name);

  // A slider's span for a field ("temperature", "topP", "topK", "minP", "repetitionPenalty",
  // "maxTokens"): inside the engine's range, narrower where the whole range is no use on a
  // slider (top-k to 200, not 2^20). 0 for an unknown field.
  Q_INVOKABLE double sliderFrom(const QString& field) const;
  Q_INVOKABLE double sliderTo(const QString& field) const;
  Q_INVOKABLE double sliderStep(const QString& field) const;

 Q_SIGNALS:
  void changed();

 private:
  template <class Field, class Value>
  void set(Field SamplingSettings::*field, const SamplingRange<Value>& range, Field v) {
    SamplingSettings s = settings();
    s.*field = static_cast<Field>(range.clamp(static_cast<Value>(v)));
    if (s.*field != settings().*field) write_(s);
  }

  Read read_;
  Write write_;
};

}  // namespace granule::app
