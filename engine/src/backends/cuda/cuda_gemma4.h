// What Gemma 4's layers need on the device beside the layer blobs (cuda_gemma4.cpp): the
// per-layer embeddings' matrices and norms, each layer's output scale, and the per-layer inputs of
// a pass.
#pragma once
#include <vector>

#include "backends/cuda/cuda_model.h"

namespace granule::cuda {

struct Gemma4Device {
  DeviceBuffer matrices;     // the per-layer embedding matrices, resident (WeightsResident)
  DeviceBuffer vectors;      // per_layer_proj_norm, then each layer's per_layer_post_norm (f32)
  DeviceMatrix token_table;  // per_layer_token_embd: n_vocab rows of n_layer * n_pl
  DeviceMatrix model_proj;   // per_layer_model_proj: n_embd -> n_layer * n_pl
  std::vector<DeviceMatrix> gate, proj;  // per layer: n_embd -> n_pl, n_pl -> n_embd
  const float* proj_norm = nullptr;
  std::vector<const float*> post_norm;  // per layer
  std::vector<float> out_scale;         // per layer, 1 where the file has none
  // Workspace: a pass's per-layer inputs [rows][n_layer][n_pl], and the gathered table rows
  // (then, per layer, the gate's output) of as many floats.
  DeviceBuffer inputs, scratch;
};

}  // namespace granule::cuda
