// The fused QKV projection's output split into Q, K and V on the device (copies,
// bit-identical to the CPU's).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace bs::kernels::cuda {

void split_qkv(const float* qkv,  // device [n, q_dim + 2 * kv_dim]: q, k, v side by side
               float* q,          // device [n, q_dim]
               float* k,          // device [n, kv_dim]
               float* v,          // device [n, kv_dim]
               int64_t n, int64_t q_dim, int64_t kv_dim, cudaStream_t stream);

}  // namespace bs::kernels::cuda
