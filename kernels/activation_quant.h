// Decode-size products of 4-bit weights with activations rounded to 8 bits: the scalar
// reference of what the CPU's int8 decode path computes (the path itself:
// kernels/cpu/variant/gemv_quantized.cpp; which path runs: DecodeActivations,
// kernels/backend.h).
//
// Why: on AVX2 one-token decode is compute-bound (unpacking 4-bit blocks and multiplying
// them with fp32 or int16 activations). llama.cpp multiplies Q4 blocks with activations
// quantized to Q8_0 (int8 per block of 32, one fp32 scale): vpmaddubsw then does 32
// products in one instruction. The rounding error is <= scale / 2 = max|x| / 254 per
// element of a block; the golden tests bound what it does to the model.
#pragma once

#include <cstdint>

#include "kernels/tensor_types.h"

namespace bs::kernels {

// One block of 32 activations rounded to int8: scale = max|x| / 127 (1 when the block is
// all zero), q[i] = round-to-nearest-even(x[i] * (1 / scale)) in fp32 arithmetic, so q
// is in [-127, 127]. Returns scale. The vector kernels round the same way, bit for bit.
float quantize_block_int8(const float* x,  // [32]
                          int8_t* q);      // [32]

// y[t, o] = sum over blocks b of the block's product, computed in double:
//   Q4_0: d[o][b] * scale[t][b] * sum_i (w_q[o][i] - 8) * q[t][i]
//   Q4_1: d[o][b] * scale[t][b] * sum_i  w_q[o][i]      * q[t][i]  +  m[o][b] * sum_i x[t][i]
// with w_q the stored nibbles and q, scale from quantize_block_int8 (Q4_1's offset term
// multiplies the fp32 activations, as the kernels do). Throws std::invalid_argument for
// other types or in_features not a multiple of 32.
void reference_gemv_int8_activations(TensorType type,
                                     const void* w,   // [out_features] rows of `type` blocks
                                     const float* x,  // [n, in_features]
                                     float* y,        // [n, out_features]
                                     int64_t n, int64_t in_features, int64_t out_features);

}  // namespace bs::kernels
