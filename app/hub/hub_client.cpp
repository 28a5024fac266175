// HubClient: /api/models (search), /api/models/{repo}/tree/{revision} (files) and
// /{repo}/resolve/{revision}/{file} with a Range header (headers for the fit preview).
#include "hub/hub_client.h"

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

namespace granule::hub {
namespace {

// "/"-separated path segments escaped, the slashes kept.
std::string escape_path(const std::string& path) {
  std::string out;
  size_t start = 0;
  while (true) {
    const size_t slash = path.find('/', start);
    out += url_escape(
        path.substr(start, slash == std::string::npos ? std::string::npos : slash - start));
    if (slash == std::string::npos) break;
    out += '/';
    start = slash + 1;
  }
  return out;
}

int32_t retry_after(const HttpResponse& response) {
  const std::string value = response.header("retry-after");
  if (value.empty()) return 0;
  char* end = nullptr;
  const long seconds = std::strtol(value.c_str(), &end, 10);
  return end != value.c_str() && seconds > 0 ? static_cast<int32_t>(std::min(seconds, 86400L)) : 0;
}

// The Hub's own error text ({"error": "..."} or X-Error-Message), when it gives one.
std::string hub_message(const HttpResponse& response) {
  if (std::string m = response.header("x-error-message"); !m.empty()) return m;
  const auto j = nlohmann::json::parse(response.body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_string())
    return j["error"].get<std::string>();
  return {};
}

}  // namespace

void check_repo_id(const std::string& repo) {
  const auto slash = repo.find('/');
  auto valid = [](const std::string& part) {
    if (part.empty() || part.size() > 96 || part == "." || part == "..") return false;
    for (unsigned char c : part)
      if (!std::isalnum(c) && c != '-' && c != '_' && c != '.') return false;
    return true;
  };
  if (slash == std::string::npos || !valid(repo.substr(0, slash)) || !valid(repo.substr(slash + 1)))
    throw UsageError("'" + repo + "' is not a Hub repository; write it as ORG/NAME");
}

std::vector<std::string> HubClient::auth_headers() const {
  if (settings_.token.empty()) return {};
  return {"Authorization: Bearer " + settings_.token};
}

HttpRequest HubClient::request(const std::string& url) const {
  HttpRequest r;
  r.url = url;
  r.headers = auth_headers();
  r.stall_timeout_seconds = settings_.stall_timeout_seconds;
  return r;
}

std::string HubClient::resolve_url(const std::string& repo, const std::string& file,
                                   const std::string& revision) const {
  return settings_.endpoint + "/" + repo + "/resolve/" + url_escape(revision) + "/" +
         escape_path(file);
}

HubError HubClient::error_for(const HttpResponse& r, const std::string& what) const {
  const std::string detail = hub_message(r);
  const std::string suffix = detail.empty() ? "" : " (the Hub says: " + detail + ")";
  switch (r.status) {
    case 401:
      return HubError(what + ": the Hub wants a token" +
                          (settings_.token.empty() ? " and none is set; set HF_TOKEN or log in"
                                                   : ", and the one set was refused; check it") +
                          suffix,
                      r.status);
    case 403:
      return HubError(what +
                          ": access denied — the repository is gated or private; accept its "
                          "licence on the Hub with the account of your token" +
                          suffix,
                      r.status);
    case 404:
      return HubError(
          what + ": not found on the Hub (check the name" +
              (settings_.token.empty() ? "; a private repository needs a token)" : ")") + suffix,
          r.status);
    case 429: {
      const int32_t wait = retry_after(r);
      return HubError(what + ": rate-limited by the Hub; retry " +
                          (wait > 0 ? "in " + std::to_string(wait) + " s" : "later") + suffix,
                      r.status, wait);
    }
    default:
      return HubError(what + ": the Hub answered HTTP " + std::to_string(r.status) + suffix,
                      r.status);
  }
}

std::string HubClient::get_json(const std::string& url) const {
  for (int attempt = 0;; ++attempt) {
    HttpRequest request = this->request(url);
    request.headers.push_back("Accept: application/json");
    TransferResult t = perform(request);
    if (!t.error.empty())
      throw HubError(url + ": " + t.error +
                     " (is the Hub reachable? proxies come from http_proxy/https_proxy)");
    if (t.response.status >= 200 && t.response.status < 300) return t.response.body;
    HubError error = error_for(t.response, url);
    if (t.response.status == 429 && attempt < 2 && error.retry_after_seconds > 0 &&
        error.retry_after_seconds <= settings_.max_retry_after_seconds) {
      std::this_thread::sleep_for(std::chrono::seconds(error.retry_after_seconds));
      continue;
    }
    throw error;
  }
}

std::vector<RepoSummary> HubClient::search(const std::string& text, SearchSort sort,
                                           int32_t limit) const {
  const std::string url =
      settings_.endpoint + "/api/models?search=" + url_escape(text) +
      "&filter=gguf&sort=" + (sort == SearchSort::Downloads ? "downloads" : "lastModified") +
      "&direction=-1&limit=" + std::to_string(limit) +
      "&expand=downloads&expand=likes&expand=lastModified&expand=gguf&expand=gated";
  const auto j = nlohmann::json::parse(get_json(url), nullptr, false);
  if (!j.is_array()) throw HubError("the Hub's search answer is not a list");
  std::vector<RepoSummary> repos;
  for (const auto& m : j) {
    if (!m.is_object() || !m.contains("id") || !m["id"].is_string()) continue;
    RepoSummary r;
    r.id = m["id"].get<std::string>();
    if (m.contains("downloads") && m["downloads"].is_number())
      r.downloads = m["downloads"].get<int64_t>();
    if (m.contains("likes") && m["likes"].is_number()) r.likes = m["likes"].get<int64_t>();
    if (m.contains("lastModified") && m["lastModified"].is_string())
      r.last_modified = m["lastModified"].get<std::string>();
    if (m.contains("gguf") && m["gguf"].is_object() && m["gguf"].contains("architecture") &&
        m["gguf"]["architecture"].is_string())
      r.architecture = m["gguf"]["architecture"].get<std::string>();
    // "gated" is false, "auto" or "manual".
    if (m.contains("gated"))
      r.gated = m["gated"].is_string() || (m["gated"].is_boolean() && m["gated"].get<bool>());
    repos.push_back(std::move(r));
  }
  return repos;
}

RepoListing HubClient::list_files(const std::string& repo, const std::string& revision) const {
  check_repo_id(repo);
  RepoListing listing{repo, revision, {}};
  const std::string url = settings_.endpoint + "/api/models/" + repo + "/tree/" +
                          url_escape(revision) + "?recursive=true&expand=false";
  const auto j = nlohmann::json::parse(get_json(url), nullptr, false);
  if (!j.is_array()) throw HubError(repo + ": the Hub's file list is not a list");
  for (const auto& entry : j) {
    if (!entry.is_object() || entry.value("type", "") != "file" || !entry.contains("path"))
      continue;
    RepoFile f;
    f.path = entry["path"].get<std::string>();
    if (entry.contains("size") && entry["size"].is_number_unsigned())
      f.size = entry["size"].get<uint64_t>();
    if (entry.contains("lfs") && entry["lfs"].is_object()) {
      const auto& lfs = entry["lfs"];
      if (lfs.contains("oid") && lfs["oid"].is_string()) f.sha256 = lfs["oid"].get<std::string>();
      if (lfs.contains("size") && lfs["size"].is_number_unsigned())
        f.size = lfs["size"].get<uint64_t>();
    }
    listing.files.push_back(std::move(f));
  }
  return listing;
}

std::vector<uint8_t> HubClient::read_range(const std::string& repo, const std::string& file,
                                           uint64_t begin, uint64_t end,
                                           const std::string& revision) const {
  check_repo_id(repo);
  std::vector<uint8_t> bytes;
  if (end <= begin) return bytes;
  const uint64_t wanted = end - begin;
  for (int attempt = 0;; ++attempt) {
    bytes.clear();
    HttpRequest request = this->request(resolve_url(repo, file, revision));
    request.range_begin = begin;
    request.range_end = end - 1;
    // A 206 carries the slice; a server that ignores Range sends the file from its start,
    // which is read up to `end` and cut below.
    TransferResult t = perform(request, [&](long, const char* data, size_t size) {
      const auto* p = reinterpret_cast<const uint8_t*>(data);
      bytes.insert(bytes.end(), p, p + size);
      return bytes.size() < end;
    });
    if (!t.error.empty() && !t.stopped)
      throw HubError(repo + "/" + file + ": " + t.error +
                     (t.stalled ? " (the transfer stalled)" : ""));
    if (t.response.status == 206 || t.response.status == 200) {
      if (t.response.status == 200) {
        if (bytes.size() < begin) return {};
        bytes.erase(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(begin));
      }
      if (bytes.size() > wanted) bytes.resize(wanted);
      return bytes;
    }
    if (t.response.status == 416) return {};  // past the end of the file
    HubError error = error_for(t.response, repo + "/" + file);
    if (t.response.status == 429 && attempt < 2 && error.retry_after_seconds > 0 &&
        error.retry_after_seconds <= settings_.max_retry_after_seconds) {
      std::this_thread::sleep_for(std::chrono::seconds(error.retry_after_seconds));
      continue;
    }
    throw error;
  }
}

}  // namespace granule::hub
