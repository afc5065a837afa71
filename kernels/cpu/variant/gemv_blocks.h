// The stored blocks as the decode-size products read them, shared by the fp32-activation
// products (gemv_quantized.cpp) and the integer ones (gemv_integer.cpp) of one kernel
// variant: block sizes, each type's bytes, fp16 scales, and the AVX2 integer unpacking
// of 4/5/6/8-bit quants and K-quant scales (bit-identical to kernels/dequant.h and
// kernels/kquant_blocks.h). Private to kernels/cpu/variant; included after simd.h.
// Everything is in an unnamed namespace: each variant's objects keep their own copy
// (no weak symbol another variant's code could be linked to:
// tools/ci/check_variant_symbols.sh).
#pragma once

#include "kernels/cpu/variant/simd.h"
#include "kernels/cpu/variant/variant_ops.h"
#include "kernels/kquant_blocks.h"  // KSubBlockScales

namespace bs::kernels::cpu::BS_ISA_NS {
namespace {

constexpr int kMaxTokens = 8;
constexpr int kBlock = 32;
constexpr int kBlockVecs = kBlock / kLanes;

#if BS_ISA_LEVEL >= 1
inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
#endif

// Bytes and elements of one stored block of each type (kernels/tensor_types.cpp's
// table, as compile-time values: the variant code cannot call into that table's
// inline code). The K-quants' blocks are super-blocks of 256 (kernels/kquant_blocks.h).
template <TensorType T>
constexpr bool kSuperBlock = T == TensorType::Q4_K || T == TensorType::Q5_K || T == TensorType::Q6_K;
template <TensorType T>
constexpr int64_t kTypeElements = kSuperBlock<T> ? 256 : 32;
template <TensorType T>
constexpr int64_t kTypeBytes = T == TensorType::Q4_0 ? 18 : T == TensorType::Q4_1 ? 20 : T == TensorType::Q5_0 ? 22
                               : T == TensorType::Q5_1 ? 24 : T == TensorType::Q8_0 ? 34 : T == TensorType::Q4_K ? 144
                               : T == TensorType::Q5_K ? 176 : T == TensorType::Q6_K ? 210 : T == TensorType::F32 ? 128
                               : 64;  // F16, BF16

#if BS_ISA_LEVEL >= 1
// 32 small integer weights (int8 lanes of q, elements in order) into kBlockVecs vectors:
// w = q * scale[e / 16] (+ add where Add). Exact as the scalar dequantizers: q * scale
// is exact for every format that adds (q <= 5 bits, scale an fp16 times <= 6 bits), so
// the fused multiply-add rounds once, like their separate product and sum.
template <bool Add>
inline void expand_int8(__m256i q, float scale0, float scale1, float add, vf* w) {
  const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
#if BS_ISA_LEVEL >= 2
  const __m512 f[2] = {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi))};
  const __m512 sc[2] = {_mm512_set1_ps(scale0), _mm512_set1_ps(scale1)};
  for (int i = 0; i < 2; ++i) w[i] = Add ? _mm512_fmadd_ps(f[i], sc[i], _mm512_set1_ps(add)) : _mm512_mul_ps(f[i], sc[i]);
#else
  const __m256 f[4] = {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)),
                       _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))),
                       _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)),
                       _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))};
  for (int i = 0; i < 4; ++i) {
    const __m256 sc = _mm256_set1_ps(i < 2 ? scale0 : scale1);
    w[i] = Add ? _mm256_fmadd_ps(f[i], sc, _mm256_set1_ps(add)) : _mm256_mul_ps(f[i], sc);
  }
#endif
}

// The 32 bits at p as 32 bytes, 0xFF where the bit is set (byte e: bit e).
inline __m256i bytes_from_bits(const uint8_t* p) {
  uint32_t bits;
  memcpy(&bits, p, 4);
  const __m256i shuffle = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuffle);
  const __m256i others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);  // every bit but byte e's own
  return _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi64x(-1));
}

// Q5_0 / Q5_1: the nibbles of qs[16] (low nibbles elements 0..15, high 16..31) with the
// fifth bits of qh.
inline __m256i q5_quants(const uint8_t* qh, const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), _mm_and_si128(raw, mask));
  return _mm256_or_si256(nib, _mm256_and_si256(bytes_from_bits(qh), _mm256_set1_epi8(0x10)));
}

