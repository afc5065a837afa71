// The blend engine's scratch on the backend (blend/blend_engine.cpp,
// blend/selection_rules.cpp, blend/chunk_kv_ops.cpp): its workspace slots, and
// buffers only grown, never freed on the way (on CUDA a free waits for the device).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "model/transformer.h"

namespace bs::blend_detail {

// Workspace slots of the engine's check layers (kernels/workspace.h), above the
// Transformer's own. Used within one step; what a prefill carries between steps is
// in its State's buffers.
enum Slot {
  kQ = Transformer::kWorkspaceSlots,
  kK,
  kV,
  kCandRows,
  kCandPos,
  kCandK,
  kCandV,
  kDeviation,
  kTopK,
  kKeepRows,
  kKeptQ,
  kKeptHidden,
  kMass,
  kScore
};

// `buf` with at least `bytes`: kept when it is large enough (no allocation, and no
// free: on CUDA a free waits for the device), else replaced.
inline void ensure_bytes(kernels::Backend& be, kernels::DeviceBuffer& buf, int64_t bytes) {
  if (buf.bytes() < bytes || !buf) {
    buf.reset();  // the old memory goes first (as the workspace's slots)
    buf = be.alloc(bytes);
  }
}

// Host positions (or row indices) into a buffer of the backend, grown as needed.
inline void upload_ints(kernels::Backend& be, const std::vector<int32_t>& host, kernels::DeviceBuffer& dev) {
  const int64_t bytes = static_cast<int64_t>(host.size() * sizeof(int32_t));
  ensure_bytes(be, dev, bytes);
  be.copy_to_backend(dev.data(), host.data(), bytes);
}
inline int32_t* upload_ints(kernels::Backend& be, const std::vector<int32_t>& host, int slot) {
  int32_t* dev = be.workspace().get<int32_t>(slot, static_cast<int64_t>(host.size()));
  be.copy_to_backend(dev, host.data(), static_cast<int64_t>(host.size() * sizeof(int32_t)));
  return dev;
}

}  // namespace bs::blend_detail
