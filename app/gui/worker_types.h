// Plain values that cross between the GUI thread and the engine thread in queued signals:
// model facts, the engine's fit preview, generation requests, token batches and telemetry
// frames.
#pragma once
#include <QtQml/qqmlregistration.h>

#include <QList>
#include <QMetaType>
#include <QString>
#include <QVariantList>
#include <QVariantMap>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "granule/engine.h"     // FitEstimate
#include "granule/sampling.h"   // kSamplingRanges, kRandomSeed
#include "granule/telemetry.h"  // TelemetrySnapshot

namespace granule::app {

// What the window says about a model file (from the engine's estimate, before or after
// loading).
struct ModelInfo {
  QString path;
  QString name;           // the model's name, or the file name
  QString architecture;   // "llama", "qwen2", ...
  QString block_type;     // dominant weight block type, "Q4_1"
  QString chat_template;  // "chatml", or "" when none was recognised
  QString device;         // "CPU (2 threads)"; empty before loading
  qint64 file_bytes = 0;
  qint64 parameters = 0;  // elements over all tensors
  qint64 layers = 0;
  qint64 hidden = 0;
  qint64 heads = 0;
  qint64 kv_heads = 0;
  qint64 vocab = 0;
  qint64 trained_context = 0;
  qint64 engine_context = 0;         // context per chat after loading
  quint64 weights_bytes = 0;         // the estimate's weights, resident and streamed
  quint64 minimum_budget_bytes = 0;  // the least VRAM budget the placement plan runs in
  // How the model's replies carry reasoning: "think" (<think> blocks, Qwen3), "harmony"
  // (gpt-oss channels; its effort is low/medium/high) or "" (none).
  QString reasoning_format;
};

// Per-chat sampling settings: the fields of granule::SamplingParams the window lets a user
// set, in Qt types, with the engine's defaults (kSamplingRanges, the "balanced" preset).
struct SamplingSettings {
  double temperature = kSamplingRanges.temperature.default_value;
  qint32 top_k = kSamplingRanges.top_k.default_value;
  double top_p = kSamplingRanges.top_p.default_value;
  double min_p = kSamplingRanges.min_p.default_value;
  double repetition_penalty = kSamplingRanges.repetition_penalty.default_value;
  qint32 max_tokens = kSamplingRanges.max_tokens.default_value;
  quint64 seed = kRandomSeed;  // kRandomSeed: a new seed per reply; 0 is a seed like any other
  // The chat's reasoning setting, for models that reason: "" the template's default (on),
  // "off" (enable_thinking false), or an effort "low" / "medium" / "high" (gpt-oss).
  QString reasoning;
  // The chat's "JSON output": "" free text, "object" any JSON object, "schema" JSON valid under
  // json_schema (checked when it was entered: jsonSchemaProblem()).
  QString json_output;
  QString json_schema;
};

struct PromptMessage {
  QString role;  // "system", "user", "assistant", "tool"
  QString content;
  // Tool use (rendered by the model's Jinja template): an assistant message's calls as OpenAI's
  // tool_calls array, a tool message's call id and tool name.
  QString tool_calls_json = {};
  QString tool_call_id = {};
  QString name = {};
};

// A tool call the model wrote (parsed from its reply in its template's format).
struct ToolCallText {
  QString id;
  QString name;
  QString arguments;  // a JSON object's text
};

// A stream from an endpoint that sends nothing (not even a keep-alive) for this long ends as
// stalled, unless the endpoint's settings say otherwise (Settings → Endpoints).
constexpr qint32 kDefaultStallTimeoutSeconds = 60;
constexpr qint32 kMinStallTimeoutSeconds = 2;
constexpr qint32 kMaxStallTimeoutSeconds = 3600;

// What a request to an endpoint takes from its settings: the API key ("" sends none) and the
// stall timeout. `error`: the key could not be read (the keychain failed or did not answer),
// and the request fails with this line rather than go out without it.
struct EndpointAccess {
  QString api_key;
  qint32 stall_timeout_seconds = kDefaultStallTimeoutSeconds;
  QString error;
};

struct GenerationRequest {
  qint64 chat_id = 0;
  QList<PromptMessage> messages;
  SamplingSettings sampling;
  // Continue: the last message is an assistant reply cut at the length limit; the model
  // goes on writing it (no new turn).
  bool continue_last = false;
  // Where the chat runs: "" the window's loaded model; "URL#model" a model on an
  // OpenAI-compatible endpoint (EndpointsController), reached with `api_key` ("" sends none) and
  // ended as stalled after `stall_timeout_seconds` of silence (both the endpoint's settings).
  QString engine;
  QString api_key;
  qint32 stall_timeout_seconds = kDefaultStallTimeoutSeconds;
  // Tools the model may call: OpenAI's tools array ("" none). tool_choice: "" the model
  // decides, "required" a call to any of them, or one tool's name (the reply is constrained to
  // a call in the template's format).
  QString tools_json;
  QString tool_choice;
};

// Text that arrived for one chat since the previous batch.
struct TokenChunk {
  qint64 chat_id = 0;
  QString text;       // the answer
  QString reasoning;  // the model's reasoning (ReasoningParser), before the answer
  qint32 tokens = 0;
  qint32 prompt_tokens = 0;  // the request's prompt, as the engine tokenized it (0: unknown)
  qint32 reused_tokens = 0;  // of them, read from KV the chat kept from its earlier turns
  // Messages (after the system prompt) the engine left out so the conversation fits the
  // context: the model's view begins at that row of the chat.
  qint32 dropped_messages = 0;
  QList<ToolCallText> tool_calls;  // calls completed in this batch
};

enum class GenerationEnd { Finished, Stopped, Failed };

struct GenerationResult {
  qint64 chat_id = 0;
  GenerationEnd end = GenerationEnd::Finished;
  QString reason;            // engine's finish reason ("eos", "max_tokens", "cancelled", ...)
  QString error;             // the engine's one-line message when end == Failed
  qint32 prompt_tokens = 0;  // the request's prompt (0: unknown)
};

// Host figures from /proc, measured by the worker beside each engine snapshot.
struct HostTelemetry {
  quint64 process_resident_bytes = 0;
  quint64 total_bytes = 0;
  quint64 available_bytes = 0;

