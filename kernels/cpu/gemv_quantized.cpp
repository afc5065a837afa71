// Decode-size products read the stored weights (Q4_0/Q4_1/Q8_0/F16/BF16/F32)
// directly: decode is memory-bound, and 4/8-bit rows are 4-8x fewer bytes than
// bf16. Each 32-element block is expanded to fp32 in registers and multiplied
// with fp32 activations (no activation quantization, so no extra error).
#include "kernels/cpu/simd_math.h"  // first: see the note there
#include <cstring>
#include <stdexcept>

#include "kernels/cpu/ops.h"
#include "kernels/dequant.h"

namespace bs::kernels::cpu {
namespace {

constexpr int kMaxTokens = 8;

inline float half_to_float(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Expand one block of 32 weights into two vectors (elements 0..15 and 16..31).
template <WeightType T>
inline void load_block(const uint8_t* blk, __m512& w0, __m512& w1) {
  if constexpr (T == WeightType::Q4_1 || T == WeightType::Q4_0) {
    const float d = half_to_float(blk);
    const uint8_t* qs = blk + (T == WeightType::Q4_1 ? 4 : 2);
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(raw, mask)));
    const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(raw, 4), mask)));
    const __m512 vd = _mm512_set1_ps(d);
    if constexpr (T == WeightType::Q4_1) {
      const __m512 vm = _mm512_set1_ps(half_to_float(blk + 2));
      w0 = _mm512_fmadd_ps(lo, vd, vm);
      w1 = _mm512_fmadd_ps(hi, vd, vm);
    } else {
      const __m512 eight = _mm512_set1_ps(8.0f);
      w0 = _mm512_mul_ps(_mm512_sub_ps(lo, eight), vd);
      w1 = _mm512_mul_ps(_mm512_sub_ps(hi, eight), vd);
    }
  } else if constexpr (T == WeightType::Q8_0) {
    const __m512 vd = _mm512_set1_ps(half_to_float(blk));
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18));
    w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), vd);
    w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), vd);
  } else if constexpr (T == WeightType::F32) {
    w0 = _mm512_loadu_ps(reinterpret_cast<const float*>(blk));
    w1 = _mm512_loadu_ps(reinterpret_cast<const float*>(blk) + 16);
  } else if constexpr (T == WeightType::F16) {
    w0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    w1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
  } else {  // BF16: shift into the upper half of a float
    const __m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
    const __m512i b = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
    w0 = _mm512_castsi512_ps(_mm512_slli_epi32(a, 16));
    w1 = _mm512_castsi512_ps(_mm512_slli_epi32(b, 16));
  }
}

template <WeightType T>
void gemv_typed(const WeightView& w, const float* x, float* y, int64_t n) {
  const auto type = static_cast<uint32_t>(T);
  const int64_t in = w.in_features, out = w.out_features;
  const int64_t blocks = in / 32;
  const int64_t bbytes = type_block_bytes(type) * (32 / type_block_elements(type));
  const int64_t row_bytes = blocks * bbytes;
  const auto* base = static_cast<const uint8_t*>(w.data);
  for (int64_t t0 = 0; t0 < n; t0 += kMaxTokens) {
    const int nt = static_cast<int>(std::min<int64_t>(kMaxTokens, n - t0));
#pragma omp parallel for schedule(static) if (out >= 64)
    for (int64_t o = 0; o < out; ++o) {
      const uint8_t* row = base + o * row_bytes;
      __m512 acc[kMaxTokens];
      for (int t = 0; t < nt; ++t) acc[t] = _mm512_setzero_ps();
      for (int64_t b = 0; b < blocks; ++b) {
        __m512 w0, w1;
        load_block<T>(row + b * bbytes, w0, w1);
        for (int t = 0; t < nt; ++t) {
          const float* xb = x + (t0 + t) * in + b * 32;
          acc[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xb), acc[t]);
          acc[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xb + 16), acc[t]);
        }
      }
      for (int t = 0; t < nt; ++t) y[(t0 + t) * out + o] = hsum512(acc[t]);
    }
  }
}

}  // namespace

void gemv_quantized(const WeightView& w, const float* x, float* y, int64_t n) {
  if (w.in_features % 32 != 0) throw std::invalid_argument("gemv_quantized: in_features must be a multiple of 32");
  switch (w.type) {
    case WeightType::Q4_0: return gemv_typed<WeightType::Q4_0>(w, x, y, n);
    case WeightType::Q4_1: return gemv_typed<WeightType::Q4_1>(w, x, y, n);
    case WeightType::Q8_0: return gemv_typed<WeightType::Q8_0>(w, x, y, n);
    case WeightType::F32: return gemv_typed<WeightType::F32>(w, x, y, n);
    case WeightType::F16: return gemv_typed<WeightType::F16>(w, x, y, n);
    case WeightType::BF16: return gemv_typed<WeightType::BF16>(w, x, y, n);
  }
  throw std::invalid_argument("gemv_quantized: unsupported weight type");
}

}  // namespace bs::kernels::cpu
