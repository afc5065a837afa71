// Causal-by-position attention with grouped KV heads over a paged cache, on the device:
// query i attends to every cached key j < n_kv with j <= qpos[i]; query head h reads KV
// head h / (q_heads / kv.kv_heads); K/V elements widened to fp32, fp32 scores, online
// softmax (one pass over the keys), fp32 accumulation. The queries may be any subset of
// the prompt's rows (the blend's selected tokens) or decode steps.
//
// One warp per (query, head), walking the keys in order: correct for every shape and
// cheap for a few rows. The backend uses it below 64 rows (a short blend check): from
// 64 rows on it sends them to the fused tiled kernel on the tensor cores,
// attention_flash.cuh (head_dim 64 and 128), or to attention_gemm.cuh (cuBLAS) for the
// other head dims; batched decode rows go to attention_rows.cuh (split over the keys).
// head_dim <= 256.
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
