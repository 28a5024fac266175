// Structured output on the CUDA backend. The mask kernels inside a captured graph: the graph
// waits for the host to publish the step's masks (TokenMasks), copies them to the device and
// then draws, greedy and top-k, exactly what the same sampling kernels draw from logits masked
// on the host, over a batch of masked and unmasked rows, with new masks at every replay; at 32
// rows (and from a later row of the table, as a prefill's head pass masks) the masked logits
// equal the host's apply_token_mask bit for bit, a mask allowing one token forces it on every
// row, and rows without a mask keep their logits; a wait that gives up masks nothing. On the
// default model:
// JSON-schema-constrained chats share steps and graphs with free ones, their tokens drawn by
// the device sampler under the masks (telemetry: device_masked_sequences, mask time per step);
// every constrained reply follows its schema; free chats beside them are compared with their
// text alone (a difference is printed); and greedy constrained replies drawn under device masks
// equal those drawn by the host from downloaded logits (forced by asking for log-probs).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "backends/cuda/device_memory.h"
#include "backends/cuda/token_masks.h"
#include "gpu_test_support.h"
#include "granule/engine.h"
#include "memory/memory_manager.h"
#include "memory/workspace_layout.h"
#include "runtime/token_constraint.h"
#include "sampling.cuh"
#include "support/test_files.h"

