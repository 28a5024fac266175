// InferenceEngine over the real granule::Engine, and the factory that opens it.
#include <algorithm>

#include "granule/chat_template.h"
#include "granule/tokenizer.h"
#include "inference_engine.h"
#include "model_inspector.h"

namespace granule::app {
namespace {

class GranuleInferenceEngine final : public InferenceEngine {
 public:
  GranuleInferenceEngine(std::unique_ptr<Engine> engine, ModelInfo info)
      : engine_(std::move(engine)), info_(std::move(info)) {}

  ModelInfo info() const override { return info_; }
  SequenceId submit(Request request) override { return engine_->submit(std::move(request)); }
  void cancel(SequenceId id) override { engine_->cancel(id); }
  bool step() override { return engine_->step(); }
  bool idle() const override { return engine_->idle(); }
  TelemetrySnapshot telemetry() const override { return engine_->telemetry(); }
  std::string device_lost_reason() const override { return engine_->device_lost_reason(); }
  void set_vram_budget(uint64_t bytes) override { engine_->set_vram_budget(bytes); }
  Engine* granuleEngine() override { return engine_.get(); }
  void prepare_continuation(Request& request, const std::string& partial) const override {
    const ChatTemplate* tmpl = engine_->chat_template();
    if (!tmpl) {
      throw UnsupportedError(
          "this model's chat template is not recognised, so a reply cannot be continued");
    }
    const Tokenizer& tokenizer = engine_->tokenizer();
    std::string bos_text;
    if (auto bos = tokenizer.bos()) bos_text = tokenizer.token_text(*bos);
    // The history with the assistant header, then the reply so far: the model's next token
    // continues the reply. The reply's own text is not parsed for control tokens.
    std::vector<TokenId> prompt =
        tokenizer.encode(tmpl->render(request.messages, true, bos_text), false, true);
    const std::vector<TokenId> reply = tokenizer.encode(partial, false, false);
    prompt.insert(prompt.end(), reply.begin(), reply.end());
    request.prompt_tokens = std::move(prompt);
    for (const std::string& stop : tmpl->stop_strings())
      request.sampling.stop_strings.push_back(stop);
  }

 private:
  std::unique_ptr<Engine> engine_;
  ModelInfo info_;
};

}  // namespace

EngineFactory granuleEngineFactory() {
  return [](const std::filesystem::path& model, const EngineOptions& options,
            const std::function<void(double, const QString&)>& stage)
             -> std::unique_ptr<InferenceEngine> {
    // Engine::open reports no progress of its own, so the stages are the steps around it:
    // reading the header is quick; opening maps the weights and reserves KV space.
    stage(0.1, QStringLiteral("Reading the model file"));
    ModelInfo info = modelInfo(model, Engine::estimate(model, options));
    stage(0.3, QStringLiteral("Loading weights and reserving KV space"));
    auto engine = Engine::open(model, options);
    info.device = QString::fromStdString(engine->device_name());
    // The engine clamps the context to the model's trained one.
    info.engine_context = info.trained_context > 0
                              ? std::min<qint64>(options.context_length, info.trained_context)
                              : options.context_length;
    if (const ChatTemplate* tmpl = engine->chat_template()) {
      info.chat_template = QString::fromStdString(tmpl->name());
      if (tmpl->reasoning_format() == ReasoningFormat::Think)
        info.reasoning_format = QStringLiteral("think");
      else if (tmpl->reasoning_format() == ReasoningFormat::Harmony)
        info.reasoning_format = QStringLiteral("harmony");
    }
    stage(1.0, QStringLiteral("Ready"));
    return std::make_unique<GranuleInferenceEngine>(std::move(engine), std::move(info));
  };
}

}  // namespace granule::app
