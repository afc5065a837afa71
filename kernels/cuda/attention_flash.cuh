// Fused attention for many query rows (a prefill, or the blend's selected rows at a
// layer) on the tensor cores, FlashAttention-2 style: one thread block per (KV head,
// tile of 64 query rows), where the query rows of KV head g are the (token, head of
// the group) pairs R = t * group + r (query head g * group + r), so the group's heads
// share every K/V tile the block loads. The block walks its keys in tiles of 64: each
// tile is read from the paged cache once into shared memory (as bf16), S = Q K^T of the
// tile is computed with mma.sync into registers, an online softmax in fp32 turns it into
// P (rounded to bf16) and O += P V accumulates in fp32 registers; O is normalised and
// written at the end.
//
// Why: attention_gemm.cuh gathers the whole cache into contiguous bf16, writes S and P
// for every row over all n_kv keys to global memory and computes the causal upper
// triangle only to mask it. Here K/V are read once per 64 query rows of a KV head, S
// and P never leave registers, and a block stops at the last key its rows can see (key
// tiles past min(n_kv, max qpos + 1) are skipped; the mask is applied per element only
// in the tiles that need it). No scratch memory: Q is rounded to bf16 as it is loaded
// (into shared memory, beside the K and V tiles: 26 KiB a block at head_dim 64, 50 KiB
// at 128).
//
// Precision: the Backend's BF16 precision, as attention_gemm: Q, K, V rounded to bf16
// for the products, P rounded to bf16 for P V; scores, softmax and accumulation fp32.
// It replaces attention_gemm for the head dims it supports (attention_flash_supports:
// 64 and 128); the backend keeps attention_gemm for the others.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/paged_kv.cuh"

namespace bs::kernels::cuda {

// Whether attention_flash has a kernel for this head_dim (64 and 128).
bool attention_flash_supports(int64_t head_dim);

// The same contract as attention() in attention.cuh: query row t (of n) of head h
// attends to the cached keys j <= min(qpos[t], n_kv - 1) of KV head h / (q_heads /
// kv.kv_heads); a row with no key (qpos[t] < 0, or n_kv == 0) gets zeros. The rows may
// be any subset of the prompt's positions, in any order. Every output element is
// written. Throws std::invalid_argument when attention_flash_supports(kv.head_dim) is
// false or q_heads is not a multiple of kv.kv_heads.
void attention_flash(const float* q,           // device [n, q_heads, kv.head_dim] fp32
                     const int32_t* qpos,      // device [n]: the prompt position of each row
                     const DevicePagedKv& kv,  // K/V in F32, F16 or BF16; n_kv <= kv.capacity rows per KV head
                     float* out,               // device [n, q_heads, kv.head_dim] fp32
                     int64_t n,                // query rows (tokens)
                     int64_t q_heads,          // query heads, a multiple of kv.kv_heads
                     int64_t n_kv,             // cached keys [0, n_kv) that exist
                     float scale,              // the score scale (1 / sqrt(head_dim) for Llama)
                     cudaStream_t stream);

}  // namespace bs::kernels::cuda