namespace granule {
namespace {

struct Reply {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason reason = FinishReason::None;
  std::string error;
};

Request chat(const std::string& question, Constraint constraint, Reply& out) {
  Request r;
  r.messages = {{"user", question}};
  r.sampling = SamplingParams::greedy();
  r.sampling.max_tokens = 64;
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

using gpu_test::DeviceArray;

// A step's draws on the device as the engine's heads make them: the logits, the rows' sampling
// parameters and histories, the greedy and the sampled tokens, the argmax kernel's workspace.
struct Draws {
  Draws(int rows, int n_vocab, const std::vector<kernels::DeviceSamplingParams>& params,
        const std::vector<int32_t>& history, const std::vector<int32_t>& history_length,
        int history_stride)
      : rows(rows),
        n_vocab(n_vocab),
        logits(static_cast<size_t>(rows) * n_vocab),
        params(params),
        history(history),
        length(history_length),
        greedy(rows),
        sampled(rows),
        best(std::vector<unsigned long long>(rows, 0)),
        counters(std::vector<int>(rows, 0)) {
    args.logits = logits.get();
    args.logits_stride = n_vocab;
    args.rows = rows;
    args.n_vocab = n_vocab;
    args.params = this->params.get();
    args.history = this->history.get();
    args.history_stride = history_stride;
    args.history_length = length.get();
    args.tokens = sampled.get();
  }
  cudaError_t argmax(const kernels::KernelConfig& config, cudaStream_t stream) const {
    return kernels::launch_argmax(logits.get(), n_vocab, rows, n_vocab, greedy.get(),
                                  {best.get(), counters.get()}, config, stream);
  }

  int rows, n_vocab;
  DeviceArray<float> logits;
  DeviceArray<kernels::DeviceSamplingParams> params;
  DeviceArray<int32_t> history, length, greedy, sampled;
  DeviceArray<unsigned long long> best;
  DeviceArray<int> counters;
  kernels::SamplingArgs args;
};

// The default model, else the test data's first layers of it (the same tokenizer and template):
// the GPU machine gets the test data folder but not the default model.
std::filesystem::path model_path() {
  const std::filesystem::path full = test::default_model_path();
  return full.empty() ? test::real_weights_model_path() : full;
}

// A random mask of `n_vocab` bits allowing about `density` of the tokens (at least one).
std::vector<uint32_t> random_mask(int n_vocab, double density, std::mt19937& rng) {
  std::vector<uint32_t> mask(static_cast<size_t>((n_vocab + 31) / 32), 0);
  std::bernoulli_distribution allow(density);
  for (int i = 0; i < n_vocab; ++i)
    if (allow(rng)) mask[static_cast<size_t>(i) / 32] |= 1u << (i % 32);
  mask[static_cast<size_t>(rng() % n_vocab) / 32] |= ~0u;  // a whole word, clipped by n_vocab
  return mask;
}

TEST(ConstraintGpu, GraphMasksDrawWhatHostMasksDraw) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  for (const int n_vocab : {49152, 128256, 151665}) {  // SmolLM2, Llama 3, an odd width
    SCOPED_TRACE(n_vocab);
    std::mt19937 rng(static_cast<uint32_t>(n_vocab));
    const int rows = 8;
    // Rows 0-3 greedy, 4-7 seeded top-k; the odd rows unmasked; row 5 with a penalty.
    std::vector<kernels::DeviceSamplingParams> params(rows);
    const int history_stride = 16;
    std::vector<int32_t> history(rows * history_stride, 0), history_length(rows, 0);
    for (int r = 4; r < rows; ++r) {
      params[r].temperature = 0.8f;
      params[r].top_k = 40;
      params[r].top_p = 0.95f;
      params[r].seed = 1000 + r;
      params[r].step = 7;
    }
    params[5].repetition_penalty = 1.3f;
    for (int i = 0; i < 8; ++i) history[5 * history_stride + i] = i * 97;
    history_length[5] = 8;
    const std::vector<bool> masked = {true, false, true, false, true, false, true, true};

    Draws d(rows, n_vocab, params, history, history_length, history_stride);
    cuda::CudaStream stream;
    // The draws the engine's heads make: argmax (greedy steps) and the sampling kernel.
    const auto draw = [&](cudaStream_t s) {
      ASSERT_EQ(d.argmax(config, s), cudaSuccess);
      ASSERT_EQ(kernels::launch_sampling(d.args, s), cudaSuccess);
    };

    MemoryManager memory(uint64_t{1} << 30);
    const cuda::DeviceBuffer copy(memory, MemoryCategory::Workspace,
                                  workspace::token_mask_device_bytes(n_vocab));
    cuda::TokenMasks masks(64, n_vocab, copy);
    cudaGraph_t graph = nullptr;
    CUDA_OK(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal));
    masks.enqueue(d.logits.get(), n_vocab, rows, n_vocab, 0, stream.get());
    draw(stream.get());
    CUDA_OK(cudaStreamEndCapture(stream.get(), &graph));
    cudaGraphExec_t exec = nullptr;
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    cuda::CudaGraph step(graph, exec);

    for (int replay = 0; replay < 3; ++replay) {
      SCOPED_TRACE(replay);
      const std::vector<float> logits =
          gpu_test::random_floats(static_cast<size_t>(rows) * n_vocab, rng, 3.0f);
      // New masks every replay, from one allowed token to most of them.
      const double density[3] = {0.0, 0.01, 0.6};
      std::vector<std::vector<uint32_t>> row_masks(rows);
      std::vector<const uint32_t*> given(rows, nullptr);
      std::vector<float> host_masked = logits;
      for (int r = 0; r < rows; ++r) {
        if (!masked[r]) continue;
        row_masks[r] = random_mask(n_vocab, density[(r + replay) % 3], rng);
        given[r] = row_masks[r].data();
        apply_token_mask(std::span<float>(host_masked.data() + static_cast<size_t>(r) * n_vocab,
                                          static_cast<size_t>(n_vocab)),
                         row_masks[r]);
      }
      // The reference: the same kernels over logits masked on the host.
      d.logits.upload(host_masked);
      draw(nullptr);
      const std::vector<int32_t> want_greedy = d.greedy.download();
      const std::vector<int32_t> want_sampled = d.sampled.download();
      for (int r = 0; r < rows; ++r) {
        if (!masked[r]) continue;
        const auto allowed = [&](int32_t t) {
          return t >= 0 && t < n_vocab && ((row_masks[r][t / 32] >> (t % 32)) & 1u);
        };
        EXPECT_TRUE(allowed(want_greedy[r])) << "row " << r;
        EXPECT_TRUE(allowed(want_sampled[r])) << "row " << r;
      }

      // The graph: launched before the masks exist; it must wait for them.
      d.logits.upload(logits);
      d.greedy.poison();
      d.sampled.poison();
      CUDA_OK(cudaDeviceSynchronize());  // the poison lands first (another stream)
      masks.arm();
      step.launch(stream.get());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      EXPECT_EQ(cudaStreamQuery(stream.get()), cudaErrorNotReady)
          << "the graph drew before the host published its masks";
      masks.publish(given);
      CUDA_OK(cudaStreamSynchronize(stream.get()));
      EXPECT_FALSE(masks.take_timed_out());
      EXPECT_EQ(d.greedy.download(), want_greedy);
      EXPECT_EQ(d.sampled.download(), want_sampled);
    }

    // A step the host gives up on: released with no row masked, it draws from the plain logits.
    const std::vector<float> logits =
        gpu_test::random_floats(static_cast<size_t>(rows) * n_vocab, rng, 3.0f);
    d.logits.upload(logits);
    draw(nullptr);
    const std::vector<int32_t> plain_greedy = d.greedy.download();
    const std::vector<int32_t> plain_sampled = d.sampled.download();
    d.logits.upload(logits);
    masks.arm();
    step.launch(stream.get());
    EXPECT_TRUE(masks.release_unpublished());
    CUDA_OK(cudaStreamSynchronize(stream.get()));
    EXPECT_EQ(d.greedy.download(), plain_greedy);
    EXPECT_EQ(d.sampled.download(), plain_sampled);
  }
}

// The masked logits of `rows` rows after one step of the graph, against the host's
// apply_token_mask over the same logits: every row masked by its given mask (-inf exactly where
// a bit is clear, the logit's bits elsewhere), every other row untouched.
void expect_host_masking(const std::vector<float>& logits, const std::vector<float>& device,
                         const std::vector<std::vector<uint32_t>>& row_masks, int n_vocab) {
  const size_t rows = row_masks.size();
  ASSERT_EQ(device.size(), rows * static_cast<size_t>(n_vocab));
  for (size_t r = 0; r < rows; ++r) {
    std::vector<float> want(logits.begin() + static_cast<std::ptrdiff_t>(r * n_vocab),
                            logits.begin() + static_cast<std::ptrdiff_t>((r + 1) * n_vocab));
    if (!row_masks[r].empty()) apply_token_mask(want, row_masks[r]);
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const float got = device[r * static_cast<size_t>(n_vocab) + i];
      if (std::memcmp(&got, &want[i], sizeof(float)) != 0 && differ++ == 0) first = i;
    }
    EXPECT_EQ(differ, 0u) << "row " << r << (row_masks[r].empty() ? " (unmasked)" : " (masked)")
                          << ", first at logit " << first;
  }
}

