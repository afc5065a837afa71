// Delta-RoPE of a placed chunk on the device: K of cache rows [first, first + m) of
// every KV head rotated in place by the angle whose (cos, sin) per pair the backend
// computed on the host (as the CPU's RoPE cache does), through fp32 and rounded back to
// the cache's dtype as K computed at the new position would be. V is not touched.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/paged_kv.cuh"

namespace bs::kernels::cuda {

void rope_kv_rows(const DevicePagedKv& kv,  // rows [first, first + m) within kv.capacity
                  int64_t first, int64_t m,
                  const float* cos_sin,     // device [head_dim / 2, 2]: (cos, sin) of the delta angle per pair
                  bool interleaved,         // pairs (2i, 2i+1) or (i, i + head_dim/2)
                  cudaStream_t stream);

}  // namespace bs::kernels::cuda
