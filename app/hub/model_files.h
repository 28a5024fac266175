// A repository's GGUF files as the models a user picks from: one per quantisation, with a
// split model's shards (NAME-00001-of-00003.gguf ...) taken together as one.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hub/hub_client.h"

namespace granule::hub {

struct GgufModel {
  std::string label;            // "Q4_K_M", "Q8_0", or the file's stem when no quant is named
  std::vector<RepoFile> parts;  // one file, or a split model's shards in order
  uint64_t size_bytes = 0;      // over the parts
  bool split_complete = true;   // every shard the names announce is listed
  bool projector = false;       // a multimodal projector (mmproj-*), not a language model
  const RepoFile& first() const { return parts.front(); }
};

// The quantisation named in a GGUF file name ("...-Q4_K_M.gguf" gives "Q4_K_M"), or "".
std::string quant_label(const std::string& file_name);
// The repository's .gguf files grouped into models, smallest first.
std::vector<GgufModel> gguf_models(const RepoListing& listing);
// The model whose label matches `quant` (case-insensitive); throws UsageError listing the
// labels there are when none does.
const GgufModel& find_quant(const std::vector<GgufModel>& models, const std::string& quant,
                            const std::string& repo);

}  // namespace granule::hub
