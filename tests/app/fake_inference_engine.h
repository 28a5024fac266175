// A scripted InferenceEngine for the app's tests: every running sequence gets one token
// ("w0 ", "w1 ", …) per step, like the real engine's batching, with an optional delay per
// step, a failing step (thrown, or reported the way the real engine reports one), and a
// ledger that grows with the tokens. KV is mapped in granules
// taken from a pool (refilled after each step); with the pool empty a step creates them.
// A VRAM budget below the weights streams the layers that do not fit, as the engine's
// placement plan does (set_vram_budget re-plans; below the minimum it is refused).
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "granule/error.h"
#include "inference_engine.h"

namespace granule::app::testing {

struct FakeEngineScript {
  int step_delay_ms = 0;  // simulated compute per step
  int fail_at_step = -1;  // step() throws DeviceError at this step (0-based)
  // At this step (0-based) the step's work fails the way Engine::step reports a failed forward
  // pass or sampler: the affected sequences end with on_finish(Error, error_message) and step()
  // returns normally (true while others remain); nothing throws. Affected: every sequence the
  // step advances, or only the error_only_nth of them (1-based; 0 = all).
  int error_at_step = -1;
  int error_only_nth = 0;
  std::string error_message = "CPU backend: the forward pass failed: cannot allocate 64.0 MiB";
  // At this step (0-based) the device is lost, as the real engine reports it: every chat ends
  // with the reason, step() returns false, submit() throws DeviceLostError.
  int lose_device_at_step = -1;
  bool refuse_submit = false;  // submit() throws CapacityError
  quint64 weights_bytes = 100ull << 20;
  quint64 kv_bytes_per_token = 64ull << 10;
  quint64 kv_reserved_per_sequence = 256ull << 20;
  // When set, replies are these words (cycled) instead of "w0 w1 …".
  std::vector<std::string> reply_words;
  // ModelInfo::reasoning_format: "think" or "harmony" makes the worker split the reply's
  // reasoning from its answer (reply_words then carry the tags).
  std::string reasoning_format;
  // When > 0, only the first this-many sequences advance; later ones wait, as chats do when
  // the KV budget holds them back (reported as waiting in the telemetry).
  int max_running = 0;
  quint64 granule_bytes = 2ull << 20;
  quint64 kv_pool_granules = 14;      // what the pool is topped up to; 0: every granule is created
  double map_us_per_granule = 12;     // mapping a pooled granule
  double create_us_per_granule = 60;  // creating one on the step's path (the pool ran dry)
  int32_t layers = 24;
  quint64 budget_bytes = 1ull << 30;           // when the options name none
  quint64 minimum_budget_bytes = 48ull << 20;  // set_vram_budget below this is refused
};

// Observations the test reads after the worker is done with the engine.
struct FakeEngineLog {
  std::atomic<int> steps{0};
  std::atomic<int> max_batch{0};  // most sequences advanced in one step
  std::atomic<int> submitted{0};
  std::atomic<int> destroyed{0};
  std::atomic<quint64> budget_at_open{0};  // EngineOptions::vram_budget_bytes the factory got
  std::atomic<int> budget_changes{0};      // set_vram_budget calls that were applied
  // The template variables of the last request: 1 = enable_thinking true, 0 = false, -1 unset.
  std::atomic<int> last_enable_thinking{-1};
};

class FakeInferenceEngine final : public InferenceEngine {
 public:
  FakeInferenceEngine(FakeEngineScript script, FakeEngineLog* log)
      : script_(script),
        log_(log),
        pool_granules_(script.kv_pool_granules),
        budget_bytes_(script.budget_bytes) {}
  ~FakeInferenceEngine() override {
    if (log_) log_->destroyed++;
  }

  ModelInfo info() const override {
    ModelInfo info;
    info.path = QStringLiteral("/models/fake.gguf");
    info.name = QStringLiteral("Fake-1M");
    info.architecture = QStringLiteral("llama");
    info.block_type = QStringLiteral("Q4_1");
    info.device = QStringLiteral("CPU (fake)");
    info.engine_context = 4096;
    info.reasoning_format = QString::fromStdString(script_.reasoning_format);
    return info;
  }

  SequenceId submit(Request request) override {
    if (!lost_.empty()) throw DeviceLostError(lost_);
    if (script_.refuse_submit)
      throw CapacityError("prompt of 9000 tokens exceeds the context of 4096");
    const SequenceId id = next_id_++;
    if (log_)
      log_->last_enable_thinking = request.chat_options.enable_thinking
                                       ? (*request.chat_options.enable_thinking ? 1 : 0)
                                       : -1;
    const int prompt = promptTokens(request);
    running_[id] = Running{std::move(request), 0, false, prompt};
    if (log_) log_->submitted++;
    return id;
  }

  void cancel(SequenceId id) override {
    if (auto it = running_.find(id); it != running_.end()) it->second.cancelled = true;
  }

