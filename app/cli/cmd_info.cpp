// `granule-cli info MODEL`: what a GGUF file holds — the model's shapes, its block types
// and their sizes, the tokenizer and the chat template — also for vocabulary-only files.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"
#include "granule/chat_template.h"
#include "granule/constraint.h"
#include "granule/error.h"
#include "granule/gguf.h"
#include "granule/model_config.h"
#include "granule/tensor_type.h"

namespace granule::cli {
namespace {

void field(const std::string& label, const std::string& value) {
  std::printf("%-16s %s\n", (label + ":").c_str(), value.c_str());
}

std::string text_or(const ModelFile& file, std::string_view key, std::string fallback) {
  return file.get_string(key).value_or(std::move(fallback));
}

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

void print_model(const ModelConfig& config) {
  field("name", config.name.empty() ? "(none)" : config.name);
  field("layers", std::to_string(config.n_layer));
  field("hidden", std::to_string(config.n_embd));
  field("heads", std::to_string(config.n_head));
  field("kv heads", std::to_string(config.n_head_kv));
  field("head dim", std::to_string(config.head_dim));
  field("feed-forward", std::to_string(config.n_ff));
  field("vocab", std::to_string(config.n_vocab));
  field("context length", std::to_string(config.context_length));
  field("rope theta", number(config.rope_theta));
  if (config.rope_scaling.type != "none") {
    field("rope scaling", config.rope_scaling.type + " x" + number(config.rope_scaling.factor));
  }
  field("rms eps", number(config.rms_eps));
  if (config.sliding_window > 0) {
    int64_t sliding = 0;
    for (int64_t l = 0; l < config.n_layer; ++l) sliding += config.layer_slides(l) ? 1 : 0;
    field("sliding window",
          std::to_string(config.sliding_window) + " tokens on " + std::to_string(sliding) + " of " +
              std::to_string(config.n_layer) + " layers" +
              (config.rope_theta_swa > 0 ? ", rope theta " + number(config.rope_theta_swa) : ""));
  }
  std::string extras;
  if (config.qkv_bias) extras += " qkv-bias";
  if (config.qk_norm) extras += " qk-norm";
  if (config.tied_embeddings) extras += " tied-embeddings";
  if (config.sandwich_norms) extras += " sandwich-norms";
  if (config.activation == granule::FfnActivation::GeluTanh) extras += " geglu";
  if (config.final_logit_softcap > 0) extras += " logit-softcap";
  if (config.n_embd_per_layer > 0) extras += " per-layer-embeddings";
  if (!config.kv_layer.empty()) extras += " shared-kv";
  if (!extras.empty()) field("features", extras.substr(1));
}

struct TypeUsage {
  uint32_t ggml_type = 0;
  int64_t tensors = 0;
  uint64_t bytes = 0;
};

// Block types by total bytes, largest first.
std::vector<TypeUsage> type_usage(const ModelFile& file) {
  std::map<uint32_t, TypeUsage> by_type;
  for (const TensorInfo& t : file.tensors()) {
    TypeUsage& usage = by_type[t.ggml_type];
    usage.ggml_type = t.ggml_type;
    ++usage.tensors;
    usage.bytes += t.size_bytes;
  }
  std::vector<TypeUsage> sorted;
  for (const auto& [type, usage] : by_type) sorted.push_back(usage);
  std::sort(sorted.begin(), sorted.end(),
            [](const TypeUsage& a, const TypeUsage& b) { return a.bytes > b.bytes; });
  return sorted;
}

void print_tensors(const ModelFile& file, std::optional<uint32_t> dominant_type) {
  field("tensors", std::to_string(file.tensors().size()));
  const std::vector<TypeUsage> usage = type_usage(file);
  for (const TypeUsage& u : usage) {
    field("  " + tensor_type_name(u.ggml_type), std::to_string(u.tensors) +
                                                    (u.tensors == 1 ? " tensor, " : " tensors, ") +
                                                    human_bytes(u.bytes));
  }
  if (!dominant_type && !usage.empty()) dominant_type = usage.front().ggml_type;
  if (dominant_type) field("dominant type", tensor_type_name(*dominant_type));
}

void print_tokenizer(const ModelFile& file) {
  const GgufValue* tokens = file.find("tokenizer.ggml.tokens");
  if (tokens == nullptr) {
    field("tokenizer", "(none)");
    return;
  }
  std::string model = text_or(file, "tokenizer.ggml.model", "?");
  if (auto pre = file.get_string("tokenizer.ggml.pre")) model += " (pre-tokenizer " + *pre + ")";
  field("tokenizer", model);
  field("vocab size", std::to_string(tokens->array_size()));
  auto token_field = [&](const char* label, const char* key) {
    if (auto id = file.get_int(key)) field(label, std::to_string(*id));
  };
  token_field("bos id", "tokenizer.ggml.bos_token_id");
  token_field("eos id", "tokenizer.ggml.eos_token_id");
}

void print_chat_template(const ModelFile& file) {
  const std::optional<std::string> source = file.get_string("tokenizer.chat_template");
  if (!source) {
    field("chat template", "(none in the file)");
    return;
  }
  try {
    const ChatTemplate tmpl = ChatTemplate::detect(*source);
    field("chat template", tmpl.name());
    field("template engine",
          tmpl.uses_jinja() ? "Jinja (the model's own template)" : "hand-written family");
    field("structured output",
          structured_output_available()
              ? "yes (xgrammar: JSON schemas, grammars, tool calls)"
              : "no (built without xgrammar: bash packaging/setup.sh xgrammar)");
    if (tmpl.reasoning_format() != ReasoningFormat::None) {
      field("reasoning", tmpl.reasoning_format() == ReasoningFormat::Harmony
                             ? "harmony channels (analysis, final)"
                             : "<think> blocks");
    }
    if (!tmpl.default_system_prompt().empty()) {
      field("default system", "\"" + tmpl.default_system_prompt() + "\"");
    }
  } catch (const UnsupportedError& e) {
    field("chat template", std::string(e.what()) + " (run and chat take --template NAME)");
  }
}

int run_info(const std::filesystem::path& path) {
  const std::unique_ptr<ModelFile> file = ModelFile::open(path);
  field("file", path.string());
  field("file size", human_bytes(file->file_size()) + " (" + std::to_string(file->file_size()) +
                         " bytes), GGUF v" + std::to_string(file->version()));
  field("architecture", text_or(*file, "general.architecture", "(none)"));

  std::optional<uint32_t> dominant_type;
  if (file->tensors().empty()) {
    field("name", text_or(*file, "general.name", "(none)"));
    field("weights", "none (vocabulary-only file)");
  } else {
    try {
      const ModelConfig config = ModelConfig::from_gguf(*file);
      print_model(config);
      dominant_type = config.dominant_type;
    } catch (const UnsupportedError& e) {
      // A valid file of a kind the engine cannot run still has a table worth showing.
      field("name", text_or(*file, "general.name", "(none)"));
      field("runnable", std::string("no: ") + e.what());
    }
  }
  if (!file->tensors().empty()) print_tensors(*file, dominant_type);
  print_tokenizer(*file);
  print_chat_template(*file);
  return 0;
}

}  // namespace

Command add_info_command(CLI::App& parent) {
  auto model = std::make_shared<std::filesystem::path>();
  CLI::App* app = parent.add_subcommand("info",
                                        "Show a GGUF file's architecture, shapes, "
                                        "block types, tokenizer and chat template");
  app->add_option("model", *model, "GGUF file")->required();
  return {app, [model] { return run_info(*model); }, model.get()};
}

}  // namespace granule::cli
