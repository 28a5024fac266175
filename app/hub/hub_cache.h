// huggingface_hub's cache layout, so that files it (or llama.cpp) downloaded are found and
// files Granule downloads are found by them:
//   CACHE/models--ORG--NAME/blobs/<etag>                 the file's bytes (etag: LFS SHA-256)
//   CACHE/models--ORG--NAME/blobs/<etag>.incomplete      a download in progress (resumable)
//   CACHE/models--ORG--NAME/refs/<revision>              the commit the revision pointed at
//   CACHE/models--ORG--NAME/snapshots/<commit>/<file>    a relative symlink to the blob
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace granule::hub {

struct CachedFile {
  std::string repo;            // "ORG/NAME"
  std::string file;            // path in the repository
  std::filesystem::path path;  // the snapshot's path (a symlink to the blob)
  uint64_t size = 0;
};

class HubCache {
 public:
  explicit HubCache(std::filesystem::path root) : root_(std::move(root)) {}
  const std::filesystem::path& root() const { return root_; }

  std::filesystem::path repo_dir(const std::string& repo) const;
  std::filesystem::path blob_path(const std::string& repo, const std::string& etag) const;
  std::filesystem::path incomplete_path(const std::string& repo, const std::string& etag) const;
  std::filesystem::path snapshot_path(const std::string& repo, const std::string& commit,
                                      const std::string& file) const;
  // The commit refs/<revision> records; a 40-hex revision is its own commit.
  std::optional<std::string> commit_of(const std::string& repo, const std::string& revision) const;
  // The cached file at the revision (its snapshot path, whose blob exists), if any.
  std::optional<std::filesystem::path> find(const std::string& repo, const std::string& file,
                                            const std::string& revision = "main") const;
  // Points snapshots/<commit>/<file> at blobs/<etag> and records refs/<revision>; returns
  // the snapshot path. Throws Error when the file system refuses.
  std::filesystem::path link(const std::string& repo, const std::string& revision,
                             const std::string& commit, const std::string& file,
                             const std::string& etag) const;
  // Every .gguf file of every cached model repository (newest snapshot of each ref first).
  std::vector<CachedFile> list_gguf() const;

 private:
  std::filesystem::path root_;
};

}  // namespace granule::hub
