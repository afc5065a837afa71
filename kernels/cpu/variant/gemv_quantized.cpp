// Decode-size products read the stored weights (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, the
// K-quants Q4_K/Q5_K/Q6_K, F16/BF16/F32) directly: decode is memory-bound, and
// 4/8-bit rows are 4-8x fewer bytes than bf16.
//
// The default product (DecodeActivations::Exact) of each type:
// - Q8_0, the K-quants, F32/F16/BF16: each 32-element block expanded to fp32 in
//   registers and multiplied with fp32 activations (no activation rounding, so no extra
//   error).
// - Q4_0, Q4_1, Q5_0, Q5_1 (kInt16Product): expanding every 4/5-bit weight to fp32 made
//   their decode compute-bound (AVX2: ~25 instructions a block, a third of the memory
//   bandwidth; AVX-512 on an EPYC Zen 4: 1.3-1.4x the time of the integer form, measured
//   on Gemma 3 270M's and SmolLM2's shapes). So their activations are rounded to int16 per block
//   of 32 (scale max|x| / 32767: error <= 2^-16 of the block's largest value, far below
//   the weights' own 4/5-bit error and the bf16 rounding of prefill) and the blocks
//   multiply as integers: gemv_int16, in gemv_integer.cpp.
// K-quant super-blocks are read one 32-element sub-block at a time (its quants unpacked
// with AVX2 integer ops, its scales as kernels/kquant_blocks.h defines them, inline:
// gemv_blocks.h), so every type runs through the same block loops. This file: the fp32
// products; gemv_integer.cpp: the integer ones, and gemv_int8 (DecodeActivations::Int8,
// every block type, activations rounded to int8; measured in tools/bench/RESULTS.md,
// "int8 decode activations").
#include "kernels/cpu/variant/simd.h"  // first: see the note there
#include "kernels/cpu/variant/gemv_blocks.h"
#include "kernels/cpu/variant/variant_ops.h"
#include "kernels/dequant.h"
#include "kernels/kquant_blocks.h"  // the scalar variant calls its functions

namespace bs::kernels::cpu::BS_ISA_NS {
namespace {

// Expand one block of 32 weights stored in 32-element blocks (all types but the
// K-quants) into kBlockVecs vectors (elements in order).
template <TensorType T>
inline void load_block32(const uint8_t* blk, vf* w) {
#if BS_ISA_LEVEL >= 1
  if constexpr (T == TensorType::Q5_0) {
    const __m256i q = _mm256_sub_epi8(q5_quants(blk + 2, blk + 6), _mm256_set1_epi8(16));
    const float d = half_to_float(blk);
    return expand_int8<false>(q, d, d, 0.0f, w);
  } else if constexpr (T == TensorType::Q5_1) {
    const float d = half_to_float(blk);
    return expand_int8<true>(q5_quants(blk + 4, blk + 8), d, d, half_to_float(blk + 2), w);
  }
#endif
#if BS_ISA_LEVEL >= 2
  if constexpr (T == TensorType::Q4_1 || T == TensorType::Q4_0) {
    const float d = half_to_float(blk);
    const uint8_t* qs = blk + (T == TensorType::Q4_1 ? 4 : 2);
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(raw, mask)));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(raw, 4), mask)));
    const __m512 vd = _mm512_set1_ps(d);
    if constexpr (T == TensorType::Q4_1) {
      const __m512 vm = _mm512_set1_ps(half_to_float(blk + 2));
      w[0] = _mm512_fmadd_ps(lo, vd, vm);
      w[1] = _mm512_fmadd_ps(hi, vd, vm);
    } else {
      const __m512 eight = _mm512_set1_ps(8.0f);
      w[0] = _mm512_mul_ps(_mm512_sub_ps(lo, eight), vd);
      w[1] = _mm512_mul_ps(_mm512_sub_ps(hi, eight), vd);
    }
  } else if constexpr (T == TensorType::Q8_0) {
    const __m512 vd = _mm512_set1_ps(half_to_float(blk));
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18));
    w[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), vd);
    w[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), vd);
  } else if constexpr (T == TensorType::F32) {
    w[0] = _mm512_loadu_ps(reinterpret_cast<const float*>(blk));
    w[1] = _mm512_loadu_ps(reinterpret_cast<const float*>(blk) + 16);
  } else if constexpr (T == TensorType::F16) {
    w[0] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    w[1] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
  } else {  // BF16: shift into the upper half of a float
    const __m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    const __m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
    w[0] = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16));
    w[1] = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
  }