TEST(ConstraintGpu, ThirtyTwoRowsForcedByOneTokenMasksAcrossReplays) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  for (const int n_vocab : {49152, 128256, 151665, 262144}) {  // Gemma's 262k too
    SCOPED_TRACE(n_vocab);
    std::mt19937 rng(static_cast<uint32_t>(n_vocab) + 1);
    const int rows = 32;
    // Half the rows draw top-k at a high temperature (a forced token must win there too).
    std::vector<kernels::DeviceSamplingParams> params(rows);
    for (int r = 0; r < rows; r += 2) {
      params[r].temperature = 1.5f;
      params[r].top_k = 0;
      params[r].seed = 7 + r;
    }
    const int history_stride = 4;
    std::vector<int32_t> history(rows * history_stride, 0), history_length(rows, 0);
    Draws d(rows, n_vocab, params, history, history_length, history_stride);

    // The engine's table: the device copy from the workspace list, in the ledger; 128 host rows
    // (a prefill's sequences), of which the second graph masks rows 64-95.
    MemoryManager memory(uint64_t{1} << 30);
    const cuda::DeviceBuffer copy(memory, MemoryCategory::Workspace,
                                  workspace::token_mask_device_bytes(n_vocab));
    EXPECT_EQ(memory.bytes(MemoryCategory::Workspace), workspace::token_mask_device_bytes(n_vocab));
    cuda::TokenMasks masks(128, n_vocab, copy);
    EXPECT_EQ(masks.device_rows(), workspace::kTokenMaskRows);
    cuda::CudaStream stream;
    const auto capture = [&](int first_mask_row, bool sample) {
      cudaGraph_t graph = nullptr;
      EXPECT_EQ(cudaStreamBeginCapture(stream.get(), cudaStreamCaptureModeThreadLocal),
                cudaSuccess);
      masks.enqueue(d.logits.get(), n_vocab, rows, n_vocab, first_mask_row, stream.get());
      if (sample)
        EXPECT_EQ(kernels::launch_sampling(d.args, stream.get()), cudaSuccess);
      else
        EXPECT_EQ(d.argmax(config, stream.get()), cudaSuccess);
      EXPECT_EQ(cudaStreamEndCapture(stream.get(), &graph), cudaSuccess);
      cudaGraphExec_t exec = nullptr;
      EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      return cuda::CudaGraph(graph, exec);
    };
    struct Case {
      int first_mask_row;
      bool sample;
    };
    for (const Case c : {Case{0, false}, Case{0, true}, Case{64, false}}) {
      SCOPED_TRACE(testing::Message() << "from mask row " << c.first_mask_row
                                      << (c.sample ? ", sampled" : ", greedy"));
      cuda::CudaGraph step = capture(c.first_mask_row, c.sample);
      ASSERT_TRUE(step);
      // Another set of rows masked at every replay, each allowing one token (a new one each
      // time): rows masked one step and not the next keep their logits.
      for (int replay = 0; replay < 4; ++replay) {
        SCOPED_TRACE(replay);
        const std::vector<float> logits =
            gpu_test::random_floats(static_cast<size_t>(rows) * n_vocab, rng, 3.0f);
        std::vector<std::vector<uint32_t>> row_masks(rows);
        std::vector<int32_t> forced(rows, -1);
        std::vector<const uint32_t*> given(static_cast<size_t>(c.first_mask_row + rows), nullptr);
        for (int r = 0; r < rows; ++r) {
          if (replay == 1 ? r % 3 == 0 : (r + replay) % 4 == 3) continue;  // unmasked
          forced[r] = static_cast<int32_t>(rng() % static_cast<uint32_t>(n_vocab));
          row_masks[r].assign(static_cast<size_t>((n_vocab + 31) / 32), 0);
          row_masks[r][static_cast<size_t>(forced[r]) / 32] = 1u << (forced[r] % 32);
          given[static_cast<size_t>(c.first_mask_row + r)] = row_masks[r].data();
        }
        // Masks in the table's other rows that this graph must not apply.
        std::vector<uint32_t> nothing(static_cast<size_t>((n_vocab + 31) / 32), 0);
        for (int r = 0; r < c.first_mask_row; ++r) given[static_cast<size_t>(r)] = nothing.data();
        // Unmasked: the draw the plain logits give.
        d.logits.upload(logits);
        if (c.sample) {
          ASSERT_EQ(kernels::launch_sampling(d.args, nullptr), cudaSuccess);
        } else {
          ASSERT_EQ(d.argmax(config, nullptr), cudaSuccess);
        }
        const std::vector<int32_t> plain = c.sample ? d.sampled.download() : d.greedy.download();

        d.logits.upload(logits);
        d.greedy.poison();
        d.sampled.poison();
        CUDA_OK(cudaDeviceSynchronize());
        masks.arm();
        step.launch(stream.get());
        masks.publish(given);
        CUDA_OK(cudaStreamSynchronize(stream.get()));
        EXPECT_FALSE(masks.take_timed_out());
        const std::vector<int32_t> drawn = c.sample ? d.sampled.download() : d.greedy.download();
        for (int r = 0; r < rows; ++r) {
          if (forced[r] >= 0)
            EXPECT_EQ(drawn[r], forced[r]) << "row " << r << " allowed one token";
          else
            EXPECT_EQ(drawn[r], plain[r]) << "row " << r << " had no mask";
        }
        if (!c.sample) expect_host_masking(logits, d.logits.download(), row_masks, n_vocab);
      }
    }
  }
}

