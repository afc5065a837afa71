// check_runtime_config: the rules of a runtime config that do not depend on how it was
// written (runtime_config.h). The names' sets are the kernels' own (decode
// activations, KV dtypes, device and communicator kinds), so a value is valid here
// exactly when the code that takes it accepts it.
#include <string>

#include "actors/config/runtime_config.h"
#include "kernels/backend.h"
#include "kernels/backend_choice.h"
#include "kernels/communicator_choice.h"
#include "kernels/kv_view.h"

namespace bs {

namespace {

// Each value alone: what a file's field reader refuses at its key.
void check_values(const RuntimeConfig& c) {
  kernels::DecodeActivations decode{};
  if (c.decode_activations != "auto" && !kernels::decode_activations_from_name(c.decode_activations, decode))
    throw ConfigError("model.decode_activations: unknown value '" + c.decode_activations + "' (auto, exact, int8)");
  if (c.precision != "auto" && c.precision != "bf16" && c.precision != "f32")
    throw ConfigError("model.precision: unknown precision '" + c.precision + "' (auto, bf16, f32)");
  if (!kernels::is_device_kind(c.device_kind))
    throw ConfigError("device.kind: unknown device kind '" + c.device_kind + "' (cpu, cuda)");
  if (c.gpus.empty()) throw ConfigError("device.gpus: must name at least one device (e.g. [0])");
  for (int g : c.gpus)
    if (g < 0) throw ConfigError("device.gpus: device indices are >= 0, got " + std::to_string(g));
  if (c.tp < 1) throw ConfigError("device.tp: must be >= 1 (1 = no tensor parallelism)");
  if (c.threads < 0) throw ConfigError("device.threads: must be >= 0 (0 = all cores)");
  if (!kernels::is_communicator_kind(c.communicator))
    throw ConfigError("device.communicator: unknown communicator '" + c.communicator + "' (auto, inprocess, nccl)");
  kernels::TensorType kv_dtype{};
  if (!kernels::kv_dtype_from_name(c.kv_dtype, kv_dtype))
    throw ConfigError("device.kv_dtype: unknown KV dtype '" + c.kv_dtype + "' (f32, f16, bf16)");
}

// The ranks' devices and what joins them.
void check_devices(const RuntimeConfig& c) {
  const bool on_cuda = c.device_kind == "cuda";
  const std::string comm_kind = kernels::resolve_communicator_kind(c.communicator, c.device_kind);
  if (comm_kind == "nccl" && !on_cuda)
    throw ConfigError("device.communicator: nccl joins GPU ranks, and device.kind is " + c.device_kind +
                      " (inprocess or auto joins CPU ranks)");
  if (comm_kind == "inprocess" && on_cuda && c.tp > 1)
    throw ConfigError("device.communicator: inprocess joins CPU ranks through host memory; GPU ranks need nccl "
                      "(or auto)");
  if (!on_cuda || c.tp <= 1) return;
  const size_t tp_ranks = static_cast<size_t>(c.tp);
  if (c.gpus.size() < tp_ranks)
    throw ConfigError("device.gpus: tp " + std::to_string(c.tp) + " on cuda puts each rank on a GPU of its own: list " +
                      std::to_string(c.tp) + " devices (e.g. [0, 1]); " + std::to_string(c.gpus.size()) + " listed");
  for (size_t a = 0; a < tp_ranks; ++a)
    for (size_t b = a + 1; b < tp_ranks; ++b)
      if (c.gpus[a] == c.gpus[b])
        throw ConfigError("device.gpus: GPU " + std::to_string(c.gpus[a]) + " is listed for ranks " +
                          std::to_string(a) + " and " + std::to_string(b) + "; NCCL 2.28 refuses two ranks on one GPU");
}

}  // namespace

void check_runtime_config(const RuntimeConfig& c) {
  check_values(c);
  check_devices(c);
}

}  // namespace bs
