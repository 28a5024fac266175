// The engine's host work per decode step for N chats, all JSON-schema constrained or all free,
// with the device replaced by a stand-in that samples with masks as the CUDA backend does:
// launch() returns at once, wait() returns DEVICE_US after launch() with a token per row drawn
// at random from the row's mask (any of ids 3-999 when unmasked). The model: a one-layer
// synthetic one with the 8B model's vocabulary (128,256 ids, as `granule-write-model
// llama3-8b` writes it), in /tmp. Prints the mean plan/launch/overlap/wait/results/mask
// microseconds of the engine's telemetry over the steps where all N decode (after 3), and the
// step time beyond DEVICE_US (sleep overshoot included: compare free against schema).
//
// Build against a configured build/ (issue 38's measurements: `build` = the worktree's):
//   B=build; g++ -O2 -std=c++20 -DFMT_SHARED -DGRANULE_HAVE_CUDA=1 -DSPDLOG_COMPILED_LIB \
//     -DSPDLOG_FMT_EXTERNAL -DSPDLOG_SHARED_LIB -Iengine/src -Iengine/include -Ikernels \
//     -Iengine/testkit/include -I/usr/local/cuda/include dev/constraint_host_bench.cpp \
//     -o /tmp/constraint_host_bench $B/engine/testkit/libgranule_testkit.a \
//     $B/engine/libgranule_engine.a $B/kernels/libgranule_kernels.a \
//     /usr/local/cuda/lib/libcudart_static.a $B/engine/libgranule_engine.a \
//     $B/engine/libgranule_jinja.a $B/engine/libgranule_xgrammar.a -lspdlog -lfmt -lpcre2-8 \
//     -lrt -ldl -lpthread
// Run: /tmp/constraint_host_bench CHATS DEVICE_US free|schema [N_VOCAB] [GENERATE]
//   e.g. 32 5300 schema (an 8B step of 32 rows on an H100 is ~5.3-5.6 ms), 1 1900 schema.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <thread>

#include "backends/backend.h"
#include "granule/engine.h"
#include "granule/testkit/synthetic_model.h"

using namespace granule;
using Clock = std::chrono::steady_clock;

class StandIn final : public Backend {
 public:
  StandIn(std::unique_ptr<Backend> inner, int64_t n_vocab, double device_us)
      : inner_(std::move(inner)), n_vocab_(n_vocab), device_us_(device_us) {}
  std::string name() const override { return "stand-in"; }
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
    start_ = Clock::now();
    step_ = step;
    masks_.assign(step.batch.size(), nullptr);
    copies_.resize(step.batch.size());
  }
  void set_token_masks(std::span<const uint32_t* const> masks) override {
    const size_t words = static_cast<size_t>((n_vocab_ + 31) / 32);
    for (size_t i = 0; i < masks.size() && i < masks_.size(); ++i) {
      if (!masks[i]) continue;
      copies_[i].assign(masks[i], masks[i] + words);  // the pinned table's copy
      masks_[i] = copies_[i].data();
    }
  }
  StepResult wait() override {
    // The draw runs before the sleep: the device's time covers it (a GPU draws in microseconds;
    // 32 scans of a 128k mask here take ~100 us).
    const auto done = start_ + std::chrono::nanoseconds(static_cast<int64_t>(device_us_ * 1000));
    StepResult r = draw();
    std::this_thread::sleep_until(done);
    return r;
  }

 private:
  StepResult draw() {
    StepResult r;
    if (!step_.sample) {
      size_t rows = 0;
      for (const BatchSequence& s : step_.batch) rows += s.all_logits ? s.tokens.size() : 1;
      step_.logits->assign(rows * static_cast<size_t>(n_vocab_), 0.0f);
      r.logit_rows = static_cast<int64_t>(rows);
      return r;
    }
    const size_t words = static_cast<size_t>((n_vocab_ + 31) / 32);
    for (size_t i = 0; i < step_.batch.size(); ++i) {
      if (!masks_[i]) {
        r.tokens.push_back(static_cast<int32_t>(3 + rng_() % 997));
        continue;
      }
      // A random allowed token: a random start, the first allowed bit from it on.
      const size_t first = rng_() % words;
      int32_t token = 0;
      for (size_t k = 0; k < words; ++k) {
        const size_t w = (first + k) % words;
        if (uint32_t bits = masks_[i][w]) {
          int skip = static_cast<int>(rng_() % std::max(1, __builtin_popcount(bits)));
          while (skip-- > 0) bits &= bits - 1;
          token = static_cast<int32_t>(w * 32 + __builtin_ctz(bits));
          break;
        }
      }
      r.tokens.push_back(token);
    }
    return r;
  }

  std::unique_ptr<Backend> inner_;
  int64_t n_vocab_;
  double device_us_;
  Clock::time_point start_;
  StepRequest step_;
  std::vector<const uint32_t*> masks_;
  std::vector<std::vector<uint32_t>> copies_;
  std::mt19937_64 rng_{1};
};

