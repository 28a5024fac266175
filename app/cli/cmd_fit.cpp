// `granule-cli fit MODEL`: the fit preview before loading — for a VRAM budget, which layers
// (for a mixture of experts: how many experts) stay resident and which stream from host
// memory, the KV it leaves, the PCIe bound on decode speed, and whether the model loads at
// all. Engine::estimate computes it from the file alone.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli.h"
#include "granule/engine.h"
#include "granule/error.h"
#include "granule/gguf.h"
#ifdef GRANULE_HAVE_HUB
#include "hub/remote_fit.h"
#endif

namespace granule::cli {
namespace {

struct FitOptions {
  std::filesystem::path model;
  uint64_t vram_budget_bytes = 0;  // 0: the backend's default
  int64_t context = 4096;
  int32_t chats = 1;
  std::string device = "auto";
  bool json = false;
};

// The estimate and how it was asked for.
struct FitPreview {
  FitEstimate e;
  bool planning_without_gpu = false;  // a budget, no device named, no GPU here: a GPU's plan
  std::string budget_source;
};

DeviceKind device_kind(const std::string& name) {
  if (name == "cpu") return DeviceKind::Cpu;
  if (name == "cuda") return DeviceKind::Cuda;
  return DeviceKind::Auto;
}

#ifdef GRANULE_HAVE_HUB
// hf://ORG/REPO/FILE.gguf: the header read from the Hub with range requests.
std::unique_ptr<ModelFile> remote_header(const std::string& url) {
  const std::string rest = url.substr(5);
  const auto first = rest.find('/');
  const auto second = first == std::string::npos ? first : rest.find('/', first + 1);
  if (second == std::string::npos)
    throw UsageError(url + " names no file; write hf://ORG/REPO/FILE.gguf");
  const std::string repo = rest.substr(0, second);
  const std::string file = rest.substr(second + 1);
  const hub::HubClient client(hub::HubSettings::from_environment());
  const hub::RepoListing listing = client.list_files(repo);
  for (const hub::RepoFile& f : listing.files) {
    if (f.path != file) continue;
    hub::RemoteHeader h = hub::fetch_header(client, repo, file, f.size);
    std::fprintf(stderr, "read the header of %s: %s in %d range requests\n", url.c_str(),
                 human_bytes(h.bytes_fetched).c_str(), h.requests);
    return std::move(h.file);
  }
  throw UsageError(url + ": " + repo + " has no file " + file);
}
#endif

FitEstimate estimate(const FitOptions& options, const std::unique_ptr<ModelFile>& remote,
                     const EngineOptions& engine_options) {
  return remote ? Engine::estimate(*remote, engine_options)
                : Engine::estimate(options.model, engine_options);
}

FitPreview make_preview(const FitOptions& options) {
  std::unique_ptr<ModelFile> remote;
  if (options.model.string().starts_with("hf://")) {
#ifdef GRANULE_HAVE_HUB
    remote = remote_header(options.model.string());
#else
    throw UnsupportedError("this granule-cli was built without the Hub client (libcurl)");
#endif
  }
  EngineOptions engine_options;
  engine_options.device = device_kind(options.device);
  engine_options.context_length = options.context;
  engine_options.max_sequences = options.chats;
  engine_options.vram_budget_bytes = options.vram_budget_bytes;
  FitPreview p;
  p.e = estimate(options, remote, engine_options);
  // A budget asks what it would give on a GPU, even where none is usable.
  if (!p.e.gpu && options.vram_budget_bytes > 0 && engine_options.device == DeviceKind::Auto) {
    engine_options.device = DeviceKind::Cuda;
    p.e = estimate(options, remote, engine_options);
    p.planning_without_gpu = true;
  }
  if (options.vram_budget_bytes > 0)
    p.budget_source = "--vram-budget";
  else if (p.e.gpu)
    p.budget_source = "the GPU's free memory minus a margin";
  else
    p.budget_source = "host memory, the CPU backend's default";
  return p;
}

// "layers 0-19 resident, 20-29 streamed"
std::string layer_ranges(const std::vector<bool>& streamed) {
  std::string text;
  for (size_t first = 0; first < streamed.size();) {
    size_t last = first;
    while (last + 1 < streamed.size() && streamed[last + 1] == streamed[first]) ++last;
    text += text.empty() ? "layers " : ", ";
    text += std::to_string(first);
    if (last > first) text += "-" + std::to_string(last);
    text += streamed[first] ? " streamed" : " resident";
    first = last + 1;
  }
  return text.empty() ? "no layers" : text;
}

// One character per layer: R resident, S streamed.
std::string layer_bar(const std::vector<bool>& streamed) {
  std::string bar;
  for (bool s : streamed) bar += s ? 'S' : 'R';
  return bar;
}

// "134.5M", "8.03B"
std::string parameter_count(uint64_t n) {
  char text[32];
  if (n >= 1'000'000'000)
    std::snprintf(text, sizeof text, "%.2fB", static_cast<double>(n) / 1e9);
  else
    std::snprintf(text, sizeof text, "%.1fM", static_cast<double>(n) / 1e6);
  return text;
}

std::string format(const char* spec, double value) {
  char text[64];
  std::snprintf(text, sizeof text, spec, value);
  return text;
}

int32_t layer_count(const FitEstimate& e) { return e.resident_layers + e.streamed_layers; }

bool is_moe(const FitEstimate& e) { return e.experts.n_expert > 0; }
int64_t expert_count(const FitEstimate& e) { return layer_count(e) * e.experts.n_expert; }

// "64 per layer", "62-63 per layer"
std::string per_layer(const std::vector<int32_t>& counts) {
  if (counts.empty()) return "no layers";
  const auto [low, high] = std::minmax_element(counts.begin(), counts.end());
  return std::to_string(*low) + (*low == *high ? "" : "-" + std::to_string(*high)) + " per layer";
}

// The verdict when the model loads: all layers resident, or how many stream.
std::string verdict(const FitEstimate& e) {
  if (is_moe(e)) {
    if (e.experts.resident_experts == expert_count(e)) return "fits: all experts resident";
    return "fits with expert streaming: " + std::to_string(e.experts.resident_experts) + " of " +
           std::to_string(expert_count(e)) + " experts resident";
  }
  if (e.streamed_layers == 0) return "fits: all layers resident";
  return "fits with streaming: " + std::to_string(e.streamed_layers) + " of " +
         std::to_string(layer_count(e)) + " layers streamed";
}

// A --vram-budget argument at least `bytes`: whole MiB, rounded up ("188MiB").
std::string budget_argument(uint64_t bytes) {
  constexpr uint64_t kMiB = 1ull << 20;
  return std::to_string((bytes + kMiB - 1) / kMiB) + "MiB";
}

// Why it does not load, naming the minimum budget and what to change.
std::string shortfall(const FitEstimate& e, const std::string& budget_source) {
  const std::string budget = human_bytes(e.budget_bytes);
  const std::string minimum = human_bytes(e.minimum_budget_bytes);
  if (!e.gpu) {
    return "does not load: the " + budget + " budget (" + budget_source + ") is below the " +
           minimum + " this model needs in host memory (weights and workspace)" +
           (budget_source == "--vram-budget"
                ? "; give --vram-budget " + budget_argument(e.minimum_budget_bytes) + " or more"
                : "");
  }
  const std::string needs =
      is_moe(e) ? " this model needs with every expert in host memory (embeddings and head, "
                  "attention, routers and shared experts, workspace and "
                : " this model needs with every layer streamed (embeddings and head, a staging "
                  "ring, workspace and ";
  return "does not load: the VRAM budget of " + budget + " (" + budget_source +
         ") is below the minimum of " + minimum + needs + human_bytes(e.kv_reserve_bytes) +
         " of KV); give --vram-budget " + budget_argument(e.minimum_budget_bytes) +
         " or more, or a shorter --ctx";
}

// When it loads but the chats cannot all have their full context: "the budget leaves KV for
// 1047 tokens per chat, less than the 4096 asked (--ctx); ..."
std::string context_note(const FitEstimate& e) {
  if (!e.loads || e.fits) return "";
  return "the budget leaves KV for " + std::to_string(e.max_context_per_chat) +
         " tokens per chat, less than the " + std::to_string(e.context_per_chat) +
         " asked (--ctx); chats past that wait or are recomputed";
}

// "label:   value"; an empty label continues the line above.
void field(const std::string& label, const std::string& value) {
  std::printf("%-20s %s\n", label.empty() ? "" : (label + ":").c_str(), value.c_str());
}

// A mixture of experts' plan: what always stays resident, one expert's bytes, how many
// experts the budget holds per layer, and what the others cost over PCIe per token.
void print_experts(const FitEstimate& e) {
  const ExpertFitEstimate& x = e.experts;
  field("experts", std::to_string(x.n_expert) + " per layer, " + std::to_string(x.n_expert_used) +
                       " routed per token (" + human_bytes(x.experts_bytes) + " in all)");
  field("always resident", human_bytes(x.always_resident_bytes) +
                               " (embeddings, head, attention, norms, routers, shared experts)");
  field("bytes per expert", human_bytes(x.expert_bytes) + " (gate, up and down of one layer)");
  field("resident experts", std::to_string(x.resident_experts) + " of " +
                                std::to_string(expert_count(e)) + " (" +
                                per_layer(x.resident_per_layer) + ")");
  if (e.gpu && e.staging_bytes > 0)
    field("expert staging", human_bytes(e.staging_bytes) +
                                " (a step's chosen experts from host memory, copied in per layer)");
  if (e.gpu && x.host_share > 0)
    field("host experts", "the CPU computes " + std::to_string(x.host_share) +
                              "/256 of batch 1's missed experts from its own int8 copies "
                              "(--host-experts)");
  if (e.gpu)
    field("pcie per token",
          human_bytes(static_cast<uint64_t>(x.pcie_bytes_per_token)) +
              " of experts in host memory at batch 1, uniform routing" +
              (x.host_share > 0
                   ? " (of " + human_bytes(static_cast<uint64_t>(x.missed_bytes_per_token)) +
                         " missed; the CPU computes the rest)"
                   : std::string()));
  if (!e.gpu)
    field("cpu experts",
          x.cpu_int8_experts
              ? "int8 copies (" + human_bytes(x.experts_bytes) + ", within the " +
                    human_bytes(x.cpu_copy_budget_bytes) + " the memory available leaves)"
              : "exact f32 path, several times slower (int8 copies of " +
                    human_bytes(x.experts_bytes) + " against the " +
                    human_bytes(x.cpu_copy_budget_bytes) +
                    " the memory available leaves, or a type the int8 kernels do not run)");
}

void print_text(const FitOptions& options, const FitPreview& p) {
  const FitEstimate& e = p.e;
  const ModelConfig& c = e.config;
  field("model", (c.name.empty() ? options.model.filename().string() : c.name) + " (" +
                     c.architecture + ", " + parameter_count(e.parameters) + " parameters, " +
                     e.block_type + ", " + human_bytes(e.file_bytes) + ")");
  field("device",
        e.device + (p.planning_without_gpu ? " (planning for a GPU: no GPU is usable here)" : ""));
  field("budget", human_bytes(e.budget_bytes) + " (" + p.budget_source + ")");
  field("context", std::to_string(e.context_per_chat) + " tokens per chat, " +
                       std::to_string(e.chats) + (e.chats == 1 ? " chat" : " chats"));
  field("minimum budget",
        human_bytes(e.minimum_budget_bytes) + (!e.gpu      ? " (weights and workspace)"
                                               : is_moe(e) ? " (every expert in host memory)"
                                                           : " (every layer streamed)"));
  if (is_moe(e)) {
    print_experts(e);
  } else {
    field("layers", std::to_string(e.resident_layers) + " of " + std::to_string(layer_count(e)) +
                        " resident: " + layer_ranges(e.layer_streamed));
    field("", layer_bar(e.layer_streamed));
  }
  field("resident weights", human_bytes(e.resident_weight_bytes));
  if (e.gpu && !is_moe(e)) {
    field("staging", human_bytes(e.staging_bytes));
    field("streamed per token", human_bytes(e.streamed_bytes_per_pass));
  }
  if (e.host_pinned_bytes > 0)
    field("pinned host", human_bytes(e.host_pinned_bytes) +
                             " (per-layer token table, read in place: not in the budget)");
  field("kv capacity", std::to_string(e.kv_capacity_tokens) + " tokens (" +
                           human_bytes(e.kv_bytes_per_token) + " per token)");
  if (e.kv_window_tokens > 0)
    field("kv window", human_bytes(e.kv_window_bytes_per_token) + " per token of it for the last " +
                           std::to_string(e.kv_window_tokens) +
                           " tokens only: " + human_bytes(e.kv_bytes_per_chat(e.context_per_chat)) +
                           " per chat at " + std::to_string(e.context_per_chat) + " tokens");
  field("max context/chat", std::to_string(e.max_context_per_chat) + " tokens");
  if (e.gpu) {
    const std::string h2d = "host-to-device " + format("%.1f GB/s", e.h2d_bytes_per_second / 1e9) +
                            (e.h2d_measured ? ", measured" : ", assumed: PCIe 4.0 x16");
    const bool streams = is_moe(e) ? e.experts.pcie_bytes_per_token > 0 : e.streamed_layers > 0;
    field("pcie bound", !streams ? "none: nothing streams (" + h2d + ")"
                                 : format("%.1f", e.pcie_tokens_per_second) +
                                       " tokens/s at batch 1 (" + h2d + ")");
    if (e.host_rows)
      field("host rows",
            "at decode batches of up to 8 the CPU computes part of each streamed "
            "layer's rows from its own int8 copies (the share measured at load, "
            "--host-rows), so batch 1 can pass the whole-layer bound");
  }
  if (!e.loads) return;  // the verdict is the error line
  if (const std::string note = context_note(e); !note.empty()) field("note", note);
  field("verdict", verdict(e));
}

void print_json(const FitOptions& options, const FitPreview& p) {
  const FitEstimate& e = p.e;
  nlohmann::ordered_json j;
  j["model"] = options.model.string();
  j["name"] = e.config.name;
  j["architecture"] = e.config.architecture;
  j["parameters"] = e.parameters;
  j["block_type"] = e.block_type;
  j["file_bytes"] = e.file_bytes;
  j["device"] = e.device;
  j["gpu"] = e.gpu;
  j["planning_without_gpu"] = p.planning_without_gpu;
  j["budget_bytes"] = e.budget_bytes;
  j["budget_source"] = p.budget_source;
  j["context_per_chat"] = e.context_per_chat;
  j["chats"] = e.chats;
  j["loads"] = e.loads;
  j["fits"] = e.fits;
  j["minimum_budget_bytes"] = e.minimum_budget_bytes;
  j["layers"] = layer_count(e);
  j["resident_layers"] = e.resident_layers;
  j["streamed_layers"] = e.streamed_layers;
  j["layer_map"] = layer_bar(e.layer_streamed);
  j["weights_bytes"] = e.weights_bytes;
  j["resident_weight_bytes"] = e.resident_weight_bytes;
  j["staging_bytes"] = e.staging_bytes;
  j["streamed_bytes_per_token"] = e.streamed_bytes_per_pass;
  j["workspace_bytes"] = e.workspace_bytes;
  j["kv_reserve_bytes"] = e.kv_reserve_bytes;
  j["host_pinned_bytes"] = e.host_pinned_bytes;
  j["kv_bytes_per_token"] = e.kv_bytes_per_token;
  j["kv_window_bytes_per_token"] = e.kv_window_bytes_per_token;
  j["kv_window_tokens"] = e.kv_window_tokens;
  j["kv_bytes_per_chat"] = e.kv_bytes_per_chat(e.context_per_chat);
  j["kv_capacity_tokens"] = e.kv_capacity_tokens;
  j["max_context_per_chat"] = e.max_context_per_chat;
  j["h2d_bytes_per_second"] = e.h2d_bytes_per_second;
  j["h2d_measured"] = e.h2d_measured;
  j["pcie_tokens_per_second"] = e.pcie_tokens_per_second;
  j["host_rows"] = e.host_rows;
  if (is_moe(e)) {
    const ExpertFitEstimate& x = e.experts;
    nlohmann::ordered_json experts;
    experts["n_expert"] = x.n_expert;
    experts["n_expert_used"] = x.n_expert_used;
    experts["always_resident_bytes"] = x.always_resident_bytes;
    experts["expert_bytes"] = x.expert_bytes;
    experts["experts_bytes"] = x.experts_bytes;
    experts["expert_budget_bytes"] = x.expert_budget_bytes;
    experts["resident_experts"] = x.resident_experts;
    experts["total_experts"] = expert_count(e);
    experts["resident_per_layer"] = x.resident_per_layer;
    experts["missed_bytes_per_token"] = x.missed_bytes_per_token;
    experts["host_share"] = x.host_share;
    experts["pcie_bytes_per_token"] = x.pcie_bytes_per_token;
    experts["pcie_tokens_per_second"] = x.pcie_tokens_per_second;
    if (!e.gpu) {
      experts["cpu_int8_experts"] = x.cpu_int8_experts;
      experts["cpu_copy_budget_bytes"] = x.cpu_copy_budget_bytes;
    }
    j["experts"] = experts;
  }
  j["verdict"] = e.loads ? verdict(e) : shortfall(e, p.budget_source);
  std::printf("%s\n", j.dump(2).c_str());
}

int run_fit(const FitOptions& options) {
  const FitPreview preview = make_preview(options);
  if (options.json)
    print_json(options, preview);
  else
    print_text(options, preview);
  std::fflush(stdout);
  // Exit status 1 and the one error line on stderr when it does not load.
  if (!preview.e.loads) throw CapacityError(shortfall(preview.e, preview.budget_source));
  return 0;
}

}  // namespace

Command add_fit_command(CLI::App& parent) {
  auto options = std::make_shared<FitOptions>();
  CLI::App* app = parent.add_subcommand(
      "fit",
      "Preview how a model fits a VRAM budget: resident and streamed layers (resident experts "
      "for a mixture of experts), KV room, the PCIe bound on decode speed (exit status 1 when "
      "it does not load)");
  app->add_option("model", options->model,
                  "GGUF model file, or hf://ORG/REPO/FILE.gguf (its header read from the Hub)")
      ->required();
  add_vram_budget_option(*app, options->vram_budget_bytes);
  app->add_option("-c,--ctx", options->context, "Context length per chat")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app->add_option("--chats", options->chats, "Concurrent chats (sequence slots)")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  app->add_option("--device", options->device,
                  "Plan for cpu, cuda or auto (auto with --vram-budget and no GPU here: plan "
                  "for a GPU)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  app->add_flag("--json", options->json, "Print the preview as one JSON object");
  return {app, [options] { return run_fit(*options); }, &options->model};
}

}  // namespace granule::cli
