// The Granule engine: open a model, submit conversations, step the scheduler, read
// telemetry. Qt-free; one thread drives it (the app's EngineWorker, or granule-cli).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "granule/chat_template.h"
#include "granule/constraint.h"
#include "granule/model_config.h"
#include "granule/sampling.h"
#include "granule/telemetry.h"
#include "granule/tokenizer.h"

namespace granule {

enum class DeviceKind { Auto, Cpu, Cuda };

class Backend;

struct EngineOptions {
  DeviceKind device = DeviceKind::Auto;  // Auto: CUDA when a GPU is usable, else CPU
  int64_t context_length = 4096;         // per sequence; clamped to the model's
  int32_t max_sequences = 8;             // sequence slots (concurrent chats)
  uint64_t vram_budget_bytes = 0;        // 0 = free memory at start minus a margin
  bool cuda_graphs = true;
  int32_t cpu_threads = 0;  // 0 = hardware concurrency
  // A mixture of experts on the GPU whose experts do not all fit the VRAM budget: the share of a
  // decode step's missed experts (those not in VRAM, chosen by few rows) that the CPU computes
  // from its own copies while PCIe carries the rest. -1: all of them in steps of 8 to 64 rows
  // (several chats decoding together, where the host beats PCIe), 160/256 of them in smaller ones
  // (where the host and PCIe each take about as long); 0:
  // none, every missed expert crosses PCIe (the same results as all resident); 1..256: that
  // many 256ths in steps of up to 64 rows.
  int32_t host_expert_share = -1;
  // A dense model on the GPU whose layers do not all fit the VRAM budget: the share of each
  // streamed layer's matrix rows that the CPU computes from its own copies in decode runs of up
  // to 8 rows, while PCIe carries only the rest. -1: measured at load (host time ≈ PCIe time);
  // 0: none, every streamed byte crosses PCIe (the same results as before); 1..256: that many
  // 256ths of each matrix's rows.
  int32_t host_row_share = -1;
  int64_t prefill_chunk_tokens = 512;  // token budget of a step's prefill chunk
  // KV granules created ahead of need and kept unmapped, so a step only maps them; -1 sizes
  // it from the shapes (a prefill chunk's granules plus one per four slots), 0 turns it off.
  int64_t kv_pool_granules = -1;
  // While a step runs on the device, map the KV the next step writes (off the step's path).
  bool kv_map_ahead = true;
  std::string chat_template_override;  // a family name, or "" to detect from the GGUF
  // KV reuse across turns: a finished sequence's slot keeps its KV as an idle cached entry, and
  // a later request whose prompt begins with the same tokens (or names the same session)
  // computes only what follows. Idle entries give their KV back first under memory pressure
  // and when slots run out, copied to host memory (up to kv_host_cache_bytes) where the backend
  // can copy KV, else dropped. false: a finished sequence's KV is freed at once.
  bool kv_reuse = true;
  uint64_t kv_host_cache_bytes = 1ull << 30;  // host memory for swapped-out idle KV; 0: none
  // For tests: wraps the backend the engine picked (a fault-injecting decorator); empty: none.
  std::function<std::unique_ptr<Backend>(std::unique_ptr<Backend>)> wrap_backend;
  // For tests: the CPU backend rounds activations, KV and GEMM operands where the CUDA
  // backend does (an oracle for the GPU's logits); off: plain f32. Ignored on the GPU.
  bool cpu_emulate_device_numerics = false;
  // For tests: the CPU backend's exact f32 matmuls (the reference numerics llama.cpp is compared
  // with); off: int8 activations where the weight type has kernels, the fast path.
  bool cpu_exact_numerics = false;
};

using SequenceId = int64_t;

enum class FinishReason { None, Eos, StopString, MaxTokens, Cancelled, Error };
const char* finish_reason_name(FinishReason r);

// The token argument of on_token when text is released without a new token: what was held
// back for a possible stop string, sent when the sequence ends.
constexpr int32_t kNoToken = -1;

// A token with its log-probability under the model: log-softmax of the raw logits (before
// penalties, temperature and truncation, as OpenAI's API and llama-perplexity report them).
struct TokenLogprob {
  TokenId token = 0;
  std::string piece;  // the token's bytes as decoding renders it (may be part of a character)
  float logprob = 0;
};
// The log-probabilities of one generated token: the chosen one and the most likely ones.
struct TokenLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;  // Request::top_logprobs of them, most likely first
};
constexpr int32_t kMaxTopLogprobs = 20;  // as OpenAI's API

