// `granule-cli pull ORG/REPO[:QUANT]`: downloads a model from the Hub into huggingface_hub's
// cache (found there when it is already), with a progress bar; resumes what an earlier run
// left. Without QUANT it takes the largest quantisation that fits this machine, read from
// the files' headers before anything is downloaded.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include "cli.h"
#include "granule/engine.h"
#include "hub/downloader.h"
#include "hub/model_files.h"
#include "hub/remote_fit.h"

namespace granule::cli {
namespace {

struct PullOptions {
  std::string target;  // ORG/REPO[:QUANT]
  std::string revision = "main";
  uint64_t vram_budget_bytes = 0;
  int64_t context = 4096;
};

std::atomic<bool> g_interrupted{false};

void on_interrupt(int) { g_interrupted.store(true); }

std::string duration(double seconds) {
  if (seconds < 0) return "--:--";
  const auto s = static_cast<long long>(seconds);
  char text[32];
  if (s >= 3600)
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(text, sizeof text, "%02lld:%02lld", s / 60, s % 60);
  return text;
}

// One line, redrawn in place on a terminal (a line per state change otherwise).
void draw(const hub::DownloadProgress& p, int part, int parts) {
  static std::string last_state;
  const bool tty = isatty(STDERR_FILENO) != 0;
  if (!tty && p.state == last_state) return;
  last_state = p.state;
  const double fraction =
      p.total_bytes ? static_cast<double>(p.done_bytes) / static_cast<double>(p.total_bytes) : 0;
  constexpr int kWidth = 28;
  const int filled = static_cast<int>(fraction * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar += std::string(static_cast<size_t>(kWidth - filled), '-');
  std::fprintf(
      stderr, "%s[%s] %5.1f%% %s / %s  %s/s  ETA %s%s%s%s", tty ? "\r" : "", bar.c_str(),
      100.0 * fraction, human_bytes(p.done_bytes).c_str(), human_bytes(p.total_bytes).c_str(),
      human_bytes(static_cast<uint64_t>(p.bytes_per_second)).c_str(),
      duration(p.eta_seconds).c_str(),
      parts > 1 ? (" part " + std::to_string(part) + "/" + std::to_string(parts)).c_str() : "",
      p.state == "downloading" ? "" : ("  " + p.state).c_str(), tty ? "\033[K" : "\n");
  std::fflush(stderr);
}

int run_pull(const PullOptions& options) {
  std::string repo = options.target;
  std::string quant;
  if (const auto colon = repo.find(':'); colon != std::string::npos) {
    quant = repo.substr(colon + 1);
    repo = repo.substr(0, colon);
  }
  hub::check_repo_id(repo);
  const hub::HubClient client(hub::HubSettings::from_environment());
  const hub::RepoListing listing = client.list_files(repo, options.revision);
  const std::vector<hub::GgufModel> models = hub::gguf_models(listing);
  const hub::GgufModel* chosen = nullptr;
  if (!quant.empty()) {
    chosen = &hub::find_quant(models, quant, repo);
  } else {
    // The largest that fits, from the headers alone.
    EngineOptions engine_options;
    engine_options.context_length = options.context;
    engine_options.max_sequences = 1;  // as `granule-cli fit` plans by default
    engine_options.vram_budget_bytes = options.vram_budget_bytes;
    std::vector<hub::QuantFit> fits;
    for (const hub::GgufModel& m : models) {
      if (m.projector) continue;
      fits.push_back(hub::fit_remote(client, listing, m, engine_options));
      const hub::QuantFit& q = fits.back();
      std::fprintf(stderr, "%-10s %10s  %s\n", m.label.c_str(), human_bytes(m.size_bytes).c_str(),
                   q.fit ? (q.fit->fits    ? "fits"
                            : q.fit->loads ? "loads with streaming"
                                           : "does not load")
                         : q.error.c_str());
    }
    const int best = hub::recommended_quant(fits);
    if (best < 0)
      throw CapacityError(repo + ": no quantisation loads here; name one with " + repo + ":QUANT");
    for (const hub::GgufModel& m : models)
      if (m.first().path == fits[static_cast<size_t>(best)].model.first().path) chosen = &m;
    std::fprintf(stderr, "taking %s, the largest that %s\n", chosen->label.c_str(),
                 fits[static_cast<size_t>(best)].fit->fits ? "fits" : "loads");
  }
  std::signal(SIGINT, on_interrupt);
  std::signal(SIGTERM, on_interrupt);
  const hub::Downloader downloader(client, hub::HubCache(client.settings().cache_dir));
  std::filesystem::path first;
  const int parts = static_cast<int>(chosen->parts.size());
  for (int i = 0; i < parts; ++i) {
    const hub::RepoFile& file = chosen->parts[static_cast<size_t>(i)];
    if (auto cached = downloader.cache().find(repo, file.path, options.revision)) {
      std::fprintf(stderr, "%s: already in %s\n", file.path.c_str(),
                   downloader.cache().root().c_str());
      if (i == 0) first = *cached;
      continue;
    }
    try {
      const auto path = downloader.download(
          repo, file, options.revision,
          [&](const hub::DownloadProgress& p) { draw(p, i + 1, parts); }, &g_interrupted);
      if (isatty(STDERR_FILENO)) std::fprintf(stderr, "\n");
      if (i == 0) first = path;
    } catch (const hub::DownloadStopped& e) {
      std::fprintf(stderr, "\n");
      throw Error(std::string(e.what()) + "; run the same pull again to resume");
    }
  }
  if (parts > 1)
    std::fprintf(stderr,
                 "note: %s is split into %d files, which Granule does not open yet; merge them "
                 "with llama-gguf-split --merge %s OUT.gguf\n",
                 chosen->label.c_str(), parts, first.c_str());
  std::printf("%s\n", first.c_str());
  return 0;
}

}  // namespace

Command add_pull_command(CLI::App& parent) {
  auto options = std::make_shared<PullOptions>();
  CLI::App* app = parent.add_subcommand(
      "pull",
      "Download a GGUF model from the Hugging Face Hub into its cache (HF_HOME, HF_HUB_CACHE, "
      "HF_ENDPOINT, HF_TOKEN are read); prints the file's path");
  app->add_option("model", options->target,
                  "ORG/REPO[:QUANT], e.g. bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M; without QUANT "
                  "the largest that fits")
      ->required();
  app->add_option("--revision", options->revision, "Branch, tag or commit")->capture_default_str();
  add_vram_budget_option(*app, options->vram_budget_bytes);
  app->add_option("-c,--ctx", options->context, "Context length per chat the fit assumes")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  return {app, [options] { return run_pull(*options); }, nullptr};
}

}  // namespace granule::cli
