// Downloads of Hub files into huggingface_hub's cache: resumed with HTTP Range after a
// dropped connection, a stall or a restart (the .incomplete file is kept), SHA-256 checked
// against the Hub's LFS object id before the file is used, the free disk space checked
// before the transfer starts, cancellable, with progress (bytes, rate, ETA).
#pragma once
#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "hub/hub_cache.h"
#include "hub/hub_client.h"

namespace granule::hub {

struct DownloadProgress {
  std::string file;
  uint64_t done_bytes = 0;  // of this file, including what an earlier run left
  uint64_t total_bytes = 0;
  double bytes_per_second = 0;  // over the last few seconds
  double eta_seconds = -1;      // -1: unknown
  std::string state;            // "downloading", "verifying", "waiting: rate-limited", "resuming"
};
using ProgressFn = std::function<void(const DownloadProgress&)>;

// A download stopped by its cancel flag: the partial file stays for a later resume
// (discard_partial removes it).
class DownloadStopped : public Error {
  using Error::Error;
};

class Downloader {
 public:
  Downloader(const HubClient& client, HubCache cache) : client_(client), cache_(std::move(cache)) {}
  const HubCache& cache() const { return cache_; }

  // The file in the cache: found there (also when huggingface_hub put it there), or
  // downloaded. Returns its snapshot path. Throws HubError (HTTP, transport, checksum,
  // disk space) or DownloadStopped.
  std::filesystem::path download(const std::string& repo, const RepoFile& file,
                                 const std::string& revision = "main",
                                 const ProgressFn& progress = {},
                                 const std::atomic<bool>* cancel = nullptr) const;
  // Removes what a stopped download of `file` left (cancel, as opposed to pause).
  void discard_partial(const std::string& repo, const RepoFile& file) const;

 private:
  const HubClient& client_;
  HubCache cache_;
};

// "0123...": the SHA-256 of a file in hex. Throws Error when it cannot be read.
std::string sha256_file(const std::filesystem::path& path);

}  // namespace granule::hub