// Receives a sequence's output on the engine thread. on_text gets complete UTF-8 text
// (never half a character); on_finish is called exactly once per submitted sequence.
// What the engine made of a request's prompt, told once when the sequence first takes a slot
// (before its first token): how much of it was computed and how much came from KV kept from
// an earlier request (in the slot, or copied back from host memory).
struct PromptInfo {
  int64_t prompt_tokens = 0;      // the prompt as computed (after dropped messages)
  int64_t reused_tokens = 0;      // whose KV was kept from an earlier request
  int64_t computed_tokens = 0;    // prefilled for this request: prompt_tokens - reused_tokens
  int64_t swapped_in_tokens = 0;  // of reused_tokens, copied back from host memory
  // Messages left out at the start of the conversation (after the system messages) so that
  // it fits the context (ContextOverflow::DropOldest): the model sees
  // messages[system..., dropped_messages + system count, ...].
  int32_t dropped_messages = 0;
  // The chat template opened the model's reasoning at the end of the prompt (<think>): the
  // reply starts inside it (ReasoningParser's starts_in_reasoning).
  bool reasoning_opened = false;
};

struct TokenSink {
  std::function<void(SequenceId, const std::string& text, int32_t token)> on_token;
  std::function<void(SequenceId, FinishReason, const std::string& error)> on_finish;
  // With Request::top_logprobs >= 0: called for every generated token, before its on_token
  // (not for an end-of-generation token that ends the sequence, which is not output).
  std::function<void(SequenceId, const TokenLogprobs&)> on_logprobs;
  std::function<void(SequenceId, const PromptInfo&)> on_prompt;  // optional
};

// What submit() does with a conversation whose prompt, plus room for the reply, is longer than
// the context.
enum class ContextOverflow {
  DropOldest,  // leave out the oldest messages after the system ones until it fits
  Stop,        // refuse it with a CapacityError
};

struct Request {
  std::vector<ChatMessage> messages;                  // rendered with the chat template, or
  std::optional<std::vector<TokenId>> prompt_tokens;  // a raw prompt, used as is
  SamplingParams sampling;
  // The chat template's variables besides the messages (enable_thinking, reasoning_effort,
  // tools); used with a Jinja template, ignored by the hand-written families.
  ChatOptions chat_options;
  // -1: no log-probabilities; 0..kMaxTopLogprobs: each generated token's, with that many of
  // the most likely tokens (sink.on_logprobs). Steps holding such a sequence sample on the
  // host, since the logits must come back (the same tokens: both samplers draw alike).
  int32_t top_logprobs = -1;
  TokenSink sink;
  // The conversation this request continues (the app's chat id), or "": the KV an earlier
  // request of the same session kept is preferred, and a finished sequence's kept KV is
  // labelled with it. Without it, kept KV is found by the longest common prefix of tokens.
  std::string session;
  ContextOverflow context_overflow = ContextOverflow::DropOldest;
  // Room for the reply that dropping keeps free: -1 is max_tokens capped at a quarter of the
  // context. A prompt that fits only without the whole reserve is not dropped further than
  // down to the last message.
  int64_t reply_reserve_tokens = -1;
  // Structured output: what the reply may be (a JSON Schema, a grammar, ...). submit() compiles
  // it (UsageError for a bad one; UnsupportedError in a build without structured output). Each
  // step's allowed tokens are computed on the host while the device runs the step's forward
  // pass; a backend that samples under masks (CUDA) draws the token after them in the same
  // step and graph as unconstrained sequences, others bring the logits back and the host
  // draws. A reply the constraint lets go nowhere ends with an Error.
  Constraint constraint;
};