#elif BS_ISA_LEVEL == 1
  if constexpr (T == TensorType::Q4_1 || T == TensorType::Q4_0) {
    const __m256 vd = _mm256_set1_ps(half_to_float(blk));
    const uint8_t* qs = blk + (T == TensorType::Q4_1 ? 4 : 2);
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(raw, mask);                     // elements 0..15
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);  // elements 16..31
    const __m256 q[4] = {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)),
                         _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))),
                         _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)),
                         _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)))};
    if constexpr (T == TensorType::Q4_1) {
      const __m256 vm = _mm256_set1_ps(half_to_float(blk + 2));
      for (int i = 0; i < 4; ++i) w[i] = _mm256_fmadd_ps(q[i], vd, vm);
    } else {
      const __m256 eight = _mm256_set1_ps(8.0f);
      for (int i = 0; i < 4; ++i) w[i] = _mm256_mul_ps(_mm256_sub_ps(q[i], eight), vd);
    }
  } else if constexpr (T == TensorType::Q8_0) {
    const __m256 vd = _mm256_set1_ps(half_to_float(blk));
    for (int i = 0; i < 4; ++i)
      w[i] = _mm256_mul_ps(
          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * i)))),
          vd);
  } else if constexpr (T == TensorType::F32) {
    for (int i = 0; i < 4; ++i) w[i] = _mm256_loadu_ps(reinterpret_cast<const float*>(blk) + 8 * i);
  } else if constexpr (T == TensorType::F16) {
    for (int i = 0; i < 4; ++i) w[i] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * i)));
  } else {  // BF16
    for (int i = 0; i < 4; ++i)
      w[i] = _mm256_castsi256_ps(_mm256_slli_epi32(
          _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 16 * i))), 16));
  }
#else
  // Scalar: the bit-exact reference dequantizers, one block at a time.
  alignas(64) float tmp[kBlock];
  if constexpr (T == TensorType::Q4_1) dequantize_q4_1(blk, tmp, kBlock);
  else if constexpr (T == TensorType::Q4_0) dequantize_q4_0(blk, tmp, kBlock);
  else if constexpr (T == TensorType::Q5_0) dequantize_q5_0(blk, tmp, kBlock);
  else if constexpr (T == TensorType::Q5_1) dequantize_q5_1(blk, tmp, kBlock);
  else if constexpr (T == TensorType::Q8_0) dequantize_q8_0(blk, tmp, kBlock);
  else if constexpr (T == TensorType::F32) dequantize_f32(blk, tmp, kBlock);
  else if constexpr (T == TensorType::F16) dequantize_f16(blk, tmp, kBlock);
  else dequantize_bf16(blk, tmp, kBlock);
  for (int i = 0; i < kBlockVecs; ++i) w[i] = vload(tmp + i * kLanes);
#endif
}


// Block b (of 32 elements) of a row of type T into kBlockVecs vectors.
template <TensorType T>
inline void load_block(const uint8_t* row, int64_t b, vf* w) {
  if constexpr (kSuperBlock<T>) {
    const uint8_t* super = row + (b >> 3) * kTypeBytes<T>;
    const int s = static_cast<int>(b & 7);
#if BS_ISA_LEVEL >= 1
    const KSubBlockScales sc = k_scales<T>(super, s);
    if constexpr (T == TensorType::Q6_K) expand_int8<false>(k_quants<T>(super, s), sc.scale[0], sc.scale[1], 0.0f, w);
    else expand_int8<true>(k_quants<T>(super, s), sc.scale[0], sc.scale[1], -sc.offset, w);
#else
    const KSubBlockScales sc = k_sub_block_scales(T, super, s);
    int8_t q[kBlock];
    k_sub_block_quants(T, super, s, q);
    alignas(64) float tmp[kBlock];
    for (int e = 0; e < kBlock; ++e) tmp[e] = sc.scale[e / 16] * static_cast<float>(q[e]) - sc.offset;
    for (int i = 0; i < kBlockVecs; ++i) w[i] = vload(tmp + i * kLanes);
#endif
  } else {
    load_block32<T>(row + b * kTypeBytes<T>, w);
  }
}

