// Token masks in a backend's sampler (Backend::samples_with_masks), on the CPU: a backend that
// draws in wait() under the masks the engine hands over between launch() and wait() (as the
// CUDA backend's graph waits for them) stands in for the GPU. Constrained and free sequences
// share every step with no step forced to bring logits back; each constrained reply follows
// its constraint; a free neighbour's tokens are those it draws alone; and masks applied in the
// backend's sampler draw exactly what the host-masked path draws (greedy and seeded top-k); and
// ten chats at once, their drawn tokens accepted side by side (ConstrainedSteps::accept_all),
// end as each does alone.
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "granule/engine.h"
#include "runtime/token_constraint.h"
#include "support/engine_chats.h"
#include "support/test_files.h"

namespace granule {
namespace {

// What the masking backend saw, kept by the test (the engine owns the backend).
struct MaskLog {
  int sampled_steps = 0;   // steps launched with sampling
  int logit_steps = 0;     // steps that brought logits back (host draws)
  int masked_steps = 0;    // steps launched with token_masks
  int masked_rows = 0;     // rows drawn under a mask
  int unmasked_waits = 0;  // masked steps waited for without set_token_masks()
  int masks_unasked = 0;   // set_token_masks() for a step launched without token_masks
};

// The CPU backend with a sampler that takes masks: launch() computes the logits, wait() draws
// each row with the host Sampler at the row's draw index, after its mask.
class MaskingSamplerBackend final : public Backend {
 public:
  MaskingSamplerBackend(std::unique_ptr<Backend> inner, MaskLog& log)
      : inner_(std::move(inner)), log_(log) {}

  std::string name() const override { return inner_->name(); }
  bool is_gpu() const override { return false; }
  uint64_t device_total_bytes() const override { return inner_->device_total_bytes(); }
  int64_t kv_bytes_per_token() const override { return inner_->kv_bytes_per_token(); }
  std::unique_ptr<VirtualMemory> make_kv_virtual_memory() override {
    return inner_->make_kv_virtual_memory();
  }
  void attach_kv(KvSpace& kv) override { inner_->attach_kv(kv); }
  bool samples_on_device() const override { return true; }
  bool samples_with_masks() const override { return true; }

  void launch(const StepRequest& step) override {
    step_ = step;
    masks_.clear();
    masks_given_ = false;
    StepRequest forward = step;
    forward.sample = false;
    forward.token_masks = false;
    forward.logits = step.sample ? &logits_ : step.logits;
    (step.sample ? log_.sampled_steps : log_.logit_steps)++;
    if (step.token_masks) ++log_.masked_steps;
    inner_->launch(forward);
  }

  void set_token_masks(std::span<const uint32_t* const> masks) override {
    if (!step_.token_masks) ++log_.masks_unasked;
    masks_given_ = true;
    masks_.assign(step_.batch.size(), {});
    for (size_t i = 0; i < masks.size() && i < masks_.size(); ++i)
      if (masks[i]) masks_[i].assign(masks[i], masks[i] + (n_vocab() + 31) / 32);
  }

  StepResult wait() override {
    StepResult result = inner_->wait();
    if (!step_.sample) return result;
    if (step_.token_masks && !masks_given_) ++log_.unmasked_waits;
    const size_t rows = step_.batch.size();
    const size_t width = logits_.size() / rows;
    result.tokens.clear();
    for (size_t i = 0; i < rows; ++i) {
      std::span<float> row(logits_.data() + i * width, width);
      if (i < masks_.size() && !masks_[i].empty()) {
        apply_token_mask(row, masks_[i]);
        ++log_.masked_rows;
      }
      Sampler sampler(step_.params[i]);
      sampler.set_draw_index(step_.draw_index[i]);
      result.tokens.push_back(sampler.sample(row, step_.history[i]));
    }
    result.logit_rows = 0;
    return result;
  }

 private:
  size_t n_vocab() const { return logits_.size() / std::max<size_t>(step_.batch.size(), 1); }

