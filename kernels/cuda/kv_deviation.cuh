// The blend's per-token deviation on the device: for each token, the sum over KV heads
// (in order) and elements of (fresh - cached)^2 for K, V or both, the cached row at the
// token's position widened from the cache's dtype, in double with the reference's
// order and no fused multiply-add (kernels/op_math.h: add_row_deviation), so the sums
// are bit-identical to the CPU's and the blend selects the same tokens.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/paged_kv.cuh"

namespace bs::kernels::cuda {

// A position outside [0, kv.capacity) reads no memory and gets NaN (the backend flags
// it with index_check.cuh). head_dim <= 256.
void kv_deviation(const DevicePagedKv& kv,
                  const int32_t* pos,  // device [n]
                  const float* k,      // device [n, kv.kv_heads, kv.head_dim]: fresh K
                  const float* v,      // device [n, kv.kv_heads, kv.head_dim]: fresh V
                  int64_t n, bool with_k, bool with_v,
                  double* out,         // device [n]
                  cudaStream_t stream);

}  // namespace bs::kernels::cuda
