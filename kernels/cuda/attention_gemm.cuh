// Attention for many query rows (a prefill, or the blend's selected rows at a layer)
// through cuBLAS on the tensor cores: the paged K/V of the layer gathered into
// contiguous bf16 per KV head, S = scale * Q K^T as batched bf16 GEMMs with fp32
// output (the query heads of one KV head share its K: a batch stride of 0), a
// causal-by-position softmax per row in fp32 that writes P in bf16 (masked keys 0), and
// O = P V as batched GEMMs with fp32 accumulation, written straight into the output's
// head columns. Query rows go in blocks so that S and P stay within kScoreBytes.
//
// Why not only the warp kernel (attention.cuh): it reads every key once per query and
// head from global memory on the CUDA cores; a prefill of thousands of rows is tensor-
// core work. What it costs: bf16 inputs to both products (the Backend's BF16 precision:
// bf16 dot products, fp32 softmax and accumulation) and the full n_kv columns of S for
// every row (the causal half is computed and masked, not skipped). The fused kernel
// (attention_flash.cuh) replaced it for head dims 64 and 128; this one stays for the
// other head dims, built from parts that are each checked (cuBLAS, and a softmax kernel
// tested against the reference through it).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/cuda_resources.h"
#include "kernels/cuda/linear.cuh"
#include "kernels/cuda/paged_kv.cuh"

namespace bs::kernels::cuda {

// Scratch of attention_gemm, grown as needed and kept by the caller (the backend).
struct AttentionGemmScratch {
  DeviceAllocation kv;      // [2, kv_heads, n_kv, head_dim] bf16: K then V, contiguous
  DeviceAllocation q;       // [n, q_heads, head_dim] bf16
  DeviceAllocation scores;  // [group, rows, n_kv] fp32
  DeviceAllocation probs;   // [group, rows, n_kv] bf16
};

// Bytes S and P of one block of query rows may take.
inline constexpr int64_t kScoreBytes = int64_t{512} << 20;

// The same contract as attention() in attention.cuh (query i attends to keys
// j <= min(qpos[i], n_kv - 1) of KV head h / (q_heads / kv_heads); a row with no key
// gets zeros). Throws std::invalid_argument when q_heads is not a multiple of
// kv.kv_heads.
void attention_gemm(const CublasHandle& cublas,
                    const float* q,           // device [n, q_heads, kv.head_dim]
                    const int32_t* qpos,      // device [n]
                    const DevicePagedKv& kv,  // n_kv <= kv.capacity rows per KV head
                    float* out,               // device [n, q_heads, kv.head_dim]
                    int64_t n, int64_t q_heads, int64_t n_kv, float scale, AttentionGemmScratch& scratch,
                    cudaStream_t stream);

}  // namespace bs::kernels::cuda
