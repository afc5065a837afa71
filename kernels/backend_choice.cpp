#include "kernels/backend_choice.h"

#include <chrono>
#include <stdexcept>

#if defined(BLENDSERVE_HAVE_CUDA)
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_device.h"
#endif

namespace bs::kernels {

std::vector<std::string> device_kinds_built() {
#if defined(BLENDSERVE_HAVE_CUDA)
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

bool is_device_kind(std::string_view kind) { return kind == "cpu" || kind == "cuda"; }

int cuda_devices_visible() {
#if defined(BLENDSERVE_HAVE_CUDA)
  return cuda::device_count();
#else
  return 0;
#endif
}

std::unique_ptr<Backend> make_backend(const BackendChoice& choice) {
  if (choice.kind == "cpu") {
    DecodeActivations decode = DecodeActivations::Exact;
    if (choice.decode_activations == "auto")
      decode = default_decode_activations();
    else if (!decode_activations_from_name(choice.decode_activations, decode))
      throw std::invalid_argument("unknown decode activations '" + choice.decode_activations + "' (auto, exact, int8)");
    return make_cpu_backend(decode, choice.batch_invariant);
  }
  if (choice.kind == "cuda") {
#if defined(BLENDSERVE_HAVE_CUDA)
    if (choice.batch_invariant)
      throw std::invalid_argument("cuda: batch_invariant is not implemented on the CUDA backend (cuBLAS picks its "
                                  "kernels by row count); use device.kind cpu or leave model.batch_invariant off");
    if (!(choice.wait_timeout_s > 0) || choice.wait_timeout_s > 86400)
      throw std::invalid_argument("wait timeout must be in (0, 86400] seconds");
    return make_cuda_backend(choice.gpu, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                             std::chrono::duration<double>(choice.wait_timeout_s)));
#else
    throw std::runtime_error(
        "cuda: this build has no CUDA backend (nvcc was not found when it was configured; "
        "install the CUDA toolkit and rebuild)");
#endif
  }
  throw std::invalid_argument("unknown device kind '" + choice.kind + "' (cpu, cuda)");
}

}  // namespace bs::kernels
