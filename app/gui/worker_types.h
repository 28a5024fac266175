// Plain values that cross between the GUI thread and the engine thread in queued signals:
// model facts, fit preview, generation requests, token batches and telemetry frames.
#pragma once
#include <QList>
#include <QMetaType>
#include <QString>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace granule::app {

// What the window says about a model file (from its GGUF header, before or after loading).
struct ModelInfo {
  QString path;
  QString name;           // general.name, or the file name
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
  qint64 engine_context = 0;  // context per chat after loading
};

// The estimate shown before loading: what the weights and KV need against the budget.
struct FitReport {
  bool gpu = false;
  QString budget_source;  // "host memory available" / "VRAM free"
  quint64 budget_bytes = 0;
  quint64 weights_bytes = 0;
  quint64 kv_bytes_per_token = 0;
  quint64 workspace_bytes = 0;
  qint64 context_per_chat = 0;       // what the engine will be opened with
  qint32 chats = 0;                  // sequence slots
  qint64 max_context_that_fits = 0;  // for `chats` sequences at once, capped to the model's
  bool fits = false;
  QString summary;  // one line for the dialog
};

// Per-chat sampling settings (mirrors granule::SamplingParams, in Qt types).
struct SamplingSettings {
  double temperature = 0.7;
  qint32 top_k = 40;
  double top_p = 0.95;
  double min_p = 0.05;
  double repetition_penalty = 1.0;
  qint32 max_tokens = 512;
  quint64 seed = 0;  // 0: a new seed per generation
};

struct PromptMessage {
  QString role;  // "system", "user", "assistant"
  QString content;
};

struct GenerationRequest {
  qint64 chat_id = 0;
  QList<PromptMessage> messages;
  SamplingSettings sampling;
};

// Text that arrived for one chat since the previous batch.
struct TokenChunk {
  qint64 chat_id = 0;
  QString text;
  qint32 tokens = 0;
};

enum class GenerationEnd { Finished, Stopped, Failed };

struct GenerationResult {
  qint64 chat_id = 0;
  GenerationEnd end = GenerationEnd::Finished;
  QString reason;  // engine's finish reason ("eos", "max_tokens", "cancelled", ...)
  QString error;   // the engine's one-line message when end == Failed
};

// The memory ledger's categories in the order the panels stack them (bottom first).
// "kv_pool" (granules created ahead of need, not mapped yet) sits on "kv" so the two greens
// read as one KV band.
inline constexpr std::array<const char*, 7> kLedgerCategories = {
    "weights", "staging", "kv", "kv_pool", "workspace", "graphs", "other"};

// The slot of a ledger category in kLedgerCategories; a category the app does not know
// counts as "other" (the last).
size_t ledgerCategoryIndex(std::string_view category);

struct ChatTelemetry {
  qint64 chat_id = 0;
  qint64 tokens = 0;
  quint64 kv_committed_bytes = 0;
  quint64 kv_reserved_bytes = 0;
  double tokens_per_second = 0;
  bool waiting = false;    // queued for memory (new, or preempted to be recomputed)
  qint32 preemptions = 0;  // times its KV was freed for other chats
};

// One telemetry sample (~10 Hz): the engine's snapshot plus host-side figures.
struct TelemetryFrame {
  double time_s = 0;  // seconds since the worker started
  bool gpu = false;
  QString device;
  quint64 device_total_bytes = 0;
  quint64 budget_bytes = 0;
  std::array<quint64, kLedgerCategories.size()> ledger_bytes{};
  quint64 kv_reserved_bytes = 0;  // virtual address space, not in the stack
  QList<ChatTelemetry> chats;
  quint64 granules_mapped = 0;
  quint64 granules_unmapped = 0;
  quint64 kv_pool_bytes = 0;  // granules created ahead of need, not mapped yet
  quint64 granules_mapped_last_step = 0;
  quint64 granules_created_last_step = 0;  // created on the mapping path: the pool ran dry
  double mapping_us_last_step = 0;
  qint32 waiting_chats = 0;       // chats the KV budget keeps waiting
  quint64 preemptions = 0;        // cumulative
  quint64 recomputed_tokens = 0;  // cumulative: prefilled again after a preemption
  double streamed_bytes_per_second = 0;
  quint64 streamed_bytes_total = 0;
  qint32 layers_resident = 0;
  qint32 layers_streamed = 0;
  QList<qint32> graph_buckets;
  qint32 segments_per_step = 0;
  quint64 graph_replays = 0;
  quint64 graph_recaptures = 0;
  QString last_fallback_reason;
  double decode_tokens_per_second = 0;
  quint64 steps = 0;
  quint64 process_resident_bytes = 0;  // host figures (/proc), shown on the CPU backend
  quint64 host_total_bytes = 0;
  quint64 host_available_bytes = 0;
};

// Registers the types above for queued connections; call once before connecting.
void registerWorkerTypes();

}  // namespace granule::app

Q_DECLARE_METATYPE(granule::app::ModelInfo)
Q_DECLARE_METATYPE(granule::app::FitReport)
Q_DECLARE_METATYPE(granule::app::GenerationRequest)
Q_DECLARE_METATYPE(granule::app::GenerationResult)
Q_DECLARE_METATYPE(granule::app::TelemetryFrame)
Q_DECLARE_METATYPE(granule::app::TokenChunk)
