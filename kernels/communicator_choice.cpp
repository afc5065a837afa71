#include "kernels/communicator_choice.h"

#include <stdexcept>

#if defined(BLENDSERVE_HAVE_NCCL)
#include "kernels/cuda/nccl_communicator.h"
#endif

namespace bs::kernels {

std::vector<std::string> communicator_kinds_built() {
#if defined(BLENDSERVE_HAVE_NCCL)
  return {"inprocess", "nccl"};
#else
  return {"inprocess"};
#endif
}

bool is_communicator_kind(std::string_view kind) { return kind == "auto" || kind == "inprocess" || kind == "nccl"; }

std::string resolve_communicator_kind(const std::string& kind, const std::string& device_kind) {
  if (kind != "auto") return kind;
  return device_kind == "cuda" ? "nccl" : "inprocess";
}

std::vector<std::unique_ptr<Communicator>> make_group(const std::string& kind, const std::vector<int>& devices,
                                                      Communicator::Timeout timeout) {
  if (devices.empty()) throw std::invalid_argument("a communicator group needs at least one rank");
  if (kind == "inprocess") return make_inprocess_group(static_cast<int>(devices.size()));
  if (kind == "nccl") {
#if defined(BLENDSERVE_HAVE_NCCL)
    return cuda::make_nccl_group(devices, timeout);
#else
    (void)timeout;
    throw std::runtime_error(
        "nccl: this build has no NCCL communicator (the CUDA toolkit's nccl.h and libnccl were not found when it "
        "was configured)");
#endif
  }
  throw std::invalid_argument("unknown communicator '" + kind + "' (auto, inprocess, nccl)");
}

}  // namespace bs::kernels