// A wait that gives up (kTokenMaskWaitNs: the host never published): the copy still runs and
// brings the previous step's rows, masked, but the step masks nothing, since the wait's status
// says the masks never came; the host learns it from take_timed_out(). About 5 s.
TEST(ConstraintGpu, AWaitThatGivesUpMasksNothing) {
  GRANULE_REQUIRE_GPU();
  const kernels::KernelConfig config = gpu_test::kernel_config();
  const int n_vocab = 49152, rows = 4;
  std::mt19937 rng(5);
  MemoryManager memory(uint64_t{1} << 30);
  const cuda::DeviceBuffer copy(memory, MemoryCategory::Workspace,
                                workspace::token_mask_device_bytes(n_vocab));
  cuda::TokenMasks masks(64, n_vocab, copy);
  DeviceArray<float> d_logits(static_cast<size_t>(rows) * n_vocab);
  DeviceArray<int32_t> d_greedy(rows);
  DeviceArray<unsigned long long> d_best(std::vector<unsigned long long>(rows, 0));
  DeviceArray<int> d_counters(std::vector<int>(rows, 0));
  const kernels::ArgmaxWorkspace workspace{d_best.get(), d_counters.get()};
  cuda::CudaStream stream;
  const auto step = [&] {
    masks.enqueue(d_logits.get(), n_vocab, rows, n_vocab, 0, stream.get());
    ASSERT_EQ(kernels::launch_argmax(d_logits.get(), n_vocab, rows, n_vocab, d_greedy.get(),
                                     workspace, config, stream.get()),
              cudaSuccess);
  };
  const std::vector<float> logits =
      gpu_test::random_floats(static_cast<size_t>(rows) * n_vocab, rng, 3.0f);
  // A published step leaves every row masked to token 5 in the table.
  std::vector<uint32_t> only_5(static_cast<size_t>((n_vocab + 31) / 32), 0);
  only_5[0] = 1u << 5;
  const std::vector<const uint32_t*> given(rows, only_5.data());
  d_logits.upload(logits);
  masks.arm();
  step();
  masks.publish(given);
  CUDA_OK(cudaStreamSynchronize(stream.get()));
  EXPECT_EQ(d_greedy.download(), std::vector<int32_t>(rows, 5));
  // The next one is never published.
  d_logits.upload(logits);
  d_greedy.poison();
  CUDA_OK(cudaDeviceSynchronize());
  masks.arm();
  step();
  CUDA_OK(cudaStreamSynchronize(stream.get()));
  EXPECT_TRUE(masks.take_timed_out());
  expect_host_masking(logits, d_logits.download(), std::vector<std::vector<uint32_t>>(rows),
                      n_vocab);
  const std::vector<int32_t> drawn = d_greedy.download();
  for (int r = 0; r < rows; ++r)
    EXPECT_EQ(drawn[r], gpu_test::top_two(std::span<const float>(logits).subspan(
                                              static_cast<size_t>(r) * n_vocab, n_vocab))
                            .best)
        << "row " << r;
  EXPECT_TRUE(masks.release_unpublished());
}

