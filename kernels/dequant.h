// Dequantization of ggml block formats and scalar fp16/bf16 <-> fp32 conversion.
//
// Results match ggml's reference definitions bit for bit:
//   F32   plain float
//   F16   IEEE half
//   BF16  bfloat16 (upper half of a float)
//   Q4_0  block of 32: fp16 d, 16 bytes; byte j holds element j (low nibble) and
//         element j+16 (high nibble); x = (q - 8) * d
//   Q4_1  block of 32: fp16 d, fp16 m, 16 bytes nibbles as Q4_0; x = q * d + m
//   Q5_0  block of 32: fp16 d, 32-bit qh, 16 bytes nibbles as Q4_0; bit e of qh is
//         element e's fifth bit; x = (q - 16) * d
//   Q5_1  block of 32: fp16 d, fp16 m, qh, nibbles as Q5_0; x = q * d + m
//   Q8_0  block of 32: fp16 d, 32 int8; x = q * d
//   Q4_K, Q5_K, Q6_K  super-blocks of 256: kernels/kquant_blocks.h
//
// Type numbers, names and block sizes: kernels/tensor_types.h (the one table).
#pragma once

#include <cstdint>

#include "kernels/tensor_types.h"

namespace bs::kernels {

// ---- scalar conversions ---------------------------------------------------------------
// Exact (every half is representable as a float); NaN payloads are kept.
float fp16_to_fp32(uint16_t h);
// Round to nearest even; overflow gives +-inf; NaN stays NaN (quiet).
uint16_t fp32_to_fp16(float f);
// Exact.
float bf16_to_fp32(uint16_t h);
// Round to nearest even; NaN stays NaN (quiet bit forced, sign kept).
uint16_t fp32_to_bf16(float f);

// ---- K/V elements (the KV cache's dtypes: F32, F16, BF16; kernels/kv_view.h) ------------
// dst[0..n) of `type` = src rounded to nearest even (fp32_to_fp16 / fp32_to_bf16 bit for
// bit; F16C instructions where the CPU has them). Throws std::invalid_argument for a
// type that is not a KV dtype.
void kv_from_fp32(TensorType type, const float* src, void* dst, int64_t n);
// dst[0..n) = the elements of `type` at src as fp32, exact.
void kv_to_fp32(TensorType type, const void* src, float* dst, int64_t n);

// ---- row dequantization ---------------------------------------------------------------
// n is the number of output elements; for the block formats it must be a multiple of the
// block size, 32 or 256 (checked by the callers; these functions assume it).
void dequantize_f32(const void* src, float* dst, int64_t n);
void dequantize_f16(const void* src, float* dst, int64_t n);
void dequantize_bf16(const void* src, float* dst, int64_t n);
void dequantize_q4_0(const void* src, float* dst, int64_t n);
void dequantize_q4_1(const void* src, float* dst, int64_t n);
void dequantize_q5_0(const void* src, float* dst, int64_t n);
void dequantize_q5_1(const void* src, float* dst, int64_t n);
void dequantize_q8_0(const void* src, float* dst, int64_t n);
void dequantize_q4_k(const void* src, float* dst, int64_t n);  // kernels/kquant_blocks.cpp
void dequantize_q5_k(const void* src, float* dst, int64_t n);
void dequantize_q6_k(const void* src, float* dst, int64_t n);

// Dispatch on the tensor type. Throws std::invalid_argument for a type outside the
// table, a negative n, or an n that is not a multiple of the type's block size.
void dequantize_row(TensorType type, const void* src, float* dst, int64_t n);
// Same, but each value is stored as bf16: the fp32 result of dequantize_row rounded to
// nearest even (fp32_to_bf16). A BF16 source is copied unchanged.
void dequantize_row_to_bf16(TensorType type, const void* src, uint16_t* dst, int64_t n);

}  // namespace bs::kernels
