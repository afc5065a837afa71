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
//   the weights' own 4/5-bit error and the bf16 rounding of prefill), the weights widened
//   to int16 as stored, and blocks multiply as integers (vpmaddwd); each block's integer
//   dot product is exact, and 8 of them (8 rows of one token, or one row of up to 8
//   tokens) are finished together into one vector, scaled and accumulated there.
// K-quant super-blocks are read one 32-element sub-block at a time (its quants unpacked
// with AVX2 integer ops, its scales as kernels/kquant_blocks.h defines them, inline), so
// every type runs through the same block loops.
//
// gemv_int8 (every variant from AVX2 up, chosen by DecodeActivations::Int8,
// kernels/backend.h): the integer scheme for every block type, with activations rounded
// to int8 (scale max|x| / 127, as llama.cpp's Q8_0 activations) and weights as stored
// integers, so one vpmaddubsw and one vpmaddwd make a block's 32 products per token;
// an offset (Q4_0's -8, Q5_0's -16) comes off the exact integer sum, a minimum (Q4_1,
// Q5_1, the K-quants' mins) multiplies the block's fp32 sum, Q6_K's two 16-element
// scales go into the vpmaddwd. 256-bit integer ops on AVX-512 too (they are what it
// spends the time on; measured in tools/bench/RESULTS.md, "int8 decode activations").
// The scalar forms of both integer products: kernels/activation_quant.h.
#include "kernels/cpu/variant/simd.h"  // first: see the note there
#include "kernels/cpu/variant/variant_ops.h"
#include "kernels/dequant.h"
#include "kernels/kquant_blocks.h"  // KSubBlockScales; the scalar variant calls its functions

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

#if BS_ISA_LEVEL >= 1
// The integer products' activations (AVX2 integer and 256-bit float ops, which every
// variant from AVX2 up executes). Lane sums as the AVX2 variant's hsum and hmax.
inline float hsum256(__m256 v) {
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}
inline float hmax256(__m256 v) {
  const __m128 b = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 c = _mm_max_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_max_ss(c, _mm_movehdup_ps(c)));
}

// A block of 32 activations into v[4]; returns max |x| over the block.
inline float load_block_amax(const float* xb, __m256* v) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(xb + 8 * i);
  return hmax256(_mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                               _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3]))));
}

// The fp32 sum of a block loaded by load_block_amax (the offset term of the types that add).
inline float block_sum(const __m256* v) {
  return hsum256(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3])));
}

// Every block of 32 of nt tokens' activations x [nt, in]: emit(t, b, v, scale, inv) with
// its values in v[4], scale = max|x| / qmax (1 for a block of zeros) and inv = 1 / scale.
template <class Emit>
inline void for_each_scaled_block(const float* x, int64_t nt, int64_t in, float qmax, Emit emit) {
  const int64_t blocks = in / kBlock;
  for (int64_t t = 0; t < nt; ++t)
    for (int64_t b = 0; b < blocks; ++b) {
      __m256 v[4];
      const float amax = load_block_amax(x + t * in + b * kBlock, v);
      const float sc = amax > 0.0f ? amax / qmax : 1.0f;
      emit(t, b, v, sc, _mm256_set1_ps(1.0f / sc));
    }
}