int main(int argc, char** argv) {
  const int chats = argc > 1 ? std::atoi(argv[1]) : 32;
  const double device_us = argc > 2 ? std::atof(argv[2]) : 5000;
  const bool constrained = argc > 3 && std::string(argv[3]) == "schema";
  const int64_t n_vocab = argc > 4 ? std::atoll(argv[4]) : 128256;
  const int generate = argc > 5 ? std::atoi(argv[5]) : 128;
  const std::filesystem::path model = std::filesystem::temp_directory_path() /
                                      ("granule-host-bench-" + std::to_string(n_vocab) + ".gguf");
  if (!std::filesystem::exists(model)) {
    SyntheticModelSpec s;
    s.n_layer = 1;
    s.n_embd = 64;
    s.n_head = 2;
    s.n_head_kv = 1;
    s.n_ff = 64;
    s.n_vocab = n_vocab;
    s.context_length = 4096;
    write_synthetic_model(s, model);
  }
  EngineOptions o;
  o.device = DeviceKind::Cpu;
  o.max_sequences = chats;
  o.context_length = 1024;
  o.kv_reuse = false;
  o.wrap_backend = [&](std::unique_ptr<Backend> inner) -> std::unique_ptr<Backend> {
    return std::make_unique<StandIn>(std::move(inner), n_vocab, device_us);
  };
  auto engine = Engine::open(model, o);
  const std::string schema =
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":40},)"
      R"("age":{"type":"integer","minimum":0,"maximum":150},)"
      R"("email":{"type":"string"},"tags":{"type":"array","items":{"type":"string"}},)"
      R"("address":{"type":"object","properties":{"street":{"type":"string"},)"
      R"("city":{"type":"string"},"zip":{"type":"string","pattern":"^[0-9]{5}$"}},)"
      R"("required":["street","city","zip"]}},"required":["name","age","email","tags","address"]})";
  std::mt19937_64 rng(7);
  int finished = 0, errors = 0;
  std::string first_error;
  for (int i = 0; i < chats; ++i) {
    Request r;
    std::vector<TokenId> prompt;
    for (int t = 0; t < 128; ++t) prompt.push_back(static_cast<TokenId>(3 + rng() % 900));
    r.prompt_tokens = prompt;
    r.sampling = SamplingParams::greedy();
    r.sampling.max_tokens = generate;
    if (constrained) r.constraint = Constraint::json_schema(schema);
    r.sink.on_finish = [&](SequenceId, FinishReason reason, const std::string& error) {
      ++finished;
      if (reason == FinishReason::Error && errors++ == 0) first_error = error;
    };
    engine->submit(std::move(r));
  }
  double sum[7] = {};
  std::vector<double> over;
  int steps = 0;
  while (true) {
    const auto a = Clock::now();
    if (!engine->step()) break;
    const double ms = std::chrono::duration<double, std::micro>(Clock::now() - a).count();
    const TelemetrySnapshot t = engine->telemetry();
    const auto& th = t.throughput;
    if (finished > 0 || th.last_decode_sequences != chats) continue;
    if (steps++ < 3) continue;  // warm-up
    sum[0] += th.last_plan_us;
    sum[1] += th.last_launch_us;
    sum[2] += th.last_overlap_us;
    sum[3] += th.last_wait_us;
    sum[4] += th.last_results_us;
    sum[5] += th.last_mask_us;
    sum[6] += ms;
    over.push_back(ms - device_us);
  }
  const int n = std::max(steps - 3, 1);
  std::sort(over.begin(), over.end());
  std::printf(
      "chats %d %s device %.0f us: %d steps; mean us plan %.1f launch %.1f overlap %.1f wait %.1f "
      "results %.1f mask %.1f step %.1f; beyond device: median %.1f mean %.1f%s%s\n",
      chats, constrained ? "schema" : "free", device_us, n, sum[0] / n, sum[1] / n, sum[2] / n,
      sum[3] / n, sum[4] / n, sum[5] / n, sum[6] / n, over.empty() ? 0.0 : over[over.size() / 2],
      sum[6] / n - device_us, errors ? "; first error: " : "", first_error.c_str());
}
