// The Hub's web API as huggingface_hub uses it: search GGUF repositories, list a
// repository's files with their sizes and LFS SHA-256s, read byte ranges of a file. Each
// HTTP failure is a HubError whose message says what to do (a token, a licence, a wait).
#pragma once
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "granule/error.h"
#include "hub/http_client.h"
#include "hub/hub_settings.h"

namespace granule::hub {

class HubError : public Error {
 public:
  HubError(const std::string& what, long status = 0, int32_t retry_after_seconds = 0)
      : Error(what), http_status(status), retry_after_seconds(retry_after_seconds) {}
  long http_status;             // 0: not an HTTP status (transport, checksum, disk)
  int32_t retry_after_seconds;  // a 429's Retry-After
};

// "ORG/NAME": checked before it goes into a URL.
void check_repo_id(const std::string& repo);

struct RepoSummary {
  std::string id;  // "ORG/NAME"
  int64_t downloads = 0;
  int64_t likes = 0;
  std::string last_modified;  // ISO 8601, as the Hub gives it
  std::string architecture;   // the GGUF's general.architecture when the Hub reports it
  bool gated = false;
};

enum class SearchSort { Downloads, Recent };

struct RepoFile {
  std::string path;
  uint64_t size = 0;
  std::string sha256;  // the LFS object id; empty for files kept in git
};

struct RepoListing {
  std::string repo;
  std::string revision;  // as asked ("main")
  std::vector<RepoFile> files;
};

class HubClient {
 public:
  explicit HubClient(HubSettings settings) : settings_(std::move(settings)) {}
  const HubSettings& settings() const { return settings_; }

  // GGUF repositories matching `text`, most downloaded or most recently changed first.
  std::vector<RepoSummary> search(const std::string& text, SearchSort sort,
                                  int32_t limit = 30) const;
  // Every file of the repository at `revision` (recursively).
  RepoListing list_files(const std::string& repo, const std::string& revision = "main") const;
  // Bytes [begin, end) of a file; fewer only when the file ends first.
  std::vector<uint8_t> read_range(const std::string& repo, const std::string& file, uint64_t begin,
                                  uint64_t end, const std::string& revision = "main") const;

  std::string resolve_url(const std::string& repo, const std::string& file,
                          const std::string& revision = "main") const;
  std::vector<std::string> auth_headers() const;
  // A request to `url` with the token and the stall timeout set.
  HttpRequest request(const std::string& url) const;
  // A GET of a JSON document with the 401/403/404/429 handling; the body.
  std::string get_json(const std::string& url) const;
  // The HubError for a failed response, naming what was asked for.
  HubError error_for(const HttpResponse& response, const std::string& what) const;

 private:
  HubSettings settings_;
};

}  // namespace granule::hub