// Every token keeps kBlockVecs accumulator chains (vector i of each block adds into
// chain i) however many tokens share the weight pass, so its FMAs do not wait on each
// other and its result is bit-identical alone or batched (Transformer::decode_step
// relies on it). The chains of the tokens and the block's weights must fit the
// registers: AVX-512 has room for 8 tokens (16 + 2 of 32). AVX2 (room for 3) uses
// gemv_lanes_* below instead.
//
// The products of one row with G tokens (a compile-time count: the accumulators stay
// in registers); y[t * out] receives token t's.
template <TensorType T, int G>
inline void row_tokens(const uint8_t* row, int64_t blocks, const float* x, int64_t in, float* y, int64_t out) {
  vf acc[G][kBlockVecs];
  for (int t = 0; t < G; ++t)
    for (int c = 0; c < kBlockVecs; ++c) acc[t][c] = vzero();
  for (int64_t b = 0; b < blocks; ++b) {
    vf wv[kBlockVecs];
    load_block<T>(row, b, wv);
    for (int t = 0; t < G; ++t) {
      const float* xb = x + t * in + b * kBlock;
      for (int i = 0; i < kBlockVecs; ++i) acc[t][i] = vfma(wv[i], vload(xb + i * kLanes), acc[t][i]);
    }
  }
  for (int t = 0; t < G; ++t) {
    vf sum = acc[t][0];
    for (int c = 1; c < kBlockVecs; ++c) sum = vadd(sum, acc[t][c]);
    y[t * out] = hsum(sum);
  }
}

// row_tokens for a run-time count g <= G.
template <TensorType T, int G>
inline void row_group(int64_t g, const uint8_t* row, int64_t blocks, const float* x, int64_t in,
                      float* y, int64_t out) {
  if constexpr (G > 1) {
    if (g < G) return row_group<T, G - 1>(g, row, blocks, x, in, y, out);
  }
  row_tokens<T, G>(row, blocks, x, in, y, out);
}

#if BS_ISA_LEVEL == 1
// AVX2: one accumulator chain per (row, token), acc = fma(w_v, x_v, acc) over the row's
// vectors in order, and 8 chains finished together by one horizontal-add tree (hsum8,
// the same tree for every lane). Lanes are 8 rows of one token (gemv_lanes_rows) or
// one row of up to 8 tokens (gemv_lanes_tokens): the same op sequence per (row,
// token), so rows are bit-identical alone or batched, and a block is expanded once
// for all tokens with 8 chains in flight (the registers hold 8 chains + 4 weights).
template <TensorType T>
void gemv_lanes_rows(const uint8_t* base, int64_t row_bytes, int64_t blocks, const float* x, float* y, int64_t out) {
  const int64_t groups = (out + 7) / 8;
#pragma omp parallel for schedule(static) if (out >= 64)
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* rows[8];
    for (int r = 0; r < 8; ++r) rows[r] = base + imin(g * 8 + r, out - 1) * row_bytes;
    const uint8_t* next = base + (g + 1) * 8 * row_bytes;  // the next group, prefetched a block's share at a time
    vf acc[8];
    for (int r = 0; r < 8; ++r) acc[r] = vzero();
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t at = b * 8 * row_bytes / blocks; at < (b + 1) * 8 * row_bytes / blocks; at += 64)
        _mm_prefetch(reinterpret_cast<const char*>(next + at), _MM_HINT_T0);
      for (int r = 0; r < 8; ++r) {
        vf wv[kBlockVecs];
        load_block<T>(rows[r], b, wv);
        for (int i = 0; i < kBlockVecs; ++i) acc[r] = vfma(wv[i], vload(x + b * kBlock + i * kLanes), acc[r]);
      }
    }
    alignas(32) float res[8];
    hsum8(acc, res);
    for (int64_t r = 0; r < 8 && g * 8 + r < out; ++r) y[g * 8 + r] = res[r];
  }
}

template <TensorType T, int NT>
void gemv_lanes_tokens(const uint8_t* base, int64_t row_bytes, int64_t blocks, const float* x, int64_t in, float* y,
                       int64_t out) {
#pragma omp parallel for schedule(static) if (out >= 64)
  for (int64_t o = 0; o < out; ++o) {
    const uint8_t* row = base + o * row_bytes;
    const uint8_t* next = row + 4 * row_bytes;  // prefetched a block's share at a time
    vf acc[8];
    for (int t = 0; t < 8; ++t) acc[t] = vzero();
    for (int64_t b = 0; b < blocks; ++b) {
      if (b % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(next + b * row_bytes / blocks), _MM_HINT_T0);
      vf wv[kBlockVecs];
      load_block<T>(row, b, wv);
      for (int i = 0; i < kBlockVecs; ++i)
        for (int t = 0; t < NT; ++t) acc[t] = vfma(wv[i], vload(x + t * in + b * kBlock + i * kLanes), acc[t]);
    }
    alignas(32) float res[8];
    hsum8(acc, res);
    for (int t = 0; t < NT; ++t) y[t * out + o] = res[t];
  }
}
#endif