  bool step() override {
    if (running_.empty()) return false;
    const int index = steps_++;
    if (log_) log_->steps++;
    if (index == script_.fail_at_step)
      throw DeviceError("CUDA error: an illegal memory access was encountered");
    if (index == script_.lose_device_at_step) {
      lost_ =
          "the GPU stopped working (CUDA error in attention: an illegal memory access was "
          "encountered); reload the model";
      for (auto& [id, r] : running_) r.request.sink.on_finish(id, FinishReason::Error, lost_);
      running_.clear();
      return false;
    }
    if (script_.step_delay_ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(script_.step_delay_ms));
    if (log_ && static_cast<int>(running_.size()) > log_->max_batch)
      log_->max_batch = static_cast<int>(running_.size());
    granules_mapped_last_step_ = 0;
    granules_created_last_step_ = 0;
    mapping_us_last_step_ = 0;
    int advanced = 0;
    for (auto it = running_.begin(); it != running_.end();) {
      Running& r = it->second;
      FinishReason end = FinishReason::None;
      if (!r.cancelled && script_.max_running > 0 && advanced >= script_.max_running) {
        ++it;  // waiting for memory
        continue;
      }
      ++advanced;
      if (index == script_.error_at_step && !r.cancelled &&
          (script_.error_only_nth == 0 || script_.error_only_nth == advanced)) {
        tokens_done_ += static_cast<quint64>(r.produced);
        granules_unmapped_ += granulesFor(r.produced);
        r.request.sink.on_finish(it->first, FinishReason::Error, script_.error_message);
        it = running_.erase(it);
        continue;
      }
      if (r.cancelled) {
        end = FinishReason::Cancelled;
      } else {
        const std::string word =
            script_.reply_words.empty()
                ? "w" + std::to_string(r.produced) + " "
                : script_.reply_words[static_cast<size_t>(r.produced) % script_.reply_words.size()];
        r.request.sink.on_token(it->first, word, r.produced);
        mapGranules(granulesFor(r.produced + 1) - granulesFor(r.produced));
        if (++r.produced >= r.request.sampling.max_tokens) end = FinishReason::MaxTokens;
      }
      if (end != FinishReason::None) {
        granules_unmapped_ += granulesFor(r.produced);
        tokens_done_ += static_cast<quint64>(r.produced);
        r.request.sink.on_finish(it->first, end, "");
        it = running_.erase(it);
      } else {
        ++it;
      }
    }
    pool_granules_ = script_.kv_pool_granules;  // refilled off the mapping path
    return !running_.empty();
  }

  bool idle() const override { return running_.empty(); }
  std::string device_lost_reason() const override { return lost_; }

  void set_vram_budget(uint64_t bytes) override {
    if (bytes < script_.minimum_budget_bytes)
      throw CapacityError("a VRAM budget of " + std::to_string(bytes >> 20) +
                          " MiB cannot hold the minimum working set of " +
                          std::to_string(script_.minimum_budget_bytes >> 20) + " MiB");
    if (bytes == budget_bytes_) return;
    budget_bytes_ = bytes;
    ++replans_;
    last_replan_reason_ = "the budget changed to " + std::to_string(bytes >> 20) + " MiB";
    if (log_) log_->budget_changes++;
  }

  // Layers that fit beside the workspace and 1/4 of the budget kept for KV stay resident,
  // the rest (from the last layer down) stream.
  int32_t streamedLayers() const {
    const double room = static_cast<double>(budget_bytes_) * 0.75 - (8ull << 20);
    const double per_layer = static_cast<double>(script_.weights_bytes) / script_.layers;
    const int32_t fit =
        static_cast<int32_t>(std::clamp(room / per_layer, 0.0, 1.0 * script_.layers));
    return script_.layers - fit;
  }

