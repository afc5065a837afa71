// Dequantization of ggml block formats and scalar fp16/bf16 <-> fp32 conversion.
//
// Results match ggml's reference definitions bit for bit:
//   F32   plain float
//   F16   IEEE half
//   BF16  bfloat16 (upper half of a float)
//   Q4_0  block of 32: fp16 d, 16 bytes; byte j holds element j (low nibble) and
//         element j+16 (high nibble); x = (q - 8) * d
//   Q4_1  block of 32: fp16 d, fp16 m, 16 bytes nibbles as Q4_0; x = q * d + m
//   Q8_0  block of 32: fp16 d, 32 int8; x = q * d
//
// This header is independent of model/: tensor types are passed as the raw ggml type
// number (the values of bs::gguf::GgmlType, which equal ggml.h's numbering).
#pragma once

#include <cstdint>

namespace bs::kernels {

// ggml type numbers understood by the functions below.
namespace ggml_type {
inline constexpr uint32_t kF32 = 0;
inline constexpr uint32_t kF16 = 1;
inline constexpr uint32_t kQ4_0 = 2;
inline constexpr uint32_t kQ4_1 = 3;
inline constexpr uint32_t kQ8_0 = 8;
inline constexpr uint32_t kBF16 = 30;
}  // namespace ggml_type

// Block geometry of the layouts above.
inline constexpr int64_t kQK4_0 = 32;
inline constexpr int64_t kQK4_1 = 32;
inline constexpr int64_t kQK8_0 = 32;
inline constexpr int64_t kBlockBytesQ4_0 = 2 + 16;
inline constexpr int64_t kBlockBytesQ4_1 = 2 + 2 + 16;
inline constexpr int64_t kBlockBytesQ8_0 = 2 + 32;

// ---- scalar conversions ---------------------------------------------------------------
// Exact (every half is representable as a float); NaN payloads are kept.
float fp16_to_fp32(uint16_t h);
// Round to nearest even; overflow gives +-inf; NaN stays NaN (quiet).
uint16_t fp32_to_fp16(float f);
// Exact.
float bf16_to_fp32(uint16_t h);
// Round to nearest even; NaN stays NaN (quiet bit forced, sign kept).
uint16_t fp32_to_bf16(float f);

// ---- row dequantization ---------------------------------------------------------------
// n is the number of output elements; for the block formats it must be a multiple of 32
// (checked by the callers; these functions assume it). src holds n / 32 blocks.
void dequantize_f32(const void* src, float* dst, int64_t n);
void dequantize_f16(const void* src, float* dst, int64_t n);
void dequantize_bf16(const void* src, float* dst, int64_t n);
void dequantize_q4_0(const void* src, float* dst, int64_t n);
void dequantize_q4_1(const void* src, float* dst, int64_t n);
void dequantize_q8_0(const void* src, float* dst, int64_t n);

// Elements per block / bytes per block of a type number; 0 for types not listed above.
int64_t type_block_elements(uint32_t type);
int64_t type_block_bytes(uint32_t type);

// Dispatch on the ggml type number. Throws std::invalid_argument for a type not listed
// above, a negative n, or an n that is not a multiple of the type's block size.
void dequantize_row(uint32_t type, const void* src, float* dst, int64_t n);
// Same, but each value is stored as bf16: the fp32 result of dequantize_row rounded to
// nearest even (fp32_to_bf16). A BF16 source is copied unchanged.
void dequantize_row_to_bf16(uint32_t type, const void* src, uint16_t* dst, int64_t n);

}  // namespace bs::kernels
