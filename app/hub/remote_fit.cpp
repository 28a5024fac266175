// fetch_header: range requests of 2 MiB and more until ModelFile::parse_header has the whole
// table; fit_remote: the estimate over it.
#include "hub/remote_fit.h"

#include <algorithm>
#include <map>

namespace granule::hub {

RemoteHeader fetch_header(const HubClient& client, const std::string& repo, const std::string& file,
                          uint64_t file_size, const std::string& revision) {
  // Most headers fit the first 2 MiB; a 128k-token vocabulary with its merges takes ~8 MiB,
  // a 256k one ~12. Past 64 MiB the file is not one a GGUF writer made.
  constexpr uint64_t kFirstBytes = 2ull << 20;
  constexpr uint64_t kMaxHeaderBytes = 64ull << 20;
  RemoteHeader h;
  std::vector<uint8_t> prefix;
  uint64_t want = std::min(kFirstBytes, file_size);
  while (true) {
    std::vector<uint8_t> more = client.read_range(repo, file, prefix.size(), want, revision);
    ++h.requests;
    h.bytes_fetched += more.size();
    if (more.empty()) throw HubError(repo + "/" + file + ": the Hub sent no bytes of the header");
    prefix.insert(prefix.end(), more.begin(), more.end());
    try {
      h.file = ModelFile::parse_header(prefix, file_size, "hf://" + repo + "/" + file);
      return h;
    } catch (const HeaderIncomplete& e) {
      if (e.needed_bytes > kMaxHeaderBytes)
        throw FormatError("hf://" + repo + "/" + file + ": the header is larger than " +
                          std::to_string(kMaxHeaderBytes >> 20) +
                          " MiB; not a GGUF file Granule reads");
      // Double what came, and at least what the parser asked for.
      want = std::min(file_size, std::max<uint64_t>(e.needed_bytes, 2 * prefix.size()));
    }
  }
}

std::string block_type_mix(const ModelFile& file) {
  std::map<std::string, uint64_t> bytes;
  uint64_t total = 0;
  for (const TensorInfo& t : file.tensors()) {
    bytes[tensor_type_name(t.ggml_type)] += t.size_bytes;
    total += t.size_bytes;
  }
  std::vector<std::pair<std::string, uint64_t>> sorted(bytes.begin(), bytes.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string mix;
  for (const auto& [type, n] : sorted) {
    if (total == 0) break;
    const double share = 100.0 * static_cast<double>(n) / static_cast<double>(total);
    if (share < 0.5 && !mix.empty()) continue;
    char text[48];
    std::snprintf(text, sizeof text, "%s %.0f%%", type.c_str(), share);
    mix += (mix.empty() ? "" : ", ") + std::string(text);
  }
  return mix;
}

QuantFit fit_remote(const HubClient& client, const RepoListing& listing, const GgufModel& model,
                    const EngineOptions& options) {
  QuantFit q;
  q.model = model;
  RemoteHeader h =
      fetch_header(client, listing.repo, model.first().path, model.first().size, listing.revision);
  q.header_bytes_fetched = h.bytes_fetched;
  q.header_requests = h.requests;
  q.architecture = h.file->get_string("general.architecture").value_or("");
  q.block_mix = block_type_mix(*h.file);
  if (model.parts.size() > 1) {
    q.error = "split into " + std::to_string(model.parts.size()) +
              " files, which Granule does not open yet (merge them with llama-gguf-split --merge)";
    return q;
  }
  try {
    q.fit = Engine::estimate(*h.file, options);
  } catch (const HubError&) {
    throw;
  } catch (const Error& e) {
    q.error = e.what();
  }
  return q;
}

int recommended_quant(const std::vector<QuantFit>& fits) {
  int best = -1;
  auto better = [&](int i, bool need_fits) {
    const QuantFit& q = fits[static_cast<size_t>(i)];
    if (!q.fit || !q.fit->loads || (need_fits && !q.fit->fits) || q.model.projector) return false;
    return best < 0 || q.model.size_bytes > fits[static_cast<size_t>(best)].model.size_bytes;
  };
  for (int i = 0; i < static_cast<int>(fits.size()); ++i)
    if (better(i, true)) best = i;
  if (best >= 0) return best;
  for (int i = 0; i < static_cast<int>(fits.size()); ++i)
    if (better(i, false)) best = i;
  return best;
}

}  // namespace granule::hub