// The expert plan of a mixture-of-experts model in a fit preview (n_expert 0 for a dense
// model): embeddings, attention, norms, routers and shared experts stay resident, then as
// many experts as the rest of the budget holds, spread evenly over the layers (the engine
// later keeps the most routed ones, memory/expert_placement.h); the others are read from
// pinned host memory over PCIe when a token routes to them.
struct ExpertFitEstimate {
  int64_t n_expert = 0;                // experts per layer; 0: a dense model
  int64_t n_expert_used = 0;           // experts each token routes to per layer (top-k)
  uint64_t always_resident_bytes = 0;  // embeddings, head, attention, norms, routers, shared
  uint64_t expert_bytes = 0;           // one expert of one layer (the largest layer's)
  uint64_t experts_bytes = 0;          // every expert of every layer
  uint64_t expert_budget_bytes = 0;    // device bytes the plan gives experts
  int64_t resident_experts = 0;        // of n_layer × n_expert
  std::vector<int32_t> resident_per_layer;
  // Expert bytes a decode token at batch 1 chooses from host memory when routing is uniform
  // (each layer's top-k choices fall on host experts in proportion to them); the 256ths of
  // those the host's CPU computes from its own copies (EngineOptions::host_expert_share's rule
  // at one row; 0 where it computes none: the setting, or its copies do not fit the memory
  // available); what crosses PCIe of the rest, and the decode tokens/s that bounds (0 when
  // every expert is resident).
  double missed_bytes_per_token = 0;
  int32_t host_share = 0;
  double pcie_bytes_per_token = 0;
  double pcie_tokens_per_second = 0;
  // The CPU: whether the experts run on their int8 copies (those the int8 kernels run on this
  // processor, within cpu_copy_budget_bytes, what FitEstimate::host_available_bytes leaves
  // beside the other matrices' copies: the CPU backend's own plan) or, false, on the exact f32
  // path, several times slower.
  bool cpu_int8_experts = false;
  uint64_t cpu_copy_budget_bytes = 0;
};

// What opening a model with some options would need, read from the file alone (no weights
// loaded, no backend built): the fit preview shown before loading.
struct FitEstimate {
  ModelConfig config;      // the model's shapes, names and trained context
  std::string block_type;  // the block type holding the most weight bytes ("Q4_1")
  uint64_t file_bytes = 0;
  uint64_t parameters = 0;          // elements over all tensors
  bool gpu = false;                 // the backend the options pick: CUDA, or the CPU
  std::string device;               // "CPU", "CUDA NVIDIA H200"
  int64_t kv_element_bytes = 0;     // 4 on the CPU (f32 KV), 2 on CUDA (f16)
  uint64_t weights_bytes = 0;       // charged to the ledger at open
  uint64_t kv_bytes_per_token = 0;  // K and V of every attention layer, in kv_element_bytes
  // Of it, the sliding-window layers' (Gemma, gpt-oss), whose KV a chat keeps for its last
  // kv_window_tokens only (KV by layer kind): bounded whatever the context. 0: none slide.
  uint64_t kv_window_bytes_per_token = 0;
  int64_t kv_window_tokens = 0;
  // One chat's KV at a context: every layer's up to the window, then the global layers' per
  // token and the window layers' window plus a granule (what KvSpace commits at most).
  uint64_t kv_bytes_per_chat(int64_t context) const;
  // The longest context per chat whose KV fits `bytes` per chat (uncapped).
  int64_t kv_context_for(uint64_t bytes) const;
  // Recurrent layers' state (Qwen3.5's Gated DeltaNet), one slot per chat: `chats` of them
  // are held beside the weights, whatever the context.
  uint64_t recurrent_state_bytes_per_chat = 0;
  uint64_t recurrent_state_bytes() const {  // every chat's
    return recurrent_state_bytes_per_chat * static_cast<uint64_t>(chats);
  }
  uint64_t workspace_bytes = 0;  // an allowance: the logits of every slot plus scratch
  uint64_t budget_bytes = 0;     // the options' budget, or the one the backend would set
  int64_t context_per_chat = 0;  // the options' context, clamped to the model's as open() does
  int32_t chats = 0;             // sequence slots
  // KV tokens the budget holds beside weights and workspace: the chats' contexts together,
  // each at most kv_context_for() its share of the budget.
  int64_t kv_capacity_tokens = 0;
  int64_t max_context_per_chat = 0;  // kv_capacity_tokens over the chats, capped at the model's
  bool fits = false;                 // every chat at its full context, with the plan below

  // The placement plan (engine/src/memory/placement.h) for this budget: the layers that stay
  // in device memory, those streamed from pinned host memory through the staging ring.
  bool loads = false;                 // the budget holds the minimum working set
  uint64_t minimum_budget_bytes = 0;  // that working set: fixed weights, staging, workspace, KV
  int32_t resident_layers = 0;
  int32_t streamed_layers = 0;
  std::vector<bool> layer_streamed;      // per layer
  uint64_t resident_weight_bytes = 0;    // weights in device memory (embeddings, head, layers)
  uint64_t streamed_bytes_per_pass = 0;  // copied host-to-device by every forward pass
  uint64_t staging_bytes = 0;            // the staging ring
  uint64_t kv_reserve_bytes = 0;         // KV the plan keeps free before it places layers
  // Pinned host memory the GPU reads in place, outside the budget (Gemma 4's per-layer token
  // table: the ledger's HostPinned); 0 on the CPU.
  uint64_t host_pinned_bytes = 0;
  // Host-to-device bandwidth the PCIe bound uses: measured on this GPU when one is usable,
  // else an assumed PCIe 4.0 x16 figure (h2d_measured false).
  double h2d_bytes_per_second = 0;
  bool h2d_measured = false;
  // Decode tokens/s at batch 1 that PCIe allows with this plan (0 when nothing streams); for a
  // mixture of experts, the experts' bound (experts.pcie_tokens_per_second).
  double pcie_tokens_per_second = 0;
  // A dense model's streamed layers on a GPU: whether the host's CPU computes part of their rows
  // at decode batches of up to 8 (EngineOptions::host_row_share; the share is measured at
  // load), so that batch 1 can pass the whole-layer bound above.
  bool host_rows = false;
  ExpertFitEstimate experts;  // a mixture of experts' plan; n_expert 0 for a dense model
  // This machine's memory when the estimate was made (the CPU's expert copies are sized by
  // it): MemAvailable (0: unknown) and the physical total.
  uint64_t host_available_bytes = 0;
  uint64_t host_total_bytes = 0;
};