// x rounded to A (int8_t or int16_t) per block of 32, as kernels/activation_quant.h's
// scalar reference (int8: llama.cpp's Q8_0 activations): q = round(x / scale), scale =
// max|x| / qmax (127 or 32767), so |q| <= qmax; qsum[t][b] = the block's sum of q (what
// a weight offset such as Q4_0's -8 takes off the integer dot product); sum[t][b] = the
// block's fp32 sum (what a weight minimum multiplies).
template <class A>
void quantize_blocks(const float* x, int64_t nt, int64_t in, A* q, float* scale, int32_t* qsum, float* sum) {
  constexpr bool kInt8 = sizeof(A) == 1;  // int8_t (else int16_t)
  const int64_t blocks = in / kBlock;
  for_each_scaled_block(x, nt, in, kInt8 ? 127.0f : 32767.0f, [&](int64_t t, int64_t b, const __m256* v, float sc,
                                                                   __m256 inv) {
    __m256i i32[4];
    for (int i = 0; i < 4; ++i) i32[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));  // nearest even
    A* qb = q + t * in + b * kBlock;
    const __m256i q01 = _mm256_packs_epi32(i32[0], i32[1]), q23 = _mm256_packs_epi32(i32[2], i32[3]);
    if constexpr (kInt8) {
      const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes the packs' lane interleave
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb),
                          _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q01, q23), order));
    } else {  // one pack: 64-bit quarters (0, 2, 1, 3) put the elements in order
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb), _mm256_permute4x64_epi64(q01, 0xD8));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + 16), _mm256_permute4x64_epi64(q23, 0xD8));
    }
    const __m256i isum = _mm256_add_epi32(_mm256_add_epi32(i32[0], i32[1]), _mm256_add_epi32(i32[2], i32[3]));
    alignas(32) int32_t lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), isum);
    int32_t total = 0;
    for (int i = 0; i < 8; ++i) total += lanes[i];
    scale[t * blocks + b] = sc;
    qsum[t * blocks + b] = total;
    sum[t * blocks + b] = block_sum(v);
  });
}

// Lane i of the result = the sum of p[i]'s 8 lanes. Integers: exact, so the order of
// the additions does not matter.
inline __m256i reduce8_epi32(const __m256i* p) {
  __m256i a[4];
  for (int i = 0; i < 4; ++i)
    a[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(p[2 * i], p[2 * i + 1]), _mm256_unpackhi_epi32(p[2 * i], p[2 * i + 1]));
  const __m256i b03 = _mm256_add_epi32(_mm256_unpacklo_epi64(a[0], a[1]), _mm256_unpackhi_epi64(a[0], a[1]));
  const __m256i b47 = _mm256_add_epi32(_mm256_unpacklo_epi64(a[2], a[3]), _mm256_unpackhi_epi64(a[2], a[3]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(b03, b47, 0x20), _mm256_permute2x128_si256(b03, b47, 0x31));
}

// Eight fp16 values widened to fp32 (F16C).
inline __m256 load8_fp16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// A group of up to kMaxTokens tokens' per-block activation values, transposed for the
// kernels with tokens in the lanes: token t's value of block b at [b * kMaxTokens + t],
// 0 past the group. `bias` (int8 path) multiplies the blocks' sums of q.
struct TokenBlocks {
  Scratch buf;
  float* scale;
  float* sum;
  int32_t* bias_qsum;
  explicit TokenBlocks(int64_t blocks)
      : buf(static_cast<size_t>(3 * blocks * kMaxTokens) * sizeof(float)), scale(buf.as<float>()),
        sum(scale + blocks * kMaxTokens), bias_qsum(reinterpret_cast<int32_t*>(sum + blocks * kMaxTokens)) {}
  // From the [token][block] arrays of all tokens (qsum may be null), tokens t0 .. t0 + nt.
  void fill(const float* all_scale, const float* all_sum, const int32_t* all_qsum, int32_t bias, int64_t blocks,
            int64_t t0, int64_t nt) {
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t t = 0; t < kMaxTokens; ++t) {
        const bool in = t < nt;
        const int64_t at = (t0 + t) * blocks + b;
        scale[b * kMaxTokens + t] = in ? all_scale[at] : 0.0f;
        sum[b * kMaxTokens + t] = in ? all_sum[at] : 0.0f;
        bias_qsum[b * kMaxTokens + t] = in && all_qsum ? bias * all_qsum[at] : 0;
      }
  }
};
#endif

