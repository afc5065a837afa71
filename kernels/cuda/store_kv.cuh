// K (and V) rows of n tokens written into the paged cache at their positions, rounded
// to the cache's dtype, on the device (K is stored after RoPE). Positions are the
// caller's to validate (the backend checks them on the host, as the CPU's store_kv).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/paged_kv.cuh"

namespace bs::kernels::cuda {

void store_kv(const DevicePagedKv& kv,
              const int32_t* pos,  // device [n], each in [0, kv.capacity)
              const float* k,      // device [n, kv.kv_heads, kv.head_dim]
              const float* v,      // device [n, kv.kv_heads, kv.head_dim], or nullptr: K only
              int64_t n, cudaStream_t stream);

}  // namespace bs::kernels::cuda