  TelemetrySnapshot telemetry() const override {
    TelemetrySnapshot s;
    s.device.name = "CPU";
    s.device.gpu = false;
    s.device.budget_bytes = budget_bytes_;
    quint64 kv = 0;
    int index = 0;
    for (const auto& [id, r] : running_) {
      SequenceTelemetry seq;
      seq.waiting = script_.max_running > 0 && index++ >= script_.max_running;
      s.scheduler.waiting += seq.waiting ? 1 : 0;
      seq.id = id;
      seq.tokens = r.prompt + r.produced;
      seq.kv_committed_bytes = static_cast<quint64>(r.produced) * script_.kv_bytes_per_token;
      seq.kv_reserved_bytes = script_.kv_reserved_per_sequence;
      kv += seq.kv_committed_bytes;
      s.sequences.push_back(seq);
    }
    s.scheduler.running = static_cast<int32_t>(running_.size()) - s.scheduler.waiting;
    auto ledger = [&s](MemoryCategory c) -> uint64_t& {
      return s.device.ledger[static_cast<size_t>(c)];
    };
    const int32_t streamed = streamedLayers();
    const quint64 layer_bytes = script_.weights_bytes / static_cast<quint64>(script_.layers);
    s.streaming.layers_streamed = streamed;
    s.streaming.layers_resident = script_.layers - streamed;
    for (int32_t l = 0; l < script_.layers; ++l)
      s.streaming.layer_streamed.push_back(l >= script_.layers - streamed ? 1 : 0);
    s.streaming.resident_weight_bytes =
        script_.weights_bytes - layer_bytes * static_cast<quint64>(streamed);
    s.streaming.streamed_bytes_per_pass = layer_bytes * static_cast<quint64>(streamed);
    s.streaming.staging_slots = streamed > 0 ? 2 : 0;
    s.streaming.staging_bytes = streamed > 0 ? 2 * layer_bytes : 0;
    s.streaming.replans = replans_;
    s.streaming.last_replan_reason = last_replan_reason_;
    ledger(MemoryCategory::WeightsResident) = s.streaming.resident_weight_bytes;
    ledger(MemoryCategory::WeightsStaging) = s.streaming.staging_bytes;
    ledger(MemoryCategory::KvCommitted) = kv;
    ledger(MemoryCategory::KvPool) = pool_granules_ * script_.granule_bytes;
    ledger(MemoryCategory::Workspace) = 8ull << 20;
    ledger(MemoryCategory::KvReservedVa) = script_.kv_reserved_per_sequence * running_.size();
    for (MemoryCategory c : stackedLedgerCategories()) s.device.used_bytes += ledger(c);
    s.kv.granules_mapped = granules_mapped_;
    s.kv.granules_unmapped = granules_unmapped_;
    s.kv.last_granules_mapped = granules_mapped_last_step_;
    s.kv.last_granules_created = granules_created_last_step_;
    s.kv.last_mapping_us = mapping_us_last_step_;
    s.kv.committed_bytes = kv;
    s.kv.pool_bytes = pool_granules_ * script_.granule_bytes;
    s.kv.pool_target_granules = script_.kv_pool_granules;
    s.throughput.steps = static_cast<uint64_t>(steps_);
    s.throughput.decode_tokens_per_second =
        running_.empty() ? 0.0 : 50.0 * static_cast<double>(running_.size());
    return s;
  }

 private:
  struct Running {
    Request request;
    int produced;
    bool cancelled;
    int prompt;  // the prompt's tokens: its words, plus four per message for the template
  };
  static int promptTokens(const Request& r) {
    if (r.prompt_tokens) return static_cast<int>(r.prompt_tokens->size());
    int tokens = 0;
    for (const ChatMessage& m : r.messages)
      tokens +=
          4 +
          static_cast<int>(
              QString::fromStdString(m.content).split(QLatin1Char(' '), Qt::SkipEmptyParts).size());
    return tokens;
  }

 public:
  // Continue: the history's tokens and the partial reply's words, as one raw prompt.
  void prepare_continuation(Request& request, const std::string& partial) const override {
    const int history = promptTokens(request);
    const int reply = static_cast<int>(
        QString::fromStdString(partial).split(QLatin1Char(' '), Qt::SkipEmptyParts).size());
    request.prompt_tokens = std::vector<TokenId>(static_cast<size_t>(history + reply), 7);
  }

 private:
  quint64 granulesFor(int tokens) const {
    const quint64 bytes = static_cast<quint64>(tokens) * script_.kv_bytes_per_token;
    return (bytes + script_.granule_bytes - 1) / script_.granule_bytes;
  }
  // Maps `count` granules, from the pool while it lasts and created after that.
  void mapGranules(quint64 count) {
    for (quint64 i = 0; i < count; ++i) {
      if (pool_granules_ > 0) {
        --pool_granules_;
      } else {
        ++granules_created_last_step_;
        mapping_us_last_step_ += script_.create_us_per_granule;
      }
      mapping_us_last_step_ += script_.map_us_per_granule;
    }
    granules_mapped_ += count;
    granules_mapped_last_step_ += count;
  }

  FakeEngineScript script_;
  FakeEngineLog* log_;
  quint64 pool_granules_;
  quint64 granules_mapped_ = 0;  // cumulative, like the engine's
  quint64 granules_unmapped_ = 0;
  quint64 granules_mapped_last_step_ = 0;
  quint64 granules_created_last_step_ = 0;
  double mapping_us_last_step_ = 0;
  std::map<SequenceId, Running> running_;
  SequenceId next_id_ = 1;
  int steps_ = 0;
  quint64 tokens_done_ = 0;
  std::string lost_;  // set when the scripted device is lost
  quint64 budget_bytes_;
  uint64_t replans_ = 0;
  std::string last_replan_reason_;
};

// A factory for the worker that opens a FakeInferenceEngine, or throws FormatError for a
// path containing "broken".
inline EngineFactory fakeEngineFactory(FakeEngineScript script = {}, FakeEngineLog* log = nullptr) {
  return [script, log](const std::filesystem::path& path, const EngineOptions& options,
                       const std::function<void(double, const QString&)>& stage)
             -> std::unique_ptr<InferenceEngine> {
    stage(0.5, QStringLiteral("Loading"));
    if (path.string().find("broken") != std::string::npos)
      throw FormatError(path.string() + ": not a GGUF file (bad magic)");
    if (log) log->budget_at_open = options.vram_budget_bytes;
    FakeEngineScript opened = script;
    if (options.vram_budget_bytes > 0) opened.budget_bytes = options.vram_budget_bytes;
    return std::make_unique<FakeInferenceEngine>(opened, log);
  };
}

}  // namespace granule::app::testing
