// Downloader::download, step by step as huggingface_hub's hf_hub_download does it: HEAD the
// resolve URL for the commit and the etag, take the lock, resume blobs/<etag>.incomplete
// with a Range GET, verify, move it to blobs/<etag>, link the snapshot.
#include "hub/downloader.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <memory>
#include <thread>

namespace granule::hub {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
    EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr);
  }
  void update(const void* data, size_t size) { EVP_DigestUpdate(ctx_.get(), data, size); }
  std::string hex() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx_.get(), digest, &n);
    std::string out;
    char byte[3];
    for (unsigned int i = 0; i < n; ++i) {
      std::snprintf(byte, sizeof byte, "%02x", digest[i]);
      out += byte;
    }
    return out;
  }

 private:
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx_;
};

// Adds a file's first `bytes` to the hash (a resumed download's earlier part).
void hash_prefix(Sha256& sha, const fs::path& path, uint64_t bytes) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> buffer(1 << 20);
  while (bytes > 0 && in) {
    in.read(buffer.data(), static_cast<std::streamsize>(std::min<uint64_t>(buffer.size(), bytes)));
    const auto n = static_cast<uint64_t>(in.gcount());
    if (n == 0) break;
    sha.update(buffer.data(), n);
    bytes -= n;
  }
  if (bytes != 0) throw HubError(path.string() + ": cannot read the partial download back");
}

// huggingface_hub's _normalize_etag: no weak prefix, no quotes.
std::string normalize_etag(std::string etag) {
  if (etag.starts_with("W/")) etag = etag.substr(2);
  if (etag.size() >= 2 && etag.front() == '"' && etag.back() == '"')
    etag = etag.substr(1, etag.size() - 2);
  return etag;
}

std::string human(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
  return text;
}

// The lock huggingface_hub takes around a blob (filelock: flock on CACHE/.locks/...).
class BlobLock {
 public:
  BlobLock(const fs::path& path) {
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ >= 0 && ::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd_);
      fd_ = -1;
      throw HubError(path.string() + ": another program is downloading this file now");
    }
  }
  ~BlobLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  BlobLock(const BlobLock&) = delete;
  BlobLock& operator=(const BlobLock&) = delete;

 private:
  int fd_ = -1;
};

// Rate over a sliding window of a few seconds.
class RateMeter {
 public:
  void add(uint64_t total_bytes) {
    const auto now = Clock::now();
    samples_.push_back({now, total_bytes});
    while (samples_.size() > 2 && now - samples_.front().first > std::chrono::seconds(5))
      samples_.pop_front();
  }
  double bytes_per_second() const {
    if (samples_.size() < 2) return 0;
    const double seconds =
        std::chrono::duration<double>(samples_.back().first - samples_.front().first).count();
    return seconds > 0
               ? static_cast<double>(samples_.back().second - samples_.front().second) / seconds
               : 0;
  }

 private:
  std::deque<std::pair<Clock::time_point, uint64_t>> samples_;
};

}  // namespace

std::string sha256_file(const fs::path& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) throw Error(path.string() + ": cannot read: " + ec.message());
  Sha256 sha;
  hash_prefix(sha, path, size);
  return sha.hex();
}

void Downloader::discard_partial(const std::string& repo, const RepoFile& file) const {
  if (file.sha256.empty()) return;
  std::error_code ec;
  fs::remove(cache_.incomplete_path(repo, file.sha256), ec);
}