#if BS_ISA_LEVEL >= 1
// ---- The integer products: int8 activations (gemv_int8, every block type) and int16
// activations (the default product of the 4/5-bit types, kInt16Product) ----
// Block b of a row as the integer products multiply it: 32 stored integers w as bytes in
// element order, and what turns their integer sum with a block of rounded activations
// into the product:
//   product = factor * scale[t][b] * (isum - bias * qsum[t][b]) + add * sum[t][b]
// isum = sum_e w[e] * q[t][e] (Q6_K: each half's sum times its int8 scale), exact in
// int32 (int16 activations: |w| <= 31, so |isum| <= 32 * 31 * 32767 < 2^25). Q4_0 and Q5_0 store their values offset by +8 and +16 (bias), which comes off
// the exact integer sum; Q8_0 and Q6_K hold signed values (kernels/activation_quant.h
// has the scalar form of every type: reference_gemv_rounded_activations).
template <TensorType T>
constexpr bool kIntSigned = T == TensorType::Q8_0 || T == TensorType::Q6_K;
template <TensorType T>
constexpr int kIntBias = T == TensorType::Q4_0 ? 8 : T == TensorType::Q5_0 ? 16 : 0;
template <TensorType T>
constexpr bool kIntAdds = T == TensorType::Q4_1 || T == TensorType::Q5_1 || T == TensorType::Q4_K ||
                          T == TensorType::Q5_K;
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

struct Int8Block {
  __m256i w;       // unsigned (<= 31) or, where kIntSigned, signed (|w| <= 128) bytes
  __m256i scales;  // Q6_K: the int16 multipliers of vpmaddwd (lanes 0-7 the first half's scale)
  float factor;
  float add;
};

template <TensorType T>
inline void load_int8_block(const uint8_t* row, int64_t b, Int8Block& k) {
  if constexpr (kSuperBlock<T>) {
    const uint8_t* super = row + (b >> 3) * kTypeBytes<T>;
    const int s = static_cast<int>(b & 7);
    k.w = k_quants<T>(super, s);
    if constexpr (T == TensorType::Q6_K) {
      const auto* sc = reinterpret_cast<const int8_t*>(super + 192);
      const int n = s / 4, j = s % 4;
      k.scales = _mm256_set_m128i(_mm_set1_epi16(sc[8 * n + 2 * j + 1]), _mm_set1_epi16(sc[8 * n + 2 * j]));
      k.factor = half_to_float(super + 208);
      k.add = 0.0f;
    } else {
      const KSubBlockScales sc = k_scales<T>(super, s);
      k.factor = sc.scale[0];
      k.add = -sc.offset;
    }
  } else {
    const uint8_t* blk = row + b * kTypeBytes<T>;
    k.factor = half_to_float(blk);
    k.add = 0.0f;
    if constexpr (T == TensorType::Q8_0) {
      k.w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
    } else if constexpr (T == TensorType::Q5_0) {
      k.w = q5_quants(blk + 2, blk + 6);
    } else if constexpr (T == TensorType::Q5_1) {
      k.w = q5_quants(blk + 4, blk + 8);
      k.add = half_to_float(blk + 2);
    } else {  // Q4_0, Q4_1
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (T == TensorType::Q4_1 ? 4 : 2)));
      k.w = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F));
      if constexpr (T == TensorType::Q4_1) k.add = half_to_float(blk + 2);
    }
  }
}

// The block's integer sum with 32 activations rounded to A, as 8 partial sums.
// int8: vpmaddubsw multiplies unsigned by signed bytes: signed weights go in as |w| with
// the activations' signs flipped where w < 0 (llama.cpp's trick). No pair saturates:
// |pair| <= 2 * 128 * 127 < 32768. int16 (kInt16Product types: unsigned w <= 31): the
// weights widened to int16, two vpmaddwd.
template <TensorType T, class A>
inline __m256i block_dot(const Int8Block& k, const A* xq) {
  if constexpr (sizeof(A) == 2) {
    static_assert(kInt16Product<T>, "int16 activations multiply unsigned <= 5-bit weights");
    const __m256i w0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(k.w));
    const __m256i w1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(k.w, 1));
    return _mm256_add_epi32(_mm256_madd_epi16(w0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq))),
                            _mm256_madd_epi16(w1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 16))));
  } else {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
    __m256i pairs;
    if constexpr (kIntSigned<T>) pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(k.w), _mm256_sign_epi8(x, k.w));
    else pairs = _mm256_maddubs_epi16(k.w, x);
    if constexpr (T == TensorType::Q6_K) return _mm256_madd_epi16(pairs, k.scales);
    else return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
  }
}

