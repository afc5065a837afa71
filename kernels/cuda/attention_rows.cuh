// Batched decode attention on the device: one query row per sequence, each over its own
// paged cache (continuous batching), row i attending to keys [0, min(qpos[i] + 1,
// capacity)) of views[i] with grouped KV heads, fp32 online softmax (scores, sums and
// products in fp32 over each stored element's exact fp32 value). Flash-decoding: a row's
// keys are cut into splits by its own length (one per 64 keys, at most 64 splits, each a
// multiple of 32 keys), one block per (row, KV head) and split, one warp per query head
// of the group (the group's warps read the same K/V rows). A warp scores 32 keys at once
// (a lane per key: the whole dot product from its row, 16-byte loads), then adds their
// V rows with lanes across head_dim. A row of one split is written directly; the others
// go through a combine of the splits' partial max, sum and output. A row's result does
// not depend on the other rows, the capacities or max_keys (the same bits whatever the
// batch); max_keys only sizes the launch and the scratch.
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
                    int64_t max_keys,              // host: >= every row's view capacity
                    DeviceAllocation& scratch,     // the splits' partial results, grown as needed
                    cudaStream_t stream);

}  // namespace bs::kernels::cuda