// Rows [0, out) of W times nt <= kMaxTokens tokens, in one pass over the weights.
template <TensorType T>
void gemv_tokens(const uint8_t* base, int64_t row_bytes, int64_t blocks, const float* x, int64_t in, float* y,
                 int64_t out, int64_t nt) {
#if BS_ISA_LEVEL == 1
  switch (nt) {
    case 1: return gemv_lanes_rows<T>(base, row_bytes, blocks, x, y, out);
    case 2: return gemv_lanes_tokens<T, 2>(base, row_bytes, blocks, x, in, y, out);
    case 3: return gemv_lanes_tokens<T, 3>(base, row_bytes, blocks, x, in, y, out);
    case 4: return gemv_lanes_tokens<T, 4>(base, row_bytes, blocks, x, in, y, out);
    case 5: return gemv_lanes_tokens<T, 5>(base, row_bytes, blocks, x, in, y, out);
    case 6: return gemv_lanes_tokens<T, 6>(base, row_bytes, blocks, x, in, y, out);
    case 7: return gemv_lanes_tokens<T, 7>(base, row_bytes, blocks, x, in, y, out);
    default: return gemv_lanes_tokens<T, 8>(base, row_bytes, blocks, x, in, y, out);
  }
#else
#pragma omp parallel for schedule(static) if (out >= 64)
  for (int64_t o = 0; o < out; ++o)
    row_group<T, kMaxTokens>(nt, base + o * row_bytes, blocks, x, in, y + o, out);
#endif
}

template <TensorType T>
void gemv_typed(const void* w, const float* x, float* y, int64_t n, int64_t in, int64_t out) {
  const auto* base = static_cast<const uint8_t*>(w);
#if BS_ISA_LEVEL >= 1
  if constexpr (kInt16Product<T>) return gemv_int16(T, w, x, y, n, in, out);
#endif
  const int64_t blocks = in / kBlock;
  const int64_t row_bytes = in / kTypeElements<T> * kTypeBytes<T>;
  for (int64_t t0 = 0; t0 < n; t0 += kMaxTokens)
    gemv_tokens<T>(base, row_bytes, blocks, x + t0 * in, in, y + t0 * out, out, imin(kMaxTokens, n - t0));
}

}  // namespace

void gemv_quantized(TensorType type, const void* w, const float* x, float* y, int64_t n, int64_t in_features,
                    int64_t out_features) {
  switch (type) {
    case TensorType::Q4_0: return gemv_typed<TensorType::Q4_0>(w, x, y, n, in_features, out_features);
    case TensorType::Q4_1: return gemv_typed<TensorType::Q4_1>(w, x, y, n, in_features, out_features);
    case TensorType::Q5_0: return gemv_typed<TensorType::Q5_0>(w, x, y, n, in_features, out_features);
    case TensorType::Q5_1: return gemv_typed<TensorType::Q5_1>(w, x, y, n, in_features, out_features);
    case TensorType::Q8_0: return gemv_typed<TensorType::Q8_0>(w, x, y, n, in_features, out_features);
    case TensorType::Q4_K: return gemv_typed<TensorType::Q4_K>(w, x, y, n, in_features, out_features);
    case TensorType::Q5_K: return gemv_typed<TensorType::Q5_K>(w, x, y, n, in_features, out_features);
    case TensorType::Q6_K: return gemv_typed<TensorType::Q6_K>(w, x, y, n, in_features, out_features);
    case TensorType::F32: return gemv_typed<TensorType::F32>(w, x, y, n, in_features, out_features);
    case TensorType::F16: return gemv_typed<TensorType::F16>(w, x, y, n, in_features, out_features);
    case TensorType::BF16: return gemv_typed<TensorType::BF16>(w, x, y, n, in_features, out_features);
  }
}

}  // namespace bs::kernels::cpu::BS_ISA_NS