// One token, 8 rows per lane group: lane r of main and off is row r's. The products of a
// (row, token) pair take the same steps here and in int_tokens (factor * scale, one
// FMA per block; add * sum, one FMA per block; main + off), so a row is bit-identical
// alone or batched (Transformer::decode_step relies on it).
template <TensorType T, class A>
void int_rows(const uint8_t* base, int64_t row_bytes, int64_t blocks, const A* xq, const float* scale,
               const int32_t* qsum, const float* sum, float* y, int64_t out) {
  const int64_t groups = (out + 7) / 8;
#pragma omp parallel for schedule(static) if (out >= 64)
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* rows[8];
    for (int r = 0; r < 8; ++r) rows[r] = base + imin(g * 8 + r, out - 1) * row_bytes;
    const uint8_t* next = base + (g + 1) * 8 * row_bytes;  // the next group, prefetched a block's share at a time
    const int64_t share = 8 * row_bytes / blocks;
    __m256 main = _mm256_setzero_ps(), off = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      for (int64_t at = b * share; at < (b + 1) * share; at += 64)
        _mm_prefetch(reinterpret_cast<const char*>(next + at), _MM_HINT_T0);
      __m256i p[8];
      alignas(32) float factor[8], add[8];
      for (int r = 0; r < 8; ++r) {
        Int8Block k;
        load_int8_block<T>(rows[r], b, k);
        p[r] = block_dot<T>(k, xq + b * kBlock);
        factor[r] = k.factor;
        add[r] = k.add;
      }
      __m256i isum = reduce8_epi32(p);
      if constexpr (kIntBias<T> != 0) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(kIntBias<T> * qsum[b]));
      const __m256 fs = _mm256_mul_ps(_mm256_load_ps(factor), _mm256_broadcast_ss(scale + b));
      main = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), fs, main);
      if constexpr (kIntAdds<T>) off = _mm256_fmadd_ps(_mm256_load_ps(add), _mm256_broadcast_ss(sum + b), off);
    }
    alignas(32) float res[8];
    _mm256_store_ps(res, _mm256_add_ps(main, off));
    for (int64_t r = 0; r < 8 && g * 8 + r < out; ++r) y[g * 8 + r] = res[r];
  }
}

// One row per lane group, NT (2..8) tokens in the lanes. By block b: scale, sum and
// bias * qsum of token t at [b * 8 + t] (0 past NT).
template <TensorType T, class A, int NT>
void int_tokens(const uint8_t* base, int64_t row_bytes, int64_t blocks, const A* xq, int64_t in,
                 const float* scale_by_block, const float* sum_by_block, const int32_t* bias_by_block, float* y,
                 int64_t out) {
#pragma omp parallel for schedule(static) if (out >= 64)
  for (int64_t o = 0; o < out; ++o) {
    const uint8_t* row = base + o * row_bytes;
    const uint8_t* next = row + 4 * row_bytes;  // prefetched a block's share at a time
    __m256 main = _mm256_setzero_ps(), off = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
      if (b % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(next + b * row_bytes / blocks), _MM_HINT_T0);
      Int8Block k;
      load_int8_block<T>(row, b, k);
      __m256i p[8];
      for (int t = 0; t < 8; ++t) p[t] = t < NT ? block_dot<T>(k, xq + t * in + b * kBlock) : _mm256_setzero_si256();
      __m256i isum = reduce8_epi32(p);
      if constexpr (kIntBias<T> != 0)
        isum = _mm256_sub_epi32(isum, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias_by_block + b * 8)));
      const __m256 fs = _mm256_mul_ps(_mm256_set1_ps(k.factor), _mm256_loadu_ps(scale_by_block + b * 8));
      main = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), fs, main);
      if constexpr (kIntAdds<T>) off = _mm256_fmadd_ps(_mm256_set1_ps(k.add), _mm256_loadu_ps(sum_by_block + b * 8), off);
    }
    alignas(32) float res[8];
    _mm256_store_ps(res, _mm256_add_ps(main, off));
    for (int t = 0; t < NT; ++t) y[t * out + o] = res[t];
  }
}

