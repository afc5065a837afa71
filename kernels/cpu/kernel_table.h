// The CPU kernels of one ISA variant, as a table of plain functions.
//
// kernels/cpu/variant/*.cpp are compiled once per variant (scalar, avx2, avx512,
// avx512bf16; kernels/CMakeLists.txt), each copy in its own namespace, and each copy
// exports one `const CpuKernels` table. The CpuBackend picks the best table the CPU can
// run once, at start-up (kernels/cpu/isa.h), so one binary runs on every x86-64 CPU.
// Arguments are raw pointers and plain values only: the variant code must not
// instantiate STL templates (see kernels/cpu/variant/simd.h for why).
//
// Preconditions the backend checks before calling (the variants do not re-check):
// head_dim % 16 == 0 and <= 256 for attention (% 32 for bf16), in_features a multiple
// of the weight type's block (32, or 256 for the K-quants) for gemv_quantized, and the
// weight type one of the table's types.
#pragma once

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cpu/isa.h"

namespace bs::kernels::cpu {

struct CpuKernels {
  CpuIsa isa;

  void (*rmsnorm)(const float* x,       // [n, dim]
                  const float* weight,  // [dim]
                  float* out,           // [n, dim]
                  int64_t n, int64_t dim, float eps);

  // cos_sin: (cos, sin) of each row's angles, computed by the caller.
  void (*rope)(float* x,              // [n, heads, head_dim], rotated in place
               const float* cos_sin,  // [n, head_dim / 2, 2]
               int64_t n, int64_t heads, int64_t head_dim, RopeStyle style);

  void (*swiglu)(const float* gate_up,  // [n, 2 * ff]: gate then up
                 float* out,            // [n, ff]
                 int64_t n, int64_t ff);

  // GeGLU, laid out as swiglu: out = gelu_tanh(gate) * up (Backend::geglu).
  decltype(swiglu) geglu;

  // One query head's softmax numerators over `count` keys held transposed:
  // e[j] = exp(scale * q . kt[:, j] - max over j), fp32 (vector FMAs: not the
  // reference's order); returns their sum. Backend::attention_mass's inner loop.
  float (*softmax_exps)(const float* q,   // [head_dim]
                        const float* kt,  // [head_dim, stride]: key j in column j
                        int64_t stride, int64_t head_dim, int64_t count, float scale,
                        float* e);        // [count]

  // Causal-by-position attention, the contract of Backend::attention; tiled online
  // softmax, fp32 (prefill-size n).
  void (*attention)(const float* q,       // [n, q_heads, kv.head_dim]
                    const int32_t* qpos,  // [n]
                    const KvView& kv,     // n_kv <= kv.capacity rows per KV head
                    float* out,           // [n, q_heads, kv.head_dim]
                    int64_t n, int64_t q_heads, int64_t n_kv, float scale);

  // Same contract for a few queries (decode): reads the cache rows as they are stored
  // (f16/bf16 widened per vector load), fp32 arithmetic.
  decltype(attention) attention_decode;

  // Backend::attention_rows: one query per row, each row its own cache; row i equals
  // attention_decode of that row alone with n_kv = qpos[i] + 1.
  void (*attention_decode_rows)(const float* q,       // [n, q_heads, head_dim]
                                const int32_t* qpos,  // [n]
                                const KvView* kv,     // [n], the same kv_heads and head_dim
                                float* out,           // [n, q_heads, head_dim]
                                int64_t n, int64_t q_heads, float scale);

  // Same contract, bf16 dot products with fp32 softmax and accumulation; nullptr in
  // variants without native bf16 arithmetic.
  decltype(attention) attention_bf16;

  // y[t, o] = sum_i W[o, i] x[t, i] straight from the stored (quantized) rows, fp32
  // accumulation; for the few rows of decode steps. From AVX2 up, the 4/5-bit block
  // types of 32 (Q4_0, Q4_1, Q5_0, Q5_1: has_int16_decode_product) round the
  // activations to int16 per block of 32 (the reference product:
  // reference_gemv_rounded_activations, kernels/activation_quant.h); the others multiply
  // fp32 activations.
  void (*gemv_quantized)(TensorType type,
                         const void* w,   // [out_features] rows of `type` blocks
                         const float* x,  // [n, in_features]
                         float* y,        // [n, out_features]
                         int64_t n, int64_t in_features, int64_t out_features);

  // gemv_quantized of block-quantized weights (Q4_0 ... Q6_K:
  // kernels/activation_quant.h's has_int8_decode_product) with the activations rounded
  // to int8 per block of 32 (quantize_block_int8; the reference product is
  // reference_gemv_rounded_activations with 8 bits) and blocks multiplied in integers (vpmaddubsw);
  // rows bit-identical alone or batched, as gemv_quantized; F32/F16/BF16 weights go to
  // gemv_quantized. nullptr in the scalar variant (DecodeActivations, backend.h).
  decltype(gemv_quantized) gemv_int8;

  // dst = bf16(src), round to nearest even (the activations of bf16 GEMMs); nullptr in
  // variants without bf16 arithmetic.
  void (*to_bf16)(const float* src,  // [count]
                  uint16_t* dst,     // [count]
                  int64_t count);

  // One stored row of a block type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) to
  // fp32 or bf16, vectorized: the values of dequantize_row / dequantize_row_to_bf16 bit
  // for bit (kernels/dequant.h). Returns false, writing nothing, for another type (F32,
  // F16, BF16: the baseline conversions). The prefill GEMM's chunks come through it.
  bool (*dequantize_row)(TensorType type,
                         const void* src,  // n / block_elements blocks
                         void* dst,        // [n] fp32, or bf16 bits where bf16
                         int64_t n, bool bf16);
};

// One table per variant, defined in kernels/cpu/variant/kernel_table.cpp.
namespace isa_scalar { extern const CpuKernels kKernels; }
namespace isa_avx2 { extern const CpuKernels kKernels; }
namespace isa_avx512 { extern const CpuKernels kKernels; }
namespace isa_avx512bf16 { extern const CpuKernels kKernels; }

// The table of `isa` (every variant is compiled into every build).
const CpuKernels& kernels_for(CpuIsa isa);

}  // namespace bs::kernels::cpu
