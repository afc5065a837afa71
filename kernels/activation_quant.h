// Decode-size products of block-quantized weights with activations rounded to 8 or 16
// bits: the scalar reference of what the CPU's integer decode products compute (the
// products themselves: kernels/cpu/variant/gemv_quantized.cpp; which runs:
// DecodeActivations, kernels/backend.h, and the type).
//
// Why: one-token decode of 4-6-bit blocks is compute-bound on 2 cores (expanding every
// weight to fp32 costs more than reading it).
// - 16 bits, the default product of the 4/5-bit types (has_int16_decode_product) from
//   AVX2 up: the weights widened to int16, vpmaddwd. The rounding error is <= scale / 2
//   = max|x| / 65534 per element of a block: below the bf16 rounding prefill applies to
//   every activation.
// - 8 bits, every block type, when DecodeActivations::Int8 asks for it: llama.cpp
//   multiplies quantized blocks with activations rounded to int8 (Q8_0 or Q8_K blocks,
//   one fp32 scale each): vpmaddubsw then does 32 products in one instruction. Ours are
//   rounded per block of 32 for every type. The rounding error is <= max|x| / 254 per
//   element; the golden tests bound what it does to the model.
#pragma once

#include <cstdint>

#include "kernels/tensor_types.h"

namespace bs::kernels {

// One block of 32 activations rounded to int8: scale = max|x| / 127 (1 when the block is
// all zero), q[i] = round-to-nearest-even(x[i] * (1 / scale)) in fp32 arithmetic, so q
// is in [-127, 127]. Returns scale. The vector kernels round the same way, bit for bit.
float quantize_block_int8(const float* x,  // [32]
                          int8_t* q);      // [32]
// The same with 16 bits: scale = max|x| / 32767, q in [-32767, 32767].
float quantize_block_int16(const float* x,  // [32]
                           int16_t* q);     // [32]

// The block types whose decode-size product has an int8-activation form: Q4_0, Q4_1,
// Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (every block type; not F32/F16/BF16).
bool has_int8_decode_product(TensorType type);
// The block types whose default decode-size product (from AVX2 up) rounds activations to
// int16: Q4_0, Q4_1, Q5_0, Q5_1 (32-element blocks of unsigned integers of at most 5
// bits). Not Q8_0 (its fp32 product runs at the memory bandwidth and keeps the output
// projection's logits within 1e-4) nor the K-quants (their sub-block scales cost as much
// as the products, so the integer form gained nothing; Q6_K's integer sums with int16
// activations could pass int32).
bool has_int16_decode_product(TensorType type);

// y[t, o] = sum over 32-element blocks b of the block's product, computed in double.
// Block b of row o, as its dequantizer defines it, is  w[e] = s[e / 16] * wq[e] + add
// with integers wq (Q4_0: nibble - 8; Q5_0: 5-bit value - 16; Q4_1, Q5_1: the stored
// value, add = m; Q8_0: as stored; Q4_K, Q5_K, Q6_K: sub-block b % 8 of super-block
// b / 8, kernels/kquant_blocks.h, add = -offset), so
//   product = sum over halves h of s[h] * scale[t][b] * sum_{e in h} wq[e] * q[t][e]
//             + add * sum_i x[t][i]
// with q, scale from quantize_block_int8 (bits 8) or quantize_block_int16 (bits 16) (the
// additive term multiplies the fp32 activations, as the kernels do). Throws
// std::invalid_argument for bits other than 8 and 16, types without the form
// (has_int8_decode_product, has_int16_decode_product) or in_features not a multiple of
// the type's block.
void reference_gemv_rounded_activations(TensorType type,
                                        int bits,        // 8 or 16
                                        const void* w,   // [out_features] rows of `type` blocks
                                        const float* x,  // [n, in_features]
                                        float* y,        // [n, out_features]
                                        int64_t n, int64_t in_features, int64_t out_features);

}  // namespace bs::kernels