class Engine {
 public:
  // Opens and validates the model, builds the tokenizer and template, picks the backend
  // and reserves KV space. Throws granule::Error with a one-line message.
  static std::unique_ptr<Engine> open(const std::filesystem::path& model_path,
                                      const EngineOptions& options = {});
  ~Engine();
  // The fit preview: reads the model's header and tensor table (as open() validates them)
  // and sizes it for the backend `options` pick — Auto is CUDA when a GPU is usable, else
  // the CPU. For Cuda with a budget in the options no GPU is needed (planning for one);
  // without one the GPU's free memory sets it, and no usable GPU is a DeviceError (an
  // UnsupportedError in a build without CUDA). Throws granule::Error like open().
  static FitEstimate estimate(const std::filesystem::path& model_path,
                              const EngineOptions& options = {});
  // The same from a file already read, e.g. a header fetched over the network
  // (ModelFile::parse_header): the tensors' data is never read.
  static FitEstimate estimate(const ModelFile& model_file, const EngineOptions& options = {});

  const ModelConfig& config() const;
  const Tokenizer& tokenizer() const;
  const ChatTemplate* chat_template() const;  // null if none could be recognised
  std::string device_name() const;            // "CPU (16 threads)", "CUDA NVIDIA H200"
  const EngineOptions& options() const;

  // Queues a request; returns its id. It waits (in arrival order) until a slot is free and
  // the memory budget holds its prompt's KV. A conversation longer than the context drops its
  // oldest messages (Request::context_overflow). Throws CapacityError when the prompt does not
  // fit the context (a raw prompt, ContextOverflow::Stop, or a last message alone too long),
  // UsageError for an empty prompt. A conversation whose KV the budget
  // cannot hold even alone ends with on_finish(Error, reason).
  SequenceId submit(Request request);
  // Cancels at any moment; the sink gets on_finish(Cancelled) in the next step() at the
  // latest, and the sequence's KV is freed.
  void cancel(SequenceId id);
  // One scheduler tick: decode every running sequence by one token and prefill a chunk.
  // When running chats outgrow the budget, the newest is preempted: its KV is freed and
  // recomputed once memory allows, invisibly to its sink. Returns false when there is
  // nothing to do.
  bool step();
  bool idle() const;
  // Why the device stopped working for good (a sticky CUDA error), or "" while it works.
  // Once set, every conversation has ended with this reason and submit() throws
  // DeviceLostError; destroying the engine resets the device, so reopening the model works.
  const std::string& device_lost_reason() const;

  // Teacher-forced logits for a token sequence (tests, references): row i is the logits
  // after tokens[0..i]. Uses a free slot and frees it after.
  std::vector<std::vector<float>> logits_for(const std::vector<TokenId>& tokens);

  TelemetrySnapshot telemetry() const;

  // KV kept from finished sequences (EngineOptions::kv_reuse): forget the entries of one
  // session (a deleted chat), or every entry with "", freeing their memory at once.
  void drop_kept_kv(const std::string& session = {});
  // Tokens whose KV is kept for reuse now: in device memory, and copied to host memory.
  int64_t kept_kv_tokens() const;
  int64_t swapped_kv_tokens() const;

  // Changes the VRAM budget of a running engine: the backend re-plans which layers stay
  // resident (a counted re-plan; decode graphs are captured again). Call between steps.
  // Throws CapacityError, leaving the budget as it was, when the new budget cannot hold the
  // minimum working set plus the KV in use.
  void set_vram_budget(uint64_t bytes);

 private:
  Engine();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace granule
