// The CPU reference backend: the llama family's forward pass in f32 over the mapped weights,
// KV in f32 inside the engine's KvSpace, threads over rows and heads. The oracle for the GPU.
#pragma once
#include <memory>
#include <optional>
#include <vector>

#include "backends/backend.h"
#include "backends/cpu/thread_pool.h"

namespace granule::cpu {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendInit& init);
  ~CpuBackend() override;

  std::string name() const override;
  bool is_gpu() const override { return false; }
  uint64_t device_total_bytes() const override;
  int64_t kv_bytes_per_token() const override;
  std::unique_ptr<VirtualMemory> make_kv_virtual_memory() override;
  void attach_kv(KvSpace& kv) override { kv_ = &kv; }
  // Computes the whole step in launch() (the host is the device); wait() hands it over.
  void launch(const StepRequest& step) override;
  StepResult wait() override;
  // The KV is host memory already: a memcpy each way.
  bool copy_kv_to_host(int32_t slot, uint64_t bytes, void* host) override;
  bool copy_kv_from_host(int32_t slot, const void* host, uint64_t bytes) override;

 private:
  // The forward pass: logits rows for the batch (see StepRequest::logits).
  int64_t run(std::span<const BatchSequence> batch, std::vector<float>& logits);

  struct LayerVectors;  // a layer's norms and biases as f32
  struct Scratch;       // activations, grown to the largest batch seen

  void attention_layer(int64_t layer, int64_t n_tokens);
  float* kv_at(int32_t slot, int64_t position, int64_t layer, bool value) const;

  const ModelConfig& config_;
  const WeightTable& weights_;
  MemoryManager& memory_;
  uint64_t charged_weight_bytes_ = 0;
  ThreadPool pool_;
  KvSpace* kv_ = nullptr;
  std::optional<StepResult> done_;  // the launched step's result, until wait()
  std::vector<double> rope_frequencies_;
  std::vector<float> output_norm_;
  std::vector<LayerVectors> layers_;
  std::unique_ptr<Scratch> scratch_;
};

}  // namespace granule::cpu