fs::path Downloader::download(const std::string& repo, const RepoFile& file,
                              const std::string& revision, const ProgressFn& progress,
                              const std::atomic<bool>* cancel) const {
  check_repo_id(repo);
  if (auto cached = cache_.find(repo, file.path, revision)) return *cached;

  // The file's commit and etag, as huggingface_hub reads them (redirects not followed).
  const std::string url = client_.resolve_url(repo, file.path, revision);
  HttpResponse head;
  for (int attempt = 0;; ++attempt) {
    HttpRequest request = client_.request(url);
    request.head = true;
    request.follow_redirects = false;
    TransferResult t = perform(request, {}, cancel);
    if (!t.error.empty()) throw HubError(repo + "/" + file.path + ": " + t.error);
    head = t.response;
    if (head.status < 400) break;
    HubError error = client_.error_for(head, repo + "/" + file.path);
    if (head.status != 429 || attempt >= 2 || error.retry_after_seconds <= 0 ||
        error.retry_after_seconds > client_.settings().max_retry_after_seconds)
      throw error;
    if (progress) progress({file.path, 0, file.size, 0, -1, "waiting: rate-limited by the Hub"});
    std::this_thread::sleep_for(std::chrono::seconds(error.retry_after_seconds));
  }
  const std::string commit = head.header("x-repo-commit");
  std::string etag = normalize_etag(
      !head.header("x-linked-etag").empty() ? head.header("x-linked-etag") : head.header("etag"));
  if (commit.empty() || etag.empty())
    throw HubError(repo + "/" + file.path +
                   ": the Hub's answer has no commit or ETag header "
                   "(is HF_ENDPOINT a Hub?)");
  uint64_t total = file.size;
  if (const std::string linked = head.header("x-linked-size"); !linked.empty())
    total = std::strtoull(linked.c_str(), nullptr, 10);
  const std::string expected_sha =
      !file.sha256.empty() ? file.sha256 : (etag.size() == 64 ? etag : "");

  const fs::path blob = cache_.blob_path(repo, etag);
  std::error_code ec;
  if (fs::is_regular_file(blob, ec) && fs::file_size(blob, ec) == total)
    return cache_.link(repo, revision, commit, file.path, etag);  // the same bytes, another name

  fs::create_directories(blob.parent_path(), ec);
  if (ec) throw HubError(blob.parent_path().string() + ": cannot create: " + ec.message());
  BlobLock lock(cache_.root() / ".locks" / cache_.repo_dir(repo).filename() / (etag + ".lock"));
  const fs::path partial = cache_.incomplete_path(repo, etag);
  uint64_t done = fs::is_regular_file(partial, ec) ? fs::file_size(partial, ec) : 0;
  if (done > total) {
    fs::remove(partial, ec);
    done = 0;
  }
  const fs::space_info space = fs::space(blob.parent_path(), ec);
  if (!ec && space.available < total - done)
    throw HubError(repo + "/" + file.path + ": needs " + human(total - done) +
                   " of disk space in " + blob.parent_path().string() + ", " +
                   human(space.available) + " is free");

  Sha256 sha;
  hash_prefix(sha, partial, done);
  RateMeter rate;
  rate.add(done);
  auto report = [&](const std::string& state) {
    if (!progress) return;
    const double bps = rate.bytes_per_second();
    progress({file.path, done, total, bps, bps > 0 ? static_cast<double>(total - done) / bps : -1,
              state});
  };
  report(done > 0 ? "resuming" : "downloading");
  int resumes = 0;
  int waits = 0;
  auto last_report = Clock::now();
  while (done < total) {
    std::FILE* out = std::fopen(partial.c_str(), "ab");
    if (out == nullptr)
      throw HubError(partial.string() + ": cannot write: " + std::strerror(errno));
    bool write_failed = false;
    HttpRequest get = client_.request(url);
    if (done > 0) get.range_begin = done;
    TransferResult t = perform(
        get,
        [&](long status, const char* data, size_t size) {
          if (status == 200 && done > 0 && get.range_begin) {
            // The server ignored Range and sends the file from its start: start over.
            out = std::freopen(partial.c_str(), "wb", out);
            if (out == nullptr) {
              write_failed = true;
              return false;
            }
            done = 0;
            sha = Sha256();
            get.range_begin.reset();
          }
          if (std::fwrite(data, 1, size, out) != size) {
            write_failed = true;
            return false;
          }
          sha.update(data, size);
          done += size;
          rate.add(done);
          if (Clock::now() - last_report > std::chrono::milliseconds(200)) {
            last_report = Clock::now();
            report("downloading");
          }
          return true;
        },
        cancel);
    if (out != nullptr) std::fclose(out);
    if (write_failed) throw HubError(partial.string() + ": write failed (disk full?)");
    if (t.stopped && cancel != nullptr && cancel->load())
      throw DownloadStopped(repo + "/" + file.path + ": stopped; " + std::to_string(done) + " of " +
                            std::to_string(total) + " bytes kept to resume");
    const long code = t.response.status;
    if (code >= 400) {
      if (code == 416 && done >= total) break;
      HubError error = client_.error_for(t.response, repo + "/" + file.path);
      if (code == 429 && waits < 3 && error.retry_after_seconds > 0 &&
          error.retry_after_seconds <= client_.settings().max_retry_after_seconds) {
        ++waits;
        report("waiting: rate-limited by the Hub for " + std::to_string(error.retry_after_seconds) +
               " s");
        std::this_thread::sleep_for(std::chrono::seconds(error.retry_after_seconds));
        continue;
      }
      throw error;
    }
    if (!t.error.empty() || done < total) {
      if (++resumes > client_.settings().max_resumes)
        throw HubError(repo + "/" + file.path + ": " +
                       (t.error.empty() ? "the connection ended early" : t.error) + " after " +
                       std::to_string(resumes - 1) + " resumes; " + std::to_string(done) +
                       " bytes are kept, run it again to resume");
      report(std::string("resuming after ") + (t.stalled ? "a stall" : "a dropped connection"));
      continue;
    }
  }
  if (done != total)
    throw HubError(repo + "/" + file.path + ": got " + std::to_string(done) + " bytes, expected " +
                   std::to_string(total));
  report("verifying");
  const std::string actual = sha.hex();
  if (!expected_sha.empty() && actual != expected_sha) {
    fs::remove(partial, ec);
    throw HubError(repo + "/" + file.path + ": SHA-256 mismatch (expected " + expected_sha +
                   ", got " + actual + "); the partial file was deleted, download it again");
  }
  fs::rename(partial, blob, ec);
  if (ec) throw HubError(blob.string() + ": cannot move the download into place: " + ec.message());
  return cache_.link(repo, revision, commit, file.path, etag);
}

}  // namespace granule::hub
