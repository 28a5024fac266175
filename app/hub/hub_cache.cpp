// HubCache: paths, refs and snapshot links of huggingface_hub's cache (file_download.py).
#include "hub/hub_cache.h"

#include <fstream>
#include <set>
#include <system_error>

#include "granule/error.h"

namespace granule::hub {
namespace fs = std::filesystem;

namespace {

bool is_commit_hash(const std::string& s) {
  if (s.size() != 40) return false;
  for (char c : s)
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

std::string repo_folder_name(const std::string& repo) {
  std::string name = "models--";
  for (char c : repo) name += c == '/' ? std::string("--") : std::string(1, c);
  return name;
}

}  // namespace

fs::path HubCache::repo_dir(const std::string& repo) const {
  return root_ / repo_folder_name(repo);
}

fs::path HubCache::blob_path(const std::string& repo, const std::string& etag) const {
  return repo_dir(repo) / "blobs" / etag;
}

fs::path HubCache::incomplete_path(const std::string& repo, const std::string& etag) const {
  return repo_dir(repo) / "blobs" / (etag + ".incomplete");
}

fs::path HubCache::snapshot_path(const std::string& repo, const std::string& commit,
                                 const std::string& file) const {
  return repo_dir(repo) / "snapshots" / commit / fs::path(file);
}

std::optional<std::string> HubCache::commit_of(const std::string& repo,
                                               const std::string& revision) const {
  if (is_commit_hash(revision)) return revision;
  std::ifstream ref(repo_dir(repo) / "refs" / revision);
  std::string commit;
  if (ref && std::getline(ref, commit) && is_commit_hash(commit)) return commit;
  return std::nullopt;
}

std::optional<fs::path> HubCache::find(const std::string& repo, const std::string& file,
                                       const std::string& revision) const {
  const auto commit = commit_of(repo, revision);
  if (!commit) return std::nullopt;
  const fs::path path = snapshot_path(repo, *commit, file);
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return path;  // follows the link: the blob is there
  return std::nullopt;
}

fs::path HubCache::link(const std::string& repo, const std::string& revision,
                        const std::string& commit, const std::string& file,
                        const std::string& etag) const {
  const fs::path snapshot = snapshot_path(repo, commit, file);
  const fs::path blob = blob_path(repo, etag);
  std::error_code ec;
  fs::create_directories(snapshot.parent_path(), ec);
  if (ec) throw Error(snapshot.parent_path().string() + ": cannot create: " + ec.message());
  fs::remove(snapshot, ec);
  // Relative, as huggingface_hub makes it, so the cache can move.
  fs::create_symlink(fs::relative(blob, snapshot.parent_path()), snapshot, ec);
  if (ec) {  // a file system without links: a copy-free hard link, else a copy
    fs::create_hard_link(blob, snapshot, ec);
    if (ec) fs::copy_file(blob, snapshot, fs::copy_options::overwrite_existing, ec);
    if (ec)
      throw Error(snapshot.string() + ": cannot link to " + blob.string() + ": " + ec.message());
  }
  if (!is_commit_hash(revision) || revision != commit) {
    fs::create_directories(repo_dir(repo) / "refs", ec);
    std::ofstream ref(repo_dir(repo) / "refs" / revision, std::ios::trunc);
    ref << commit;
  }
  return snapshot;
}

std::vector<CachedFile> HubCache::list_gguf() const {
  std::vector<CachedFile> files;
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return files;
  for (const auto& repo_entry : fs::directory_iterator(root_, ec)) {
    const std::string folder = repo_entry.path().filename().string();
    if (!folder.starts_with("models--")) continue;
    std::string repo = folder.substr(8);
    const auto sep = repo.find("--");
    if (sep == std::string::npos) continue;
    repo = repo.substr(0, sep) + "/" + repo.substr(sep + 2);
    std::set<std::string> seen;
    const fs::path snapshots = repo_entry.path() / "snapshots";
    if (!fs::is_directory(snapshots, ec)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(snapshots, ec)) {
      if (entry.path().extension() != ".gguf" || !fs::is_regular_file(entry.path(), ec)) continue;
      const fs::path relative = entry.path().lexically_relative(snapshots);
      const std::string file = relative.lexically_relative(*relative.begin()).generic_string();
      if (!seen.insert(file).second) continue;
      files.push_back(
          {repo, file, entry.path(), static_cast<uint64_t>(fs::file_size(entry.path(), ec))});
    }
  }
  return files;
}

}  // namespace granule::hub