  template <class Self, class F>
  static void fields(Self& s, F&& f) {
    f("process_resident_bytes", s.process_resident_bytes);
    f("total_bytes", s.total_bytes);
    f("available_bytes", s.available_bytes);
  }
};

// One chat's row in the KV panel: the engine's figures for the chat's sequence.
struct ChatTelemetry {
  qint64 chat_id = 0;
  SequenceTelemetry sequence;
  // Waiting while every chat slot is taken (the engine runs as many chats as it has slots);
  // a chat that waits with a slot free waits for memory (the KV budget holds it back).
  bool waiting_for_slot = false;
};

// One completion the window's OpenAI server is running, with the engine's figures for its
// sequence: a row of the sidebar's "API requests" and of the KV panel.
struct ApiRequestTelemetry {
  QString request_id;  // the response's id, "chatcmpl-1733-4"
  QString endpoint;    // "chat" (/v1/chat/completions) or "completions" (/v1/completions)
  bool stream = false;
  qint64 prompt_tokens = 0;
  qint64 completion_tokens = 0;  // generated so far
  // "waiting" (for a slot or memory), "prefill", "generating" or "finishing" (the engine is
  // done, the response is being written).
  QString state;
  SequenceTelemetry sequence;  // only its id once the engine has let the sequence go
};

// The window's OpenAI server as the user set it (Settings, persisted).
struct ServeSettings {
  bool enabled = false;
  QString host = QStringLiteral("127.0.0.1");
  qint32 port = 8080;  // 0: any free port (the tests)
  QString api_key;     // "": none needed
};

// What the worker made of ServeSettings.
struct ServingStatus {
  // Waiting: on, but no model is loaded (it serves once one is).
  enum class State { Off, Waiting, Serving, Failed };
  State state = State::Off;
  QString host;
  qint32 port = 0;  // the bound port while serving
  QString error;    // one line, when Failed
};

// The ledger categories the panels stack, bottom first: those charged to the budget (all but
// reserved address space), in the engine's order.
const std::vector<MemoryCategory>& stackedLedgerCategories();

namespace detail {
QString camelCase(std::string_view snake);
QVariant fieldValue(bool value);
QVariant fieldValue(double value);
QVariant fieldValue(const std::string& value);
QVariant fieldValue(const std::vector<int32_t>& value);
QVariant fieldValue(const Ledger& value);
template <class T>
requires std::is_integral_v<T> QVariant fieldValue(T value) {
  return fieldValue(static_cast<double>(value));
}
}  // namespace detail

// A section's fields by their for_each_field names in camelCase (pool_bytes: poolBytes):
// numbers as doubles, text as strings, lists as lists, the ledger as bytes by category name.
template <class Section>
QVariantMap sectionFields(const Section& section) {
  QVariantMap fields;
  for_each_field(section, [&fields](std::string_view name, const auto& value) {
    fields.insert(detail::camelCase(name), detail::fieldValue(value));
  });
  return fields;
}

// One telemetry sample (~10 Hz): the engine's snapshot as the engine wrote it, the chats its
// sequences belong to, and host figures. The same value goes from the worker to the model's
// history and to QML, where each section reads as a map of its fields (frame.kv.poolBytes):
// a metric the engine adds to a section reaches QML without code here. The sections are
// QVariant (`var` in QML): their fields are the engine's to name, and qmllint would look a
// declared QVariantMap's keys up as members of QVariantMap itself.
struct TelemetryFrame {
  Q_GADGET
  QML_VALUE_TYPE(telemetryFrame)
  Q_PROPERTY(bool hasEngine MEMBER has_engine)
  Q_PROPERTY(double timeS MEMBER time_s)
  Q_PROPERTY(QVariant device READ deviceFields)
  Q_PROPERTY(QVariant kv READ kvFields)
  Q_PROPERTY(QVariant scheduler READ schedulerFields)
  Q_PROPERTY(QVariant graphs READ graphsFields)
  Q_PROPERTY(QVariant streaming READ streamingFields)
  Q_PROPERTY(QVariant throughput READ throughputFields)
  Q_PROPERTY(QVariant host READ hostFields)
  // A remote engine's figures from its server's /metrics (InferenceEngine::remoteMetrics);
  // empty for the local engine. A figure the server does not expose is absent (undefined).
  Q_PROPERTY(QVariant remote READ remoteFields)
  // Completions the window's OpenAI server runs now.
  Q_PROPERTY(int apiRequests READ apiRequestCount)

