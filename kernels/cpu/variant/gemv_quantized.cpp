// Decode-size products read the stored weights (Q4_0/Q4_1/Q8_0/F16/BF16/F32)
// directly: decode is memory-bound, and 4/8-bit rows are 4-8x fewer bytes than
// bf16. Each 32-element block is expanded to fp32 in registers and multiplied
// with fp32 activations (no activation quantization, so no extra error).
#include "kernels/cpu/variant/simd.h"  // first: see the note there
#include "kernels/cpu/variant/variant_ops.h"
#include "kernels/dequant.h"

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

// Expand one block of 32 weights into kBlockVecs vectors (elements in order).
template <TensorType T>
inline void load_block(const uint8_t* blk, vf* w) {
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
  else if constexpr (T == TensorType::Q8_0) dequantize_q8_0(blk, tmp, kBlock);
  else if constexpr (T == TensorType::F32) dequantize_f32(blk, tmp, kBlock);
  else if constexpr (T == TensorType::F16) dequantize_f16(blk, tmp, kBlock);
  else dequantize_bf16(blk, tmp, kBlock);
  for (int i = 0; i < kBlockVecs; ++i) w[i] = vload(tmp + i * kLanes);
#endif
}

template <TensorType T>
void gemv_typed(const void* w, const float* x, float* y, int64_t n, int64_t in, int64_t out) {
  const int64_t blocks = in / kBlock;
  const int64_t bbytes = T == TensorType::Q4_1 ? 20 : T == TensorType::Q4_0 ? 18 : T == TensorType::Q8_0 ? 34
                         : T == TensorType::F32 ? 128 : 64;
  const int64_t row_bytes = blocks * bbytes;
  const auto* base = static_cast<const uint8_t*>(w);
  for (int64_t t0 = 0; t0 < n; t0 += kMaxTokens) {
    const int nt = static_cast<int>(imin(kMaxTokens, n - t0));
#pragma omp parallel for schedule(static) if (out >= 64)
    for (int64_t o = 0; o < out; ++o) {
      const uint8_t* row = base + o * row_bytes;
      vf acc[kMaxTokens];
      for (int t = 0; t < nt; ++t) acc[t] = vzero();
      for (int64_t b = 0; b < blocks; ++b) {
        vf wv[kBlockVecs];
        load_block<T>(row + b * bbytes, wv);
        for (int t = 0; t < nt; ++t) {
          const float* xb = x + (t0 + t) * in + b * kBlock;
          for (int i = 0; i < kBlockVecs; ++i) acc[t] = vfma(wv[i], vload(xb + i * kLanes), acc[t]);
        }
      }
      for (int t = 0; t < nt; ++t) y[(t0 + t) * out + o] = hsum(acc[t]);
    }
  }
}

}  // namespace

void gemv_quantized(TensorType type, const void* w, const float* x, float* y, int64_t n, int64_t in_features,
                    int64_t out_features) {
  switch (type) {
    case TensorType::Q4_0: return gemv_typed<TensorType::Q4_0>(w, x, y, n, in_features, out_features);
    case TensorType::Q4_1: return gemv_typed<TensorType::Q4_1>(w, x, y, n, in_features, out_features);
    case TensorType::Q8_0: return gemv_typed<TensorType::Q8_0>(w, x, y, n, in_features, out_features);
    case TensorType::F32: return gemv_typed<TensorType::F32>(w, x, y, n, in_features, out_features);
    case TensorType::F16: return gemv_typed<TensorType::F16>(w, x, y, n, in_features, out_features);
    case TensorType::BF16: return gemv_typed<TensorType::BF16>(w, x, y, n, in_features, out_features);
  }
}

}  // namespace bs::kernels::cpu::BS_ISA_NS
