// The ops of one variant (this file is included by sources compiled per ISA; the
// namespace is the variant's). Contracts and shapes: kernels/cpu/kernel_table.h.
#pragma once

#include "kernels/cpu/kernel_table.h"

namespace bs::kernels::cpu::BS_ISA_NS {

void rmsnorm(const float* x, const float* weight, float* out, int64_t n, int64_t dim, float eps);
void rope(float* x, const float* cos_sin, int64_t n, int64_t heads, int64_t head_dim, RopeStyle style);
void swiglu(const float* gate_up, float* out, int64_t n, int64_t ff);
void geglu(const float* gate_up, float* out, int64_t n, int64_t ff);
float softmax_exps(const float* q, const float* kt, int64_t stride, int64_t head_dim, int64_t count, float scale,
                   float* e);
void attention(const float* q, const int32_t* qpos, const KvView& kv, float* out, int64_t n, int64_t q_heads,
               int64_t n_kv, float scale);
void attention_decode(const float* q, const int32_t* qpos, const KvView& kv, float* out, int64_t n, int64_t q_heads,
                      int64_t n_kv, float scale);
void attention_decode_rows(const float* q, const int32_t* qpos, const KvView* kv, float* out, int64_t n,
                           int64_t q_heads, float scale);
void gemv_quantized(TensorType type, const void* w, const float* x, float* y, int64_t n, int64_t in_features,
                    int64_t out_features);
bool dequantize_row_fast(TensorType type, const void* src, void* dst, int64_t n, bool bf16);
#if BS_ISA_LEVEL >= 1
void gemv_int8(TensorType type, const void* w, const float* x, float* y, int64_t n, int64_t in_features,
               int64_t out_features);
#endif
#if BS_ISA_LEVEL >= 3
void attention_bf16(const float* q, const int32_t* qpos, const KvView& kv, float* out, int64_t n, int64_t q_heads,
                    int64_t n_kv, float scale);
void to_bf16(const float* src, uint16_t* dst, int64_t count);
#endif

}  // namespace bs::kernels::cpu::BS_ISA_NS