 public:
  double time_s = 0;        // seconds since the worker started
  bool has_engine = false;  // a model is loaded and `engine` is its snapshot
  TelemetrySnapshot engine;
  QVariantMap remote;  // remoteFields()
  // Tokens the engine has generated for the chats and the API server since the worker
  // started (live frames only; a replayed recording has none): the panels' recent tokens/s is
  // its change over seconds.
  bool counts_tokens = false;
  quint64 generated_tokens = 0;
  QList<ChatTelemetry> chats;  // the snapshot's sequences that belong to chats
  // The completions the window's OpenAI server runs (empty while it is off).
  QList<ApiRequestTelemetry> api_requests;
  HostTelemetry host;

  QVariantMap deviceFields() const { return sectionFields(engine.device); }
  QVariantMap remoteFields() const { return remote; }
  QVariantMap kvFields() const { return sectionFields(engine.kv); }
  QVariantMap schedulerFields() const { return sectionFields(engine.scheduler); }
  QVariantMap graphsFields() const { return sectionFields(engine.graphs); }
  QVariantMap streamingFields() const { return sectionFields(engine.streaming); }
  QVariantMap throughputFields() const { return sectionFields(engine.throughput); }
  QVariantMap hostFields() const { return sectionFields(host); }
  int apiRequestCount() const { return static_cast<int>(api_requests.size()); }
};

// Registers the types above for queued connections; call once before connecting.
void registerWorkerTypes();

}  // namespace granule::app

Q_DECLARE_METATYPE(granule::app::ModelInfo)
Q_DECLARE_METATYPE(granule::FitEstimate)
Q_DECLARE_METATYPE(granule::app::GenerationRequest)
Q_DECLARE_METATYPE(granule::app::GenerationResult)
Q_DECLARE_METATYPE(granule::app::TelemetryFrame)
Q_DECLARE_METATYPE(granule::app::TokenChunk)
Q_DECLARE_METATYPE(granule::app::ServeSettings)
Q_DECLARE_METATYPE(granule::app::ServingStatus)
