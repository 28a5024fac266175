// A real model cut to its first layers: the blocks past `layers` are left out and everything
// else (token embeddings, output norm, the head when it is not tied, tokenizer and chat
// template metadata) is copied byte for byte, so tests run real weights at a fraction of the
// size. `setup.sh realweights` writes the default model's first layers this way.
#pragma once
#include <cstdint>
#include <filesystem>

#include "granule/gguf.h"
#include "granule/testkit/gguf_writer.h"

namespace granule {

// The layer a tensor belongs to ("blk.12.attn_q.weight" -> 12), or -1 outside the blocks.
int64_t tensor_layer(std::string_view tensor_name);

// `source` with blocks 0..layers-1 only and ARCH.block_count = layers (general.name says
// how many of how many). Throws UsageError when `layers` is not within 1..block_count.
GgufWriter first_layers_model(const ModelFile& source, int64_t layers);

// Builds it and writes it to `path`; throws Error on I/O failure.
void write_first_layers(const ModelFile& source, int64_t layers, const std::filesystem::path& path);

}  // namespace granule
