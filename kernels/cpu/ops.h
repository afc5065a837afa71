// Entry points of the CPU (AVX-512 + oneDNN) kernels, one op per source file.
// The CpuBackend (cpu_backend.cpp) wires them into the Backend interface.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/backend.h"

namespace bs::kernels::cpu {

void rmsnorm(const float* x,       // [n, dim]
             const float* weight,  // [dim]
             float* out,           // [n, dim]
             int64_t n, int64_t dim, float eps);

// cos_sin: [n, head_dim/2, 2] (cos, sin) of each row's angles, computed by the caller.
void rope(float* x,               // [n, heads, head_dim]
          const float* cos_sin,   // [n, head_dim / 2, 2]
          int64_t n, int64_t heads, int64_t head_dim, RopeStyle style);

void swiglu(const float* gate_up,  // [n, 2 * ff]: gate then up
            float* out,            // [n, ff]
            int64_t n, int64_t ff);

void attention(const float* q,       // [n, q_heads, head_dim]
               const int32_t* qpos,  // [n]
               const float* k,       // [kv_heads, kv_stride, head_dim]
               const float* v,       // [kv_heads, kv_stride, head_dim]
               float* out,           // [n, q_heads, head_dim]
               int64_t n, int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t n_kv,
               int64_t kv_stride, float scale);

// Same contract for a few queries (decode): no re-layout of K/V, fp32; head_dim <= 256.
void attention_decode(const float* q, const int32_t* qpos, const float* k, const float* v, float* out, int64_t n,
                      int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t n_kv, int64_t kv_stride,
                      float scale);

// Same contract, bf16 dot products (kernels/cpu/attention_bf16.cpp).
void attention_bf16(const float* q, const int32_t* qpos, const float* k, const float* v, float* out, int64_t n,
                    int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t n_kv, int64_t kv_stride,
                    float scale);

// y[t, o] = sum_i W[o, i] x[t, i] straight from the stored (quantized) rows,
// fp32 accumulation; for the small n of decode steps.
void gemv_quantized(const WeightView& w,
                    const float* x,  // [n, in_features]
                    float* y,        // [n, out_features]
                    int64_t n);

// Weights packed for oneDNN (bf16 or f32) and the GEMM that uses them.
struct DnnlWeights;
void destroy(DnnlWeights* w);
struct DnnlWeightsDeleter {
  void operator()(DnnlWeights* w) const { destroy(w); }
};
using DnnlWeightsPtr = std::unique_ptr<DnnlWeights, DnnlWeightsDeleter>;
DnnlWeightsPtr pack_for_gemm(const WeightView& w, Precision precision);
void gemm(const DnnlWeights& w,
          const float* x,  // [n, in_features]
          float* y,        // [n, out_features]
          int64_t n);

}  // namespace bs::kernels::cpu