TEST(ConstraintGpu, ConstrainedAndFreeChatsShareSteps) {
  GRANULE_REQUIRE_GPU();
  if (model_path().empty()) GTEST_SKIP() << test::kNoDefaultModel;
  if (!structured_output_available()) GTEST_SKIP() << kNoStructuredOutputMessage;
  EngineOptions o;
  o.device = DeviceKind::Cuda;
  o.context_length = 1024;
  o.max_sequences = 16;
  const std::string schema =
      R"({"type":"object","properties":{"city":{"type":"string","maxLength":20},)"
      R"("rank":{"type":"integer","minimum":1,"maximum":100}},"required":["city","rank"],)"
      R"("additionalProperties":false})";
  const std::vector<std::string> questions = {"Name a big city.", "Name a city in Spain.",
                                              "What is the capital of Italy?",
                                              "Which city has the Eiffel tower?"};
  // The free chats alone first: their text with constrained neighbours must be the same.
  std::vector<Reply> alone(questions.size());
  {
    auto engine = Engine::open(model_path(), o);
    for (size_t i = 0; i < questions.size(); ++i) engine->submit(chat(questions[i], {}, alone[i]));
    for (int i = 0; i < 5000 && engine->step(); ++i) {
    }
  }
  auto engine = Engine::open(model_path(), o);
  std::vector<Reply> free(questions.size()), constrained(questions.size() * 2),
      sampled(questions.size());
  // Top-k draws too: the masked sampling head (MaskedSample) beside the greedy ones.
  SamplingParams top_k;
  top_k.temperature = 0.8f;
  top_k.top_k = 40;
  top_k.top_p = 0.95f;
  for (size_t i = 0; i < questions.size(); ++i) {
    engine->submit(chat(questions[i], {}, free[i]));
    engine->submit(chat(questions[i], Constraint::json_schema(schema), constrained[2 * i]));
    engine->submit(chat(questions[i], Constraint::json_object(), constrained[2 * i + 1]));
    Request r = chat(questions[i], Constraint::json_schema(schema), sampled[i]);
    r.sampling = top_k;
    r.sampling.seed = 100 + i;
    r.sampling.max_tokens = 64;
    engine->submit(std::move(r));
  }
  double mask_us = 0;
  int mixed_steps = 0, device_masked_steps = 0;
  uint64_t replays_before = 0, masked_replays = 0;
  for (int i = 0; i < 5000 && engine->step(); ++i) {
    const TelemetrySnapshot t = engine->telemetry();
    if (t.throughput.constrained_sequences > 0 &&
        t.throughput.constrained_sequences < t.scheduler.running) {
      ++mixed_steps;
      mask_us += t.throughput.last_mask_us;
      if (t.throughput.device_masked_sequences > 0) {
        ++device_masked_steps;
        if (t.graphs.replays > replays_before) ++masked_replays;
      }
    }
    replays_before = t.graphs.replays;
  }
  ASSERT_TRUE(engine->idle());
  EXPECT_GT(mixed_steps, 0);
  // The device sampler took the masks (no step fell back to host draws), in replayed graphs.
  EXPECT_GT(device_masked_steps, 0);
  EXPECT_GT(masked_replays, 0);
  std::printf(
      "mixed steps: %d (device-masked %d, of them graph replays %llu), mean mask time %.1f us "
      "per step\n",
      mixed_steps, device_masked_steps, static_cast<unsigned long long>(masked_replays),
      mixed_steps ? mask_us / mixed_steps : 0.0);
  // The schema's shape; the city's string may hold JSON escapes and UTF-8, and maxLength counts
  // characters (an escape or a UTF-8 sequence is one), not bytes.
  const std::regex shape(
      R"re(\{"city": "((?:[^"\\]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*)", "rank": ([1-9][0-9]?|100)\})re");
  auto valid = [&](const std::string& text) {
    std::smatch m;
    if (!std::regex_match(text, m, shape)) return false;
    const std::string city = m[1].str();
    int characters = 0;
    for (size_t i = 0; i < city.size(); ++i) {
      const auto byte = static_cast<unsigned char>(city[i]);
      if (byte == '\\') i += city[i + 1] == 'u' ? 5 : 1;  // one escape, one character
      if ((byte & 0xC0) != 0x80) ++characters;            // not a UTF-8 continuation byte
    }
    return characters <= 20;
  };
  for (size_t i = 0; i < questions.size(); ++i) {
    // Batch composition may change the GPU's rounding, so a divergence is reported, not failed.
    if (free[i].text != alone[i].text)
      std::printf("note: '%s' alone: %s | beside constrained chats: %s\n", questions[i].c_str(),
                  alone[i].text.c_str(), free[i].text.c_str());
    EXPECT_NE(free[i].reason, FinishReason::Error) << free[i].error;
    const Reply& s = constrained[2 * i];
    EXPECT_EQ(s.reason, FinishReason::Eos) << s.text << " " << s.error;
    EXPECT_TRUE(valid(s.text)) << s.text;
    const Reply& o2 = constrained[2 * i + 1];
    EXPECT_NE(o2.reason, FinishReason::Error) << o2.error;
    ASSERT_FALSE(o2.text.empty());
    EXPECT_EQ(o2.text.front(), '{') << o2.text;
    const Reply& k = sampled[i];
    EXPECT_EQ(k.reason, FinishReason::Eos) << k.text << " " << k.error;
    // A drawn string may hold escapes and characters of several bytes: its length is not
    // checked here.
    EXPECT_TRUE(std::regex_match(
        k.text, std::regex(R"(\{"city": "(?:[^"\\]|\\.)*", "rank": ([1-9][0-9]?|100)\})")))
        << k.text;
  }
}

TEST(ConstraintGpu, DeviceMasksDrawWhatHostMasksDraw) {
  GRANULE_REQUIRE_GPU();
  if (model_path().empty()) GTEST_SKIP() << test::kNoDefaultModel;
  if (!structured_output_available()) GTEST_SKIP() << kNoStructuredOutputMessage;
  EngineOptions o;
  o.device = DeviceKind::Cuda;
  o.context_length = 1024;
  o.max_sequences = 8;
  const std::string schema =
      R"({"type":"object","properties":{"city":{"type":"string","maxLength":20},)"
      R"("rank":{"type":"integer","minimum":1,"maximum":100}},"required":["city","rank"],)"
      R"("additionalProperties":false})";
  const std::vector<std::string> questions = {"Name a big city.", "Name a city in Spain.",
                                              "What is the capital of Italy?"};
  // Greedy: the device's argmax after the device's masks, against the host's draw from the
  // downloaded logits after the host's masks (a request for log-probs brings every step's
  // logits back). The forward passes are the same kernels, so the tokens must be equal.
  const auto run = [&](bool host_draws, std::vector<Reply>& out) {
    auto engine = Engine::open(model_path(), o);
    out.assign(questions.size() * 2 + 1, {});
    for (size_t i = 0; i < questions.size(); ++i) {
      Request s = chat(questions[i], Constraint::json_schema(schema), out[2 * i]);
      Request j = chat(questions[i], Constraint::json_object(), out[2 * i + 1]);
      if (host_draws) s.top_logprobs = j.top_logprobs = 0;
      engine->submit(std::move(s));
      engine->submit(std::move(j));
    }
    Request f = chat("Tell me about Rome.", {}, out.back());
    if (host_draws) f.top_logprobs = 0;
    engine->submit(std::move(f));
    int device_masked = 0;
    for (int i = 0; i < 5000 && engine->step(); ++i)
      device_masked += engine->telemetry().throughput.device_masked_sequences;
    EXPECT_TRUE(engine->idle());
    return device_masked;
  };
  std::vector<Reply> host, device;
  EXPECT_EQ(run(true, host), 0);
  EXPECT_GT(run(false, device), 0);
  for (size_t i = 0; i < host.size(); ++i) {
    EXPECT_NE(host[i].reason, FinishReason::Error) << i << ": " << host[i].error;
    EXPECT_EQ(device[i].reason, host[i].reason) << i << ": " << device[i].error;
    EXPECT_EQ(device[i].tokens, host[i].tokens)
        << i << ": device masks: " << device[i].text << " | host masks: " << host[i].text;
  }
}

}  // namespace
}  // namespace granule
