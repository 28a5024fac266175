// HubSettings::from_environment: huggingface_hub's constants.py rules, in C++.
#include "hub/hub_settings.h"

#include <cstdlib>
#include <fstream>

namespace granule::hub {
namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

std::filesystem::path expand_user(const std::string& path) {
  if (path.starts_with("~/")) return std::filesystem::path(env("HOME")) / path.substr(2);
  return path;
}

std::string trimmed(std::string s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return {};
  const auto last = s.find_last_not_of(" \t\r\n");
  return s.substr(first, last - first + 1);
}

}  // namespace

HubSettings HubSettings::from_environment() {
  HubSettings s;
  if (std::string endpoint = env("HF_ENDPOINT"); !endpoint.empty()) {
    while (endpoint.ends_with('/')) endpoint.pop_back();
    s.endpoint = endpoint;
  }
  std::filesystem::path home;
  if (const std::string hf_home = env("HF_HOME"); !hf_home.empty()) {
    home = expand_user(hf_home);
  } else {
    const std::string xdg = env("XDG_CACHE_HOME");
    home = (xdg.empty() ? expand_user("~/.cache") : std::filesystem::path(xdg)) / "huggingface";
  }
  const std::string cache =
      !env("HF_HUB_CACHE").empty() ? env("HF_HUB_CACHE") : env("HUGGINGFACE_HUB_CACHE");
  s.cache_dir = cache.empty() ? home / "hub" : expand_user(cache);
  s.token = trimmed(env("HF_TOKEN"));
  if (s.token.empty()) {
    const std::string token_path = env("HF_TOKEN_PATH");
    std::ifstream file(token_path.empty() ? home / "token" : expand_user(token_path));
    std::string line;
    if (file && std::getline(file, line)) s.token = trimmed(line);
  }
  return s;
}

}  // namespace granule::hub