// The product with activations rounded to A (int8_t: gemv_int8; int16_t: the default of
// the kInt16Product types) per block of 32.
template <TensorType T, class A>
void gemv_int_typed(const uint8_t* base, const float* x, float* y, int64_t n, int64_t in, int64_t out) {
  const int64_t blocks = in / kBlock;
  const int64_t row_bytes = in / kTypeElements<T> * kTypeBytes<T>;
  Scratch q_buf(static_cast<size_t>(n * in) * sizeof(A) + 64);
  Scratch f_buf(static_cast<size_t>(3 * n * blocks) * sizeof(float));
  A* q = q_buf.as<A>();
  float* scale = f_buf.as<float>();
  float* sum = scale + n * blocks;
  int32_t* qsum = reinterpret_cast<int32_t*>(sum + n * blocks);
  quantize_blocks(x, n, in, q, scale, qsum, sum);
  TokenBlocks by_block(blocks);
  float* scale_by_block = by_block.scale;
  float* sum_by_block = by_block.sum;
  int32_t* bias_by_block = by_block.bias_qsum;
  for (int64_t t0 = 0; t0 < n; t0 += kMaxTokens) {
    const int64_t nt = imin(kMaxTokens, n - t0);
    float* yt = y + t0 * out;
    const A* qt = q + t0 * in;
    if (nt == 1) {
      int_rows<T>(base, row_bytes, blocks, qt, scale + t0 * blocks, qsum + t0 * blocks, sum + t0 * blocks, yt, out);
      continue;
    }
    by_block.fill(scale, sum, qsum, kIntBias<T>, blocks, t0, nt);
    switch (nt) {
#define BS_INT_TOKENS(N)                                                                                        \
  case N:                                                                                                       \
    int_tokens<T, A, N>(base, row_bytes, blocks, qt, in, scale_by_block, sum_by_block, bias_by_block, yt, out); \
    break;
      BS_INT_TOKENS(2) BS_INT_TOKENS(3) BS_INT_TOKENS(4) BS_INT_TOKENS(5) BS_INT_TOKENS(6) BS_INT_TOKENS(7)
#undef BS_INT_TOKENS
      default: int_tokens<T, A, 8>(base, row_bytes, blocks, qt, in, scale_by_block, sum_by_block, bias_by_block, yt, out);
    }
  }
}
#endif

template <TensorType T>
void gemv_typed(const void* w, const float* x, float* y, int64_t n, int64_t in, int64_t out) {
  const auto* base = static_cast<const uint8_t*>(w);
#if BS_ISA_LEVEL >= 1
  if constexpr (kInt16Product<T>) return gemv_int_typed<T, int16_t>(base, x, y, n, in, out);
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

#if BS_ISA_LEVEL >= 1
void gemv_int8(TensorType type, const void* w, const float* x, float* y, int64_t n, int64_t in_features,
               int64_t out_features) {
  const auto* base = static_cast<const uint8_t*>(w);
  switch (type) {
    case TensorType::Q4_0: return gemv_int_typed<TensorType::Q4_0, int8_t>(base, x, y, n, in_features, out_features);
    case TensorType::Q4_1: return gemv_int_typed<TensorType::Q4_1, int8_t>(base, x, y, n, in_features, out_features);
    case TensorType::Q5_0: return gemv_int_typed<TensorType::Q5_0, int8_t>(base, x, y, n, in_features, out_features);
    case TensorType::Q5_1: return gemv_int_typed<TensorType::Q5_1, int8_t>(base, x, y, n, in_features, out_features);
    case TensorType::Q8_0: return gemv_int_typed<TensorType::Q8_0, int8_t>(base, x, y, n, in_features, out_features);
    case TensorType::Q4_K: return gemv_int_typed<TensorType::Q4_K, int8_t>(base, x, y, n, in_features, out_features);
    case TensorType::Q5_K: return gemv_int_typed<TensorType::Q5_K, int8_t>(base, x, y, n, in_features, out_features);
    case TensorType::Q6_K: return gemv_int_typed<TensorType::Q6_K, int8_t>(base, x, y, n, in_features, out_features);
    default: return gemv_quantized(type, w, x, y, n, in_features, out_features);  // F32, F16, BF16
  }
}
#endif

}  // namespace bs::kernels::cpu::BS_ISA_NS
