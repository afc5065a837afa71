// Causal-by-position attention with grouped KV heads over a paged cache, on the device:
// query i attends to every cached key j < n_kv with j <= qpos[i]; query head h reads KV
// head h / (q_heads / kv.kv_heads); K/V elements widened to fp32, fp32 scores, online
// softmax (one pass over the keys), fp32 accumulation. The queries may be any subset of
// the prompt's rows (the blend's selected tokens) or decode steps.
//
// This first version gives one warp to each (query, head) and walks the keys in order:
// correct for every shape, not yet fast (a tiled prefill kernel and a split-K decode
// kernel are issue 19's next steps). head_dim <= 256.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/paged_kv.cuh"

namespace bs::kernels::cuda {

// Throws std::invalid_argument for head_dim > 256 or q_heads not a multiple of kv_heads.
void attention(const float* q,           // device [n, q_heads, kv.head_dim]
               const int32_t* qpos,      // device [n]
               const DevicePagedKv& kv,  // n_kv <= kv.capacity rows per KV head
               float* out,               // device [n, q_heads, kv.head_dim]
               int64_t n, int64_t q_heads, int64_t n_kv, float scale, cudaStream_t stream);

}  // namespace bs::kernels::cuda
