// `granule-cli search TEXT`: GGUF repositories on the Hub matching TEXT, most downloaded (or
// most recently updated) first, with the model's architecture and whether Granule runs it.
#include <cstdio>
#include <memory>
#include <string>

#include "cli.h"
#include "hub/hub_client.h"
#include "hub/hub_support.h"

namespace granule::cli {
namespace {

struct SearchOptions {
  std::string text;
  std::string sort = "downloads";
  int32_t limit = 20;
};

int run_search(const SearchOptions& options) {
  const hub::HubClient client(hub::HubSettings::from_environment());
  const auto repos = client.search(
      options.text, options.sort == "recent" ? hub::SearchSort::Recent : hub::SearchSort::Downloads,
      options.limit);
  if (repos.empty()) {
    std::printf("no GGUF repositories on %s match '%s'\n", client.settings().endpoint.c_str(),
                options.text.c_str());
    return 0;
  }
  std::printf("%-48s %10s  %-10s  %-12s %s\n", "repository", "downloads", "updated", "architecture",
              "granule");
  for (const hub::RepoSummary& r : repos) {
    const std::string arch = r.architecture.empty() ? "?" : r.architecture;
    std::string support = r.architecture.empty()                        ? "unknown"
                          : hub::architecture_supported(r.architecture) ? "supported"
                                                                        : "not supported";
    if (r.gated) support += ", gated";
    std::printf("%-48s %10lld  %-10s  %-12s %s\n", r.id.c_str(),
                static_cast<long long>(r.downloads), r.last_modified.substr(0, 10).c_str(),
                arch.c_str(), support.c_str());
  }
  return 0;
}

}  // namespace

Command add_search_command(CLI::App& parent) {
  auto options = std::make_shared<SearchOptions>();
  CLI::App* app = parent.add_subcommand(
      "search", "Search the Hugging Face Hub for GGUF models (HF_ENDPOINT, HF_TOKEN are read)");
  app->add_option("text", options->text, "Words to look for in repository names")->required();
  app->add_option("--sort", options->sort, "Order: downloads or recent")
      ->check(CLI::IsMember({"downloads", "recent"}))
      ->capture_default_str();
  app->add_option("-n,--limit", options->limit, "How many repositories to list")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  return {app, [options] { return run_search(*options); }, nullptr};
}

}  // namespace granule::cli
