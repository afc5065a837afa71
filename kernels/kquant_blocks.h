// The K-quant super-blocks of ggml (Q4_K, Q5_K, Q6_K): 256 elements each, made of
// eight 32-element sub-blocks with scales of their own. Both the row dequantizers
// (kernels/dequant.h) and the decode products of the CPU variants
// (kernels/cpu/variant/gemv_quantized.cpp) read a super-block one sub-block at a time
// through these functions, so the two agree by construction.
//
// Layouts (ggml-common.h), all little endian:
//   Q4_K  144 bytes: fp16 d, fp16 dmin, scales[12] (eight 6-bit scales and eight 6-bit
//         mins, packed), qs[128]: sub-blocks 2c and 2c+1 are the low and high nibbles
//         of qs[32c .. 32c+32)
//   Q5_K  176 bytes: d, dmin, scales[12] as Q4_K, qh[32], qs[128] as Q4_K; bit s of
//         qh[l] is the fifth bit of element l of sub-block s
//   Q6_K  210 bytes: ql[128], qh[64], int8 scales[16] (one per 16 elements), fp16 d;
//         q = (4 low bits | 2 high bits << 4) - 32
// Element e of sub-block s is  scale[e / 16] * q[e] - offset,  evaluated in fp32 in
// that order (ggml's dequantize_row_q*_K: bit-exact, the products being exact).
#pragma once

#include <cstdint>

#include "kernels/tensor_types.h"

namespace bs::kernels {

inline constexpr int64_t kQK_K = 256;           // elements per super-block
inline constexpr int64_t kKSubBlocks = 8;       // 32-element sub-blocks per super-block
inline constexpr int64_t kBlockBytesQ4_K = 144;
inline constexpr int64_t kBlockBytesQ5_K = 176;
inline constexpr int64_t kBlockBytesQ6_K = 210;

inline bool is_k_quant(TensorType t) {
  return t == TensorType::Q4_K || t == TensorType::Q5_K || t == TensorType::Q6_K;
}

struct KSubBlockScales {
  float scale[2];  // of elements [0, 16) and [16, 32) (equal but for Q6_K)
  float offset;    // subtracted after scaling (0 for Q6_K)
};

// Sub-block s (0..7) of the super-block at `super` (type Q4_K, Q5_K or Q6_K; others
// are not checked here).
KSubBlockScales k_sub_block_scales(TensorType type, const uint8_t* super, int s);
// Its 32 quants, q[e] as the formula above takes them (0..31 for Q4_K/Q5_K,
// -32..31 for Q6_K).
void k_sub_block_quants(TensorType type, const uint8_t* super, int s, int8_t* q /* [32] */);

}  // namespace bs::kernels