// Sub-block s of a K-quant super-block: its 32 quants as kernels/kquant_blocks.h
// defines them (k_sub_block_quants), with AVX2 integer ops.
template <TensorType T>
inline __m256i k_quants(const uint8_t* super, int s) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  if constexpr (T == TensorType::Q6_K) {
    const int n = s / 4, k = s % 4;
    __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(super + 64 * n + (k & 1) * 32));
    if (k >= 2) ql = _mm256_srli_epi16(ql, 4);
    ql = _mm256_and_si256(ql, low4);
    __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(super + 128 + 32 * n));
    qh = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi8(3));
    return _mm256_sub_epi8(_mm256_or_si256(ql, _mm256_slli_epi16(qh, 4)), _mm256_set1_epi8(32));
  } else {
    const uint8_t* qs = super + (T == TensorType::Q5_K ? 48 : 16) + 32 * (s / 2);
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
    if (s & 1) v = _mm256_srli_epi16(v, 4);
    v = _mm256_and_si256(v, low4);
    if constexpr (T == TensorType::Q5_K) {
      __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(super + 16));
      h = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(s)), _mm256_set1_epi8(1));
      v = _mm256_or_si256(v, _mm256_slli_epi16(h, 4));
    }
    return v;
  }
}
#endif

#if BS_ISA_LEVEL >= 1
// kernels/kquant_blocks.h's k_sub_block_scales, inline and with the F16C conversion:
// the same products of exactly converted values, so bit-identical to it. (The shared
// function is out of line and converts fp16 in software in the baseline-ISA library:
// a call and two software conversions per sub-block were 7% of Gemma 3 270M's decode.)
template <TensorType T>
inline KSubBlockScales k_scales(const uint8_t* super, int s) {
  KSubBlockScales out;
  if constexpr (T == TensorType::Q6_K) {
    const float d = half_to_float(super + 208);
    const auto* sc = reinterpret_cast<const int8_t*>(super + 192);
    const int n = s / 4, k = s % 4;
    out.scale[0] = d * static_cast<float>(sc[8 * n + 2 * k]);
    out.scale[1] = d * static_cast<float>(sc[8 * n + 2 * k + 1]);
    out.offset = 0.0f;
  } else {  // Q4_K, Q5_K: ggml's get_scale_min_k4
    const uint8_t* q = super + 4;
    int sc, m;
    if (s < 4) {
      sc = q[s] & 63;
      m = q[s + 4] & 63;
    } else {
      sc = (q[s + 4] & 0xF) | ((q[s - 4] >> 6) << 4);
      m = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
    }
    out.scale[0] = out.scale[1] = half_to_float(super) * static_cast<float>(sc);
    out.offset = half_to_float(super + 2) * static_cast<float>(m);
  }
  return out;
}
#endif

// The types whose default (DecodeActivations::Exact) decode product rounds activations
// to int16: their stored integers are unsigned and small, so widening them to int16 and
// one vpmaddwd per 16 pairs replaces expanding each weight to fp32 (what made their
// decode compute-bound: 1.3-1.4x the time on an EPYC Zen 4, AVX-512). Q8_0 keeps fp32
// activations: its expansion is cheap, its product (the output projection, in most
// files) runs at the memory bandwidth either way, and its logits stay within 1e-4 of the
// F32 reference (int16 activations there measured 1.5e-3). The K-quants keep them too:
// their sub-block scales cost as much as the products (Q4_K measured the same time both
// ways), and Q6_K's int8 scales times int16 activations can pass int32 over a block.
template <TensorType T>
constexpr bool kInt16Product = T == TensorType::Q4_0 || T == TensorType::Q4_1 || T == TensorType::Q5_0 ||
                               T == TensorType::Q5_1;

}  // namespace

#if BS_ISA_LEVEL >= 1
// The product of the kInt16Product types with their activations rounded to int16 per
// block of 32 (gemv_integer.cpp): their default decode product.
void gemv_int16(TensorType type, const void* w, const float* x, float* y, int64_t n, int64_t in_features,
                int64_t out_features);
#endif

}  // namespace bs::kernels::cpu::BS_ISA_NS
