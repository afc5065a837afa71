// K (and V) rows of n tokens written into the paged cache at their positions, rounded
// to the cache's dtype, on the device (K is stored after RoPE). A row whose position is
// outside [0, kv.capacity) is skipped, nothing written (the backend flags it with
// index_check.cuh and reports it at its next wait).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/paged_kv.cuh"

namespace bs::kernels::cuda {

void store_kv(const DevicePagedKv& kv,
              const int32_t* pos,  // device [n]
              const float* k,      // device [n, kv.kv_heads, kv.head_dim]
              const float* v,      // device [n, kv.kv_heads, kv.head_dim], or nullptr: K only
              int64_t n, cudaStream_t stream);

// One row per cache (a batched decode step): row t into views[t] at pos[t], each as
// store_kv of that row alone, in one launch. Every view has kv_heads and head_dim. A row
// whose position is outside its cache is skipped and sets *flag = code (while 0), which
// the backend reports at its next wait.
void store_kv_rows(const DevicePagedKv* views,  // device [n]
                   const int32_t* pos,          // device [n]
                   const float* k,              // device [n, kv_heads, head_dim]
                   const float* v,              // device [n, kv_heads, head_dim], or nullptr: K only
                   int64_t n, int64_t kv_heads, int64_t head_dim,
                   int32_t* flag,               // device, one int
                   int32_t code, cudaStream_t stream);

}  // namespace bs::kernels::cuda
