// A Backend decorator for engine tests: passes every call to the backend the engine picked,
// and throws a chosen error from the n-th step's launch(), the
// way the CUDA backend reports a failed kernel or copy: DeviceError for a failure the device
// survives, DeviceLostError for a sticky one. Installed through EngineOptions::wrap_backend.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "backends/backend.h"
#include "granule/error.h"

namespace granule::test {

class FaultInjectingBackend final : public Backend {
 public:
  enum class Fault { DeviceError, DeviceLost };

  // Fails launch number `fail_at` (counting from 1) and, for DeviceLost, every launch after.
  FaultInjectingBackend(std::unique_ptr<Backend> inner, int fail_at, Fault fault)
      : inner_(std::move(inner)), fail_at_(fail_at), fault_(fault) {}

  // For EngineOptions::wrap_backend.
  static std::function<std::unique_ptr<Backend>(std::unique_ptr<Backend>)> wrap(int fail_at,
                                                                                Fault fault) {
    return [fail_at, fault](std::unique_ptr<Backend> inner) -> std::unique_ptr<Backend> {
      return std::make_unique<FaultInjectingBackend>(std::move(inner), fail_at, fault);
    };
  }

  std::string name() const override { return inner_->name(); }
  bool is_gpu() const override { return inner_->is_gpu(); }
  uint64_t device_total_bytes() const override { return inner_->device_total_bytes(); }
  int64_t kv_bytes_per_token() const override { return inner_->kv_bytes_per_token(); }
  std::unique_ptr<VirtualMemory> make_kv_virtual_memory() override {
    return inner_->make_kv_virtual_memory();
  }
  void attach_kv(KvSpace& kv) override { inner_->attach_kv(kv); }
  bool samples_on_device() const override { return inner_->samples_on_device(); }
  void launch(const StepRequest& step) override {
    maybe_fail();
    inner_->launch(step);
  }
  StepResult wait() override { return inner_->wait(); }
  void fill_telemetry(TelemetrySnapshot& snapshot) const override {
    inner_->fill_telemetry(snapshot);
  }

 private:
  void maybe_fail() {
    ++calls_;
    if (calls_ == fail_at_ || (fault_ == Fault::DeviceLost && calls_ > fail_at_)) {
      const std::string what = "CUDA error in an injected kernel: an illegal memory access";
      if (fault_ == Fault::DeviceLost)
        throw DeviceLostError("the GPU stopped working (" + what + "); reload the model");
      throw DeviceError(what);
    }
  }

  std::unique_ptr<Backend> inner_;
  int fail_at_;
  Fault fault_;
  int calls_ = 0;
};

}  // namespace granule::test