  std::unique_ptr<Backend> inner_;
  MaskLog& log_;
  StepRequest step_;
  std::vector<float> logits_;
  std::vector<std::vector<uint32_t>> masks_;
  bool masks_given_ = false;
};

struct Reply {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason reason = FinishReason::None;
  std::string error;
};

Request chat(const std::string& question, Constraint constraint, Reply& out, int32_t max_tokens,
             SamplingParams sampling = SamplingParams::greedy()) {
  Request r;
  r.messages = {{"user", question}};
  r.sampling = sampling;
  r.sampling.max_tokens = max_tokens;
  r.constraint = std::move(constraint);
  r.sink.on_token = [&out](SequenceId, const std::string& text, int32_t token) {
    out.text += text;
    if (token != kNoToken) out.tokens.push_back(token);
  };
  r.sink.on_finish = [&out](SequenceId, FinishReason reason, const std::string& error) {
    out.reason = reason;
    out.error = error;
  };
  return r;
}

// The CPU engine, its sampler the masking backend's when `log` is given.
std::unique_ptr<Engine> open_engine(MaskLog* log, int32_t chats = 4) {
  EngineOptions o = test::cpu_engine_options(1024, chats);
  if (log) {
    o.wrap_backend = [log](std::unique_ptr<Backend> inner) -> std::unique_ptr<Backend> {
      return std::make_unique<MaskingSamplerBackend>(std::move(inner), *log);
    };
  }
  return Engine::open(test::default_model_path(), o);
}

void run(Engine& engine, int* mixed_device_masked_steps = nullptr) {
  for (int i = 0; i < 5000 && engine.step(); ++i) {
    const TelemetrySnapshot t = engine.telemetry();
    if (mixed_device_masked_steps && t.throughput.device_masked_sequences > 0 &&
        t.throughput.device_masked_sequences < t.scheduler.running)
      ++*mixed_device_masked_steps;
  }
  EXPECT_TRUE(engine.idle());
}

const std::string kPersonSchema =
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":20},)"
    R"("age":{"type":"integer","minimum":0,"maximum":150}},"required":["name","age"],)"
    R"("additionalProperties":false})";

TEST(EngineConstraintMasks, BackendSamplerMasksBesideAFreeNeighbour) {
  if (test::default_model_path().empty()) GTEST_SKIP() << test::kNoDefaultModel;
  if (!structured_output_available()) GTEST_SKIP() << kNoStructuredOutputMessage;
  Reply alone;
  {
    auto engine = open_engine(nullptr);
    engine->submit(chat("What is the capital of France?", {}, alone, 24));
    run(*engine);
  }
  MaskLog log;
  auto engine = open_engine(&log);
  Reply schema, grammar, free;
  engine->submit(
      chat("Describe a person as JSON.", Constraint::json_schema(kPersonSchema), schema, 96));
  engine->submit(chat("What is the capital of France?", {}, free, 24));
  engine->submit(chat("Is Paris in France?",
                      Constraint::grammar(R"(root ::= ("yes" | "no") ", " [a-z ]{1,20} ".")"),
                      grammar, 48));
  int mixed_steps = 0;
  run(*engine, &mixed_steps);

  EXPECT_EQ(log.logit_steps, 0) << "a step brought its logits back for the host to draw";
  EXPECT_GT(log.masked_steps, 0);
  EXPECT_GT(log.masked_rows, 0);
  EXPECT_EQ(log.unmasked_waits, 0) << "the engine waited for a masked step without its masks";
  EXPECT_EQ(log.masks_unasked, 0);
  EXPECT_GT(mixed_steps, 0) << "masked and free sequences never shared a step";

  EXPECT_EQ(schema.reason, FinishReason::Eos) << schema.text << " " << schema.error;
  EXPECT_TRUE(std::regex_match(schema.text,
                               std::regex(R"(\{"name": "[^"]{0,20}", "age": (0|[1-9][0-9]*)\})")))
      << schema.text;
  EXPECT_EQ(grammar.reason, FinishReason::Eos) << grammar.text << " " << grammar.error;
  EXPECT_TRUE(std::regex_match(grammar.text, std::regex(R"((yes|no), [a-z ]{1,20}\.)")))
      << grammar.text;
  EXPECT_NE(free.reason, FinishReason::Error) << free.error;
  EXPECT_EQ(free.tokens, alone.tokens)
      << "beside constrained chats: " << free.text << " | alone: " << alone.text;
}

TEST(EngineConstraintMasks, BackendMasksDrawWhatHostMasksDraw) {
  if (test::default_model_path().empty()) GTEST_SKIP() << test::kNoDefaultModel;
  if (!structured_output_available()) GTEST_SKIP() << kNoStructuredOutputMessage;
  SamplingParams top_k;
  top_k.temperature = 0.9f;
  top_k.top_k = 40;
  top_k.top_p = 0.95f;
  top_k.seed = 1234;
  const auto submit_all = [&](Engine& engine, std::vector<Reply>& out) {
    out.resize(4);
    engine.submit(
        chat("Describe a person as JSON.", Constraint::json_schema(kPersonSchema), out[0], 64));
    engine.submit(chat("Describe a person as JSON.", Constraint::json_schema(kPersonSchema), out[1],
                       64, top_k));
    engine.submit(
        chat("Give me a JSON object about Paris.", Constraint::json_object(), out[2], 48, top_k));
    engine.submit(chat("Tell me about Paris.", {}, out[3], 32, top_k));
  };
  std::vector<Reply> host, device;
  {
    auto engine = open_engine(nullptr);
    submit_all(*engine, host);
    run(*engine);
  }
  MaskLog log;
  auto engine = open_engine(&log);
  submit_all(*engine, device);
  run(*engine);
  EXPECT_EQ(log.logit_steps, 0);
  EXPECT_GT(log.masked_rows, 0);
  for (size_t i = 0; i < host.size(); ++i) {
    EXPECT_NE(host[i].reason, FinishReason::Error) << i << ": " << host[i].error;
    EXPECT_EQ(device[i].reason, host[i].reason) << i << ": " << device[i].error;
    EXPECT_EQ(device[i].tokens, host[i].tokens)
        << i << ": backend masks: " << device[i].text << " | host masks: " << host[i].text;
  }
}

TEST(EngineConstraintMasks, ManyChatsAcceptedTogetherEndAsEachAlone) {
  if (test::default_model_path().empty()) GTEST_SKIP() << test::kNoDefaultModel;
  if (!structured_output_available()) GTEST_SKIP() << kNoStructuredOutputMessage;
  SamplingParams top_k;
  top_k.temperature = 0.9f;
  top_k.top_k = 40;
  top_k.top_p = 0.95f;
  top_k.seed = 77;
  const std::string city =
      R"({"type":"object","properties":{"city":{"type":"string","maxLength":16},)"
      R"("population":{"type":"integer","minimum":0}},"required":["city","population"]})";
  const std::string numbers =
      R"({"type":"array","items":{"type":"integer","minimum":0,"maximum":99},"maxItems":5})";
  // Ten chats, nine constrained (schemas, grammars, a JSON object), one of them cut after 6
  // tokens and one whose grammar ends after a word, beside a free one.
  const auto requests = [&](std::vector<Reply>& out) {
    out.resize(10);
    std::vector<Request> r;
    r.push_back(
        chat("Describe a person as JSON.", Constraint::json_schema(kPersonSchema), out[0], 96));
    r.push_back(chat("Is Paris in France?",
                     Constraint::grammar(R"(root ::= ("yes" | "no") ", " [a-z ]{1,20} ".")"),
                     out[1], 48));
    r.push_back(
        chat("Give me a JSON object about Paris.", Constraint::json_object(), out[2], 48, top_k));
    r.push_back(chat("Name a big city as JSON.", Constraint::json_schema(city), out[3], 64));
    r.push_back(chat("List a few small numbers.", Constraint::json_schema(numbers), out[4], 48));
    r.push_back(
        chat("Describe an old man as JSON.", Constraint::json_schema(kPersonSchema), out[5], 6));
    r.push_back(chat("Say ok.", Constraint::grammar(R"(root ::= "ok" | "okay")"), out[6], 32));
    r.push_back(chat("How many legs has a spider?", Constraint::grammar(R"(root ::= [0-9]{1,4})"),
                     out[7], 16));
    r.push_back(chat("Describe a child as JSON.", Constraint::json_schema(kPersonSchema), out[8],
                     64, top_k));
    r.push_back(chat("What is the capital of France?", {}, out[9], 24));
    return r;
  };
  std::vector<Reply> alone;
  {
    MaskLog log;
    auto engine = open_engine(&log);
    for (Request& r : requests(alone)) {
      engine->submit(std::move(r));
      run(*engine);
    }
  }
  MaskLog log;
  auto engine = open_engine(&log, 10);
  std::vector<Reply> together;
  for (Request& r : requests(together)) engine->submit(std::move(r));
  int most_masked = 0;
  for (int i = 0; i < 5000 && engine->step(); ++i)
    most_masked = std::max(most_masked, engine->telemetry().throughput.device_masked_sequences);
  EXPECT_TRUE(engine->idle());
  EXPECT_EQ(log.logit_steps, 0);
  EXPECT_GE(most_masked, 8) << "the constrained chats never shared a step";

  for (size_t i = 0; i < alone.size(); ++i) {
    EXPECT_NE(alone[i].reason, FinishReason::Error) << i << ": " << alone[i].error;
    EXPECT_EQ(together[i].reason, alone[i].reason) << i << ": " << together[i].error;
    EXPECT_EQ(together[i].error, alone[i].error) << i;
    EXPECT_EQ(together[i].text, alone[i].text) << i;
    EXPECT_EQ(together[i].tokens, alone[i].tokens) << i;
  }
  EXPECT_EQ(together[5].reason, FinishReason::MaxTokens) << together[5].text;
  EXPECT_EQ(together[6].reason, FinishReason::Eos) << together[6].text;
  EXPECT_TRUE(together[6].text == "ok" || together[6].text == "okay") << together[6].text;
  EXPECT_TRUE(std::regex_match(together[7].text, std::regex("[0-9]{1,4}"))) << together[7].text;
}

}  // namespace
}  // namespace granule
