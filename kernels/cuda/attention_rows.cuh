// Batched decode attention on the device: one query row per sequence, each over its own
// paged cache (continuous batching), row i attending to keys [0, qpos[i]] of views[i]
// with grouped KV heads, fp32 online softmax as attention.cuh. The keys of each (row,
// head) are split over several warps (flash-decoding: partial max, sum and output per
// split, then a combine), so a few rows over thousands of keys still fill the GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/cuda_resources.h"
#include "kernels/cuda/paged_kv.cuh"

namespace bs::kernels::cuda {

// Throws std::invalid_argument for head_dim > 256 or q_heads not a multiple of kv_heads.
void attention_rows(const float* q,                // device [n, q_heads, head_dim]
                    const int32_t* qpos,           // device [n]
                    const DevicePagedKv* views,    // device [n]: row i's cache (same kv_heads, head_dim, dtype)
                    float* out,                    // device [n, q_heads, head_dim]
                    int64_t n, int64_t q_heads, int64_t kv_heads, int64_t head_dim, float scale,
                    int64_t max_keys,              // host: no row has more keys (its view's capacity)
                    DeviceAllocation& scratch,     // the splits' partial results, grown as needed
                    cudaStream_t stream);

}  // namespace bs::kernels::cuda
