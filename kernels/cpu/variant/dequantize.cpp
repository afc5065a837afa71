// Stored rows to fp32 or bf16 for the prefill GEMM's chunks (kernels/cpu/gemm_onednn.cpp
// dequantizes every quantized weight on every prefill, so this runs at memory speed or
// the prefill pays for it). Each block is unpacked into 32 (or 16) small integers and one
// scale and offset, in loops of fixed length the compiler vectorizes in this variant's
// ISA; the values equal kernels/dequant.h's dequantize_row bit for bit (this file is
// compiled with -ffp-contract=off: q * d + m is two roundings there too), and the bf16
// ones its fp32 values rounded as fp32_to_bf16 rounds them.
#include "kernels/cpu/variant/simd.h"  // first: see the note there
#include "kernels/cpu/variant/variant_ops.h"

#include <cstring>

#include "kernels/dequant.h"

namespace bs::kernels::cpu::BS_ISA_NS {
namespace {

inline float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if BS_ISA_LEVEL >= 1
  return _cvtsh_ss(h);
#else
  return fp16_to_fp32(h);  // a call into the baseline library: no inline code shared
#endif
}

#if BS_ISA_LEVEL < 2
inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
#endif

// dst[0..len) = q[e] * scale (+ add where Add), as fp32 or rounded to bf16 (to nearest
// even in integers: the hardware conversion would flush denormals).
template <bool Add, int Len>
inline void emit(const int8_t* q, float scale, float add, void* dst, bool bf16) {
#if BS_ISA_LEVEL >= 2
  const __m512 vs = _mm512_set1_ps(scale), va = _mm512_set1_ps(add);
  for (int h = 0; h < Len; h += 16) {
    __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + h))));
    f = _mm512_mul_ps(f, vs);
    if (Add) f = _mm512_add_ps(f, va);
    if (!bf16) {
      _mm512_storeu_ps(static_cast<float*>(dst) + h, f);
      continue;
    }
    const __m512i u = _mm512_castps_si512(f);
    const __m512i high = _mm512_srli_epi32(u, 16);
    const __m512i bias = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), _mm512_and_si512(high, _mm512_set1_epi32(1)));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    const __m512i out = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(high, _mm512_set1_epi32(0x40)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(dst) + h), _mm512_cvtepi32_epi16(out));
  }
#else
  float y[Len];
#if BS_ISA_LEVEL == 1
  const __m256 vs = _mm256_set1_ps(scale), va = _mm256_set1_ps(add);
  for (int h = 0; h < Len; h += 8) {
    __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + h))));
    f = _mm256_mul_ps(f, vs);
    if (Add) f = _mm256_add_ps(f, va);
    _mm256_storeu_ps(y + h, f);
  }
#else
  for (int e = 0; e < Len; ++e) {
    const float p = static_cast<float>(q[e]) * scale;
    y[e] = Add ? p + add : p;
  }
#endif
  if (!bf16) {
    std::memcpy(dst, y, sizeof y);
    return;
  }
  // bf16 (AVX2 and the scalar variant run the GEMMs in fp32: rarely taken).
  uint16_t out[Len];
  for (int e = 0; e < Len; ++e) {
    const uint32_t u = f32_bits(y[e]);
    const uint32_t rounded = (u + (0x7fffu + ((u >> 16) & 1u))) >> 16;
    const uint32_t nan = (u >> 16) | 0x0040u;  // NaN: truncated, quiet bit forced
    out[e] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
  std::memcpy(dst, out, sizeof out);
#endif
}

// The 32 quants of a 32-element block: the 16 bytes' low nibbles, then their high ones
// (Q4_1 / Q5_1 / Q4_K / Q5_K values are at most 31: int8 holds them).
#if BS_ISA_LEVEL >= 1
inline __m256i nibbles32(const uint8_t* qs) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m));
}
// Byte j is 0xff where bit j of x is set (ggml's bytes_from_bits_32).
inline __m256i bits_to_bytes(uint32_t x) {
  const __m256i shuffle = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202,
                                             0x0303030303030303);
  const __m256i v = _mm256_or_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x)), shuffle),
                                    _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_cmpeq_epi8(v, _mm256_set1_epi64x(-1));
}
#endif

template <int Bias>  // Q4_0: 8; Q4_1: none
void q4(const uint8_t* __restrict qs, int8_t* __restrict q) {
#if BS_ISA_LEVEL >= 1
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_sub_epi8(nibbles32(qs), _mm256_set1_epi8(Bias)));
#else
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>((qs[j] & 0x0f) - Bias);
    q[j + 16] = static_cast<int8_t>((qs[j] >> 4) - Bias);
  }
#endif
}
template <int Qs, int Bias>  // Q5_0: qs at 6, bias 16; Q5_1: qs at 8, none
void q5(const uint8_t* __restrict b, int8_t* __restrict q) {
  uint32_t qh;
  std::memcpy(&qh, b + Qs - 4, 4);
#if BS_ISA_LEVEL >= 1
  const __m256i high = _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_sub_epi8(_mm256_or_si256(nibbles32(b + Qs), high), _mm256_set1_epi8(Bias)));
