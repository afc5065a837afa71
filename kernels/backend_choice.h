// Which backend computes, from the configuration's words (device.kind, device.gpus,
// model.decode_activations): the one place that knows every backend this build has,
// so the runtime and the tools choose the same way and a build or machine without
// CUDA answers with a sentence, not a crash.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/backend.h"

namespace bs::kernels {

// The device kinds this build can make: {"cpu"} or {"cpu", "cuda"}.
std::vector<std::string> device_kinds_built();
// Whether `kind` names a backend at all ("cpu", "cuda"), built here or not.
bool is_device_kind(std::string_view kind);
// CUDA devices this process sees; 0 in a build without CUDA, without a driver or a GPU.
int cuda_devices_visible();

struct BackendChoice {
  std::string kind = "cpu";  // cpu | cuda
  int gpu = 0;               // cuda: the device index (device.gpus[rank])
  // cpu: "auto" (default_decode_activations()), "exact" or "int8".
  std::string decode_activations = "auto";
  // cpu: Backend::batch_invariant() (model.batch_invariant); cuda refuses it, by name.
  bool batch_invariant = false;
  // cuda: seconds the host waits at most for the device (device.wait_timeout); past
  // them the device is treated as lost (kernels/cuda/device_waits.h).
  double wait_timeout_s = 60;
};

// The backend `choice` names. Throws std::invalid_argument for an unknown kind or
// decode_activations value, and std::runtime_error, saying why, when the kind is not in
// this build (built without nvcc) or the machine has no such device.
std::unique_ptr<Backend> make_backend(const BackendChoice& choice);

}  // namespace bs::kernels
