// The fit preview of files still on the Hub: the GGUF header and tensor table read with HTTP
// range requests (more bytes only when the table runs past what came), then the same
// Engine::estimate that `granule-cli fit` runs on a local file.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "granule/engine.h"
#include "granule/gguf.h"
#include "hub/hub_client.h"
#include "hub/model_files.h"

namespace granule::hub {

struct RemoteHeader {
  std::unique_ptr<ModelFile> file;  // no tensor data
  uint64_t bytes_fetched = 0;       // over every request
  int32_t requests = 0;
};

// Reads the header of `file` (`file_size` bytes, from the listing) from the Hub.
RemoteHeader fetch_header(const HubClient& client, const std::string& repo, const std::string& file,
                          uint64_t file_size, const std::string& revision = "main");

// "Q4_K 71%, Q6_K 24%, F32 5%": the block types' shares of the tensor bytes, largest first.
std::string block_type_mix(const ModelFile& file);

struct QuantFit {
  GgufModel model;
  std::string architecture;  // general.architecture from the header
  std::string block_mix;
  uint64_t header_bytes_fetched = 0;
  int32_t header_requests = 0;
  std::optional<FitEstimate> fit;  // absent when the engine refuses the model
  std::string error;               // why: unsupported architecture, split files, ...
};

// The fit of one model of the listing under `options`. Never throws for a model the engine
// refuses (that is `error`); HubError for the network.
QuantFit fit_remote(const HubClient& client, const RepoListing& listing, const GgufModel& model,
                    const EngineOptions& options);
// The index of the largest model that fits (every chat at its context), else of the
// largest that loads with streaming; -1 when none loads.
int recommended_quant(const std::vector<QuantFit>& fits);

}  // namespace granule::hub
