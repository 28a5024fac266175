// Where the Hub client talks to and keeps files: huggingface_hub's environment variables
// (HF_ENDPOINT, HF_HOME, HF_HUB_CACHE, HF_TOKEN, HF_TOKEN_PATH) read the way it reads them,
// so a file huggingface_hub or llama.cpp downloaded is found and not fetched again.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

namespace granule::hub {

struct HubSettings {
  std::string endpoint = "https://huggingface.co";  // no trailing slash
  std::string token;                                // empty: anonymous
  std::filesystem::path cache_dir;                  // HF_HUB_CACHE: models--ORG--NAME/ inside
  // A transfer that moves no byte for this long is a stall: the download is resumed (and
  // a header fetch fails) instead of waiting forever.
  int32_t stall_timeout_seconds = 30;
  // A 429's Retry-After up to this is waited out (and the request retried); a longer one is
  // the error "rate-limited by the Hub: retry in N s".
  int32_t max_retry_after_seconds = 60;
  // Dropped connections and stalls a download survives by resuming before it gives up.
  int32_t max_resumes = 5;

  // The environment's settings: HF_ENDPOINT, HF_HUB_CACHE (else HF_HOME/hub, HF_HOME
  // defaulting to $XDG_CACHE_HOME/huggingface or ~/.cache/huggingface), and the token from
  // HF_TOKEN or the file huggingface_hub's `hf auth login` writes (HF_TOKEN_PATH, else
  // HF_HOME/token).
  static HubSettings from_environment();
};

}  // namespace granule::hub
