// `granule-cli perplexity MODEL -f FILE [-c 512]`: the perplexity of a text as llama.cpp's
// llama-perplexity computes it, so the two tools' numbers can be compared: non-overlapping
// chunks of c tokens, BOS in place of each chunk's first token when the vocabulary adds
// one, only the second half of each chunk scored, running values printed as
// "[1]12.3456,[2]..." and the final "PPL = X +/- Y" with llama.cpp's error estimate.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli.h"
#include "granule/engine.h"
#include "granule/error.h"

namespace granule::cli {
namespace {

struct PerplexityOptions {
  std::filesystem::path model;
  std::string file;
  int64_t context = 512;
  int64_t batch = 512;
  int64_t max_chunks = -1;  // -1 (not given) = every whole chunk of the text
  int32_t threads = 0;
  std::string device = "auto";
  uint64_t vram_budget_bytes = 0;
};

// -log p(target) under softmax(logits), as llama.cpp's log_softmax: float max and exps,
// a double sum.
double negative_log_likelihood(const std::vector<float>& logits, TokenId target) {
  float max_logit = logits[0];
  for (float v : logits) max_logit = std::max(max_logit, v);
  double sum_exp = 0.0;
  for (float v : logits) sum_exp += std::exp(v - max_logit);
  return -(static_cast<double>(logits[static_cast<size_t>(target)] - max_logit) -
           std::log(sum_exp));
}

int run_perplexity(const PerplexityOptions& options) {
  const std::string text = read_text_input(options.file);
  EngineOptions engine_options;
  engine_options.device = options.device == "cpu"    ? DeviceKind::Cpu
                          : options.device == "cuda" ? DeviceKind::Cuda
                                                     : DeviceKind::Auto;
  engine_options.context_length = options.context;
  engine_options.max_sequences = 1;
  engine_options.cpu_threads = options.threads;
  engine_options.prefill_chunk_tokens = options.batch;
  engine_options.vram_budget_bytes = options.vram_budget_bytes;
  const std::unique_ptr<Engine> engine = Engine::open(options.model, engine_options);
  const Tokenizer& tokenizer = engine->tokenizer();

  // As llama-perplexity: the whole text encoded once, BOS as the vocabulary says, control
  // tokens written as text left as text.
  const bool add_bos = tokenizer.add_bos_by_default() && tokenizer.bos().has_value();
  const std::vector<TokenId> tokens = tokenizer.encode(text, add_bos, /*parse_special=*/false);
  const int64_t n_ctx = options.context;
  if (static_cast<int64_t>(tokens.size()) < 2 * n_ctx) {
    throw UsageError((options.file == "-" ? std::string("standard input") : options.file) +
                     " has " + std::to_string(tokens.size()) +
                     " tokens; perplexity with a context of " + std::to_string(n_ctx) +
                     " needs at least " + std::to_string(2 * n_ctx) +
                     " (give a longer text or a smaller -c)");
  }
  int64_t n_chunks = static_cast<int64_t>(tokens.size()) / n_ctx;
  if (options.max_chunks > 0) n_chunks = std::min(n_chunks, options.max_chunks);
  const int64_t first = n_ctx / 2;  // positions before this only give context
  std::fprintf(stderr,
               "perplexity: %zu tokens, %lld chunks of %lld, scoring the last %lld of each, "
               "on %s\n",
               tokens.size(), static_cast<long long>(n_chunks), static_cast<long long>(n_ctx),
               static_cast<long long>(n_ctx - 1 - first), engine->device_name().c_str());

  double nll = 0.0;   // sum of -log p over the scored tokens
  double nll2 = 0.0;  // and of its squares, for the error
  int64_t count = 0;
  const auto started = std::chrono::steady_clock::now();
  for (int64_t chunk = 0; chunk < n_chunks; ++chunk) {
    const auto begin = tokens.begin() + static_cast<std::ptrdiff_t>(chunk * n_ctx);
    std::vector<TokenId> input(begin, begin + static_cast<std::ptrdiff_t>(n_ctx));
    if (add_bos) input[0] = *tokenizer.bos();
    const std::vector<std::vector<float>> logits = engine->logits_for(input);
    // Row j predicts input[j + 1]; the targets from `first + 1` on are the text's own tokens.
    for (int64_t j = first; j < n_ctx - 1; ++j) {
      const double v = negative_log_likelihood(logits[static_cast<size_t>(j)],
                                               input[static_cast<size_t>(j + 1)]);
      nll += v;
      nll2 += v * v;
      ++count;
    }
    std::printf("[%lld]%.4f,", static_cast<long long>(chunk + 1),
                std::exp(nll / static_cast<double>(count)));
    std::fflush(stdout);
  }
  std::printf("\n");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  // llama.cpp's estimate: PPL = exp(mean nll), its error from the standard error of the mean
  // nll propagated through exp.
  const double mean = nll / static_cast<double>(count);
  const double ppl = std::exp(mean);
  const double variance = nll2 / static_cast<double>(count) - mean * mean;
  if (variance > 0) {
    const double error = std::sqrt(variance / static_cast<double>(count - 1)) * ppl;
    std::printf("Final estimate: PPL = %.4f +/- %.5f\n", ppl, error);
  } else {
    std::printf("Final estimate: PPL = %.4f\n", ppl);
  }
  std::fprintf(stderr, "perplexity: %lld tokens scored in %.1f s (%.1f tok/s evaluated)\n",
               static_cast<long long>(count), seconds,
               seconds > 0 ? static_cast<double>(n_chunks * n_ctx) / seconds : 0.0);
  return 0;
}

}  // namespace

Command add_perplexity_command(CLI::App& parent) {
  auto options = std::make_shared<PerplexityOptions>();
  CLI::App* app = parent.add_subcommand(
      "perplexity", "Perplexity of a text, computed as llama.cpp's llama-perplexity does");
  app->add_option("model", options->model, "GGUF model file")->required();
  app->add_option("-f,--file", options->file, "Text file to score (- reads standard input)")
      ->required();
  app->add_option("-c,--ctx-size", options->context,
                  "Tokens per chunk; the second half of each chunk is scored")
      ->check(integer_in(4, 1 << 20))
      ->capture_default_str();
  app->add_option("-b,--batch", options->batch, "Tokens per forward pass within a chunk")
      ->check(integer_in(1, 1 << 20))
      ->capture_default_str();
  app->add_option("--chunks", options->max_chunks, "Score at most this many chunks")
      ->check(integer_in(1, 1 << 30))
      ->default_str("all");
  app->add_option("-t,--threads", options->threads, "CPU threads (0 = all cores)")
      ->check(integer_in(0, 4096))
      ->capture_default_str();
  app->add_option("--device", options->device, "Where to run: cpu, cuda or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  add_vram_budget_option(*app, options->vram_budget_bytes);
  return {app, [options] { return run_perplexity(*options); }, &options->model};
}

}  // namespace granule::cli