#else
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>(static_cast<int>((b[Qs + j] & 0x0f) | (((qh >> j) & 1u) << 4)) - Bias);
    q[j + 16] = static_cast<int8_t>(static_cast<int>((b[Qs + j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - Bias);
  }
#endif
}

// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j from scales[12].
inline void scale_min_k4(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// One super-block of 256 of Q4_K (Five: Q5_K) into dst (element size esize).
template <bool Five>
void k45_block(const uint8_t* b, uint8_t* dst, int64_t esize, bool bf16) {
  const float d = half(b), dmin = half(b + 2);
  const uint8_t* qs = b + (Five ? 48 : 16);
  const uint8_t* qh = b + 16;
  int8_t q[32];
  for (int s = 0; s < 8; ++s) {
    int sc, m;
    scale_min_k4(s, b + 4, &sc, &m);
    const uint8_t* src = qs + 32 * (s / 2);
    const int shift = (s % 2) * 4;
    for (int l = 0; l < 32; ++l) {
      int v = (src[l] >> shift) & 0xF;
      if (Five) v |= ((qh[l] >> s) & 1) << 4;
      q[l] = static_cast<int8_t>(v);
    }
    emit<true, 32>(q, d * static_cast<float>(sc), -(dmin * static_cast<float>(m)), dst + s * 32 * esize, bf16);
  }
}

void q6k_block(const uint8_t* b, uint8_t* dst, int64_t esize, bool bf16) {
  const float d = half(b + 208);
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  int8_t q[32];
  for (int s = 0; s < 8; ++s) {
    const int n = s / 4, k = s % 4;
    const uint8_t* ql = b + 64 * n + (k & 1) * 32;
    const uint8_t* qh = b + 128 + 32 * n;
    const int lo_shift = k >= 2 ? 4 : 0;
    for (int l = 0; l < 32; ++l) {
      const int lo = (ql[l] >> lo_shift) & 0xF;
      const int hi = (qh[l] >> (2 * k)) & 3;
      q[l] = static_cast<int8_t>((lo | (hi << 4)) - 32);
    }
    uint8_t* out = dst + s * 32 * esize;
    emit<false, 16>(q, d * static_cast<float>(scales[8 * n + 2 * k]), 0.0f, out, bf16);
    emit<false, 16>(q + 16, d * static_cast<float>(scales[8 * n + 2 * k + 1]), 0.0f, out + 16 * esize, bf16);
  }
}

}  // namespace

bool dequantize_row_fast(TensorType type, const void* src, void* dst, int64_t n, bool bf16) {
  const auto* b = static_cast<const uint8_t*>(src);
  auto* out = static_cast<uint8_t*>(dst);
  const int64_t esize = bf16 ? 2 : 4;
  int8_t q[32];
  switch (type) {
    case TensorType::Q4_0:
      for (int64_t i = 0; i < n / 32; ++i, b += 18) {
        q4<8>(b + 2, q);
        emit<false, 32>(q, half(b), 0.0f, out + i * 32 * esize, bf16);
      }
      return true;
    case TensorType::Q4_1:
      for (int64_t i = 0; i < n / 32; ++i, b += 20) {
        q4<0>(b + 4, q);
        emit<true, 32>(q, half(b), half(b + 2), out + i * 32 * esize, bf16);
      }
      return true;
    case TensorType::Q5_0:
      for (int64_t i = 0; i < n / 32; ++i, b += 22) {
        q5<6, 16>(b, q);
        emit<false, 32>(q, half(b), 0.0f, out + i * 32 * esize, bf16);
      }
      return true;
    case TensorType::Q5_1:
      for (int64_t i = 0; i < n / 32; ++i, b += 24) {
        q5<8, 0>(b, q);
        emit<true, 32>(q, half(b), half(b + 2), out + i * 32 * esize, bf16);
      }
      return true;
    case TensorType::Q8_0:
      for (int64_t i = 0; i < n / 32; ++i, b += 34)
        emit<false, 32>(reinterpret_cast<const int8_t*>(b + 2), half(b), 0.0f, out + i * 32 * esize, bf16);
      return true;
    case TensorType::Q4_K:
      for (int64_t i = 0; i < n / 256; ++i, b += 144) k45_block<false>(b, out + i * 256 * esize, esize, bf16);
      return true;
    case TensorType::Q5_K:
      for (int64_t i = 0; i < n / 256; ++i, b += 176) k45_block<true>(b, out + i * 256 * esize, esize, bf16);
      return true;
    case TensorType::Q6_K:
      for (int64_t i = 0; i < n / 256; ++i, b += 210) q6k_block(b, out + i * 256 * esize, esize, bf16);
      return true;
    default:
      return false;  // F32, F16, BF16: the baseline conversions
  }
}

}  // namespace bs::kernels::cpu::BS_ISA_NS
