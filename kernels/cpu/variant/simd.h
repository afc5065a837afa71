// The SIMD vocabulary of the CPU kernel variants.
//
// Every source in kernels/cpu/variant/ is compiled once per ISA (kernels/CMakeLists.txt)
// with BS_ISA_NS naming the variant's namespace and BS_ISA_LEVEL its level:
//   0 scalar      baseline x86-64, 8-lane "vectors" of plain floats
//   1 avx2        AVX2 + FMA + F16C, __m256
//   2 avx512      AVX-512 F/BW/VL/DQ, __m512
//   3 avx512bf16  AVX-512 + BF16 dot products, __m512
// The kernels are written once against the small set of operations below.
//
// Why everything here lives in the variant namespace and nothing is shared: an inline
// function or template instantiated in a file compiled with AVX-512 flags is a weak
// symbol, and the linker may keep that copy for a baseline caller, which then dies
// with SIGILL on an AVX2 CPU. So variant code uses no STL, no inline code of other
// headers (C library calls such as expf are fine: they are not compiled here), and
// tools/ci/check_variant_symbols.sh fails the build if a variant object defines a weak
// symbol outside its own namespace.
#pragma once

#if !defined(BS_ISA_NS) || !defined(BS_ISA_LEVEL)
#error "kernels/cpu/variant sources are compiled per ISA with BS_ISA_NS and BS_ISA_LEVEL (kernels/CMakeLists.txt)"
#endif

// GCC 12 (bug 105593) reports -Wmaybe-uninitialized, or -Wuninitialized where it
// inlines further, inside the AVX-512 headers' own _mm512_undefined_* uses; the state at
// the header's lines decides, so the headers are included here, first, with those two
// warnings off.
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>
#pragma GCC diagnostic pop
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dequant.h"  // fp16_to_fp32: an out-of-line function, like expf
#include "kernels/kv_view.h"  // the struct only: its member and inline functions are not used here

namespace bs::kernels::cpu::BS_ISA_NS {

inline int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
inline float fmax2(float a, float b) { return a > b ? a : b; }

// A K/V row through a page table (kernels/kv_view.h, whose member functions are not
// called here: inline code of another header). Row of KV head h at position j, in
// elements of the view's dtype.
inline int64_t kv_row_offset(const KvView& kv, int64_t h, int64_t j) {
  return kv.pages[j >> kv.page_shift] * kv.page_stride + h * kv.head_stride +
         (j & ((int64_t{1} << kv.page_shift) - 1)) * kv.head_dim;
}
// Stored K/V element types (KvView::dtype), as distinct C++ types so that a kernel
// templated on the element picks its widening load by overload (vload_kv below).
struct KvF16 {
  uint16_t bits;
};
struct KvBf16 {
  uint16_t bits;
};
template <class E>
inline const E* kv_k_row(const KvView& kv, int64_t h, int64_t j) {
  return static_cast<const E*>(kv.k) + kv_row_offset(kv, h, j);
}
template <class E>
inline const E* kv_v_row(const KvView& kv, int64_t h, int64_t j) {
  return static_cast<const E*>(kv.v) + kv_row_offset(kv, h, j);
}

// Scratch memory owned by one call (no std::vector here: see the note above).
struct Scratch {
  void* p = nullptr;
  explicit Scratch(size_t bytes, bool zero = false) {
    p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (p && zero) memset(p, 0, (bytes + 63) / 64 * 64);
  }
  ~Scratch() { free(p); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class T>
  T* as() const { return static_cast<T*>(p); }
};

#if BS_ISA_LEVEL >= 2
// ---------------------------------------------------------------- AVX-512: 16 lanes
constexpr int kLanes = 16;
using vf = __m512;
inline vf vzero() { return _mm512_setzero_ps(); }
inline vf vset1(float x) { return _mm512_set1_ps(x); }
inline vf vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, vf v) { _mm512_storeu_ps(p, v); }
inline vf vadd(vf a, vf b) { return _mm512_add_ps(a, b); }
inline vf vsub(vf a, vf b) { return _mm512_sub_ps(a, b); }
inline vf vmul(vf a, vf b) { return _mm512_mul_ps(a, b); }
inline vf vdiv(vf a, vf b) { return _mm512_div_ps(a, b); }
inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }  // a*b + c
// kLanes stored K/V elements widened to fp32 (exact: every half is a float).
inline vf vload_kv(const float* p) { return vload(p); }
inline vf vload_kv(const KvF16* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline vf vload_kv(const KvBf16* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
// Lanes [0, count) of v, the others `fill`.
inline vf vkeep_first(vf v, int64_t count, float fill) {
  const __mmask16 m = count >= 16 ? static_cast<__mmask16>(0xFFFF)
                                  : static_cast<__mmask16>(count <= 0 ? 0u : (1u << count) - 1u);
  return _mm512_mask_blend_ps(m, _mm512_set1_ps(fill), v);
}
// Interleaved pairs (x0, x1, x2, x3, ...): dup_even (x0, x0, x2, x2 ...),
// dup_odd (x1, x1, x3, x3 ...), swap_pairs (x1, x0, x3, x2 ...).
inline vf vdup_even(vf v) { return _mm512_moveldup_ps(v); }
inline vf vdup_odd(vf v) { return _mm512_movehdup_ps(v); }
inline vf vswap_pairs(vf v) { return _mm512_permute_ps(v, 0xB1); }
// a*b - c in even lanes, a*b + c in odd lanes.
inline vf vfmaddsub(vf a, vf b, vf c) { return _mm512_fmaddsub_ps(a, b, c); }

// exp(x), relative error < 2e-7 over the range softmax and SiLU use; inputs below
// -87.3 flush to 0. Cody-Waite reduction x = n ln2 + r, degree-6 polynomial, 2^n.
inline vf vexp(vf x) {
  x = _mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f));
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3365478515625f), _CMP_LT_OQ);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflow), _mm512_scalef_ps(p, n));
}

// Horizontal sum / max (by hand: GCC 12's _mm512_reduce_* trip -Wmaybe-uninitialized).
inline float hsum(vf v) {
  const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}
// out[i] = the lane sum of a[i], i < 8 (8 dot products finished at once).
inline void hsum8(const vf* a, float* out) {
  __m256 h[8];
  for (int i = 0; i < 8; ++i)
    h[i] = _mm256_add_ps(_mm512_castps512_ps256(a[i]), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[i]), 1)));
  const __m256 h01 = _mm256_hadd_ps(h[0], h[1]), h23 = _mm256_hadd_ps(h[2], h[3]);
  const __m256 h45 = _mm256_hadd_ps(h[4], h[5]), h67 = _mm256_hadd_ps(h[6], h[7]);
  const __m256 h03 = _mm256_hadd_ps(h01, h23), h47 = _mm256_hadd_ps(h45, h67);
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(h03, h47, 0x20), _mm256_permute2f128_ps(h03, h47, 0x31)));
}
inline float hmax(vf v) {
  const __m256 a = _mm256_max_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 b = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  const __m128 c = _mm_max_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_max_ss(c, _mm_movehdup_ps(c)));
}

#elif BS_ISA_LEVEL == 1
// ---------------------------------------------------------------- AVX2 + FMA: 8 lanes
constexpr int kLanes = 8;
using vf = __m256;
inline vf vzero() { return _mm256_setzero_ps(); }
inline vf vset1(float x) { return _mm256_set1_ps(x); }
inline vf vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, vf v) { _mm256_storeu_ps(p, v); }
inline vf vadd(vf a, vf b) { return _mm256_add_ps(a, b); }
inline vf vsub(vf a, vf b) { return _mm256_sub_ps(a, b); }
inline vf vmul(vf a, vf b) { return _mm256_mul_ps(a, b); }
inline vf vdiv(vf a, vf b) { return _mm256_div_ps(a, b); }
inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
inline vf vload_kv(const float* p) { return vload(p); }
inline vf vload_kv(const KvF16* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline vf vload_kv(const KvBf16* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline vf vkeep_first(vf v, int64_t count, float fill) {
  const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 keep = _mm256_cmp_ps(lane, _mm256_set1_ps(static_cast<float>(imax(imin(count, 8), 0))), _CMP_LT_OQ);
  return _mm256_blendv_ps(_mm256_set1_ps(fill), v, keep);
}
inline vf vdup_even(vf v) { return _mm256_moveldup_ps(v); }
inline vf vdup_odd(vf v) { return _mm256_movehdup_ps(v); }
inline vf vswap_pairs(vf v) { return _mm256_permute_ps(v, 0xB1); }
inline vf vfmaddsub(vf a, vf b, vf c) { return _mm256_fmaddsub_ps(a, b, c); }

// exp(x) as in the AVX-512 variant; without scalef, 2^n is built in the exponent
// field, so inputs are capped at 88.0 (n <= 127): e^88 = 1.65e38 instead of +inf.
inline vf vexp(vf x) {
  x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
  const __m256 underflow = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3365478515625f), _CMP_LT_OQ);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(underflow, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

inline float hsum(vf v) {
  const __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_add_ss(c, _mm_movehdup_ps(c)));
}
// out[i] = the lane sum of a[i], i < 8 (8 dot products finished at once: pairwise
// horizontal adds, then the two 128-bit halves).
inline void hsum8(const vf* a, float* out) {
  const __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 h03 = _mm256_hadd_ps(h01, h23), h47 = _mm256_hadd_ps(h45, h67);
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(h03, h47, 0x20), _mm256_permute2f128_ps(h03, h47, 0x31)));
}
inline float hmax(vf v) {
  const __m128 b = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 c = _mm_max_ps(b, _mm_movehl_ps(b, b));
  return _mm_cvtss_f32(_mm_max_ss(c, _mm_movehdup_ps(c)));
}

#else
// ---------------------------------------------------------------- scalar: 8 plain lanes
// For CPUs without AVX2 (and as a second, independent check of the kernels' logic):
// correct, not fast; the compiler vectorizes what it can with SSE2.
constexpr int kLanes = 8;
struct vf {
  float x[8];
};
#define BS_LANEWISE(expr)             \
  vf r;                               \
  for (int i = 0; i < 8; ++i) r.x[i] = (expr); \
  return r
inline vf vzero() { BS_LANEWISE(0.0f); }
inline vf vset1(float v) { BS_LANEWISE(v); }
inline vf vload(const float* p) { BS_LANEWISE(p[i]); }
inline void vstore(float* p, vf v) { for (int i = 0; i < 8; ++i) p[i] = v.x[i]; }
inline vf vadd(vf a, vf b) { BS_LANEWISE(a.x[i] + b.x[i]); }
inline vf vsub(vf a, vf b) { BS_LANEWISE(a.x[i] - b.x[i]); }
inline vf vmul(vf a, vf b) { BS_LANEWISE(a.x[i] * b.x[i]); }
inline vf vdiv(vf a, vf b) { BS_LANEWISE(a.x[i] / b.x[i]); }
inline vf vmax(vf a, vf b) { BS_LANEWISE(a.x[i] > b.x[i] ? a.x[i] : b.x[i]); }
inline vf vfma(vf a, vf b, vf c) { BS_LANEWISE(fmaf(a.x[i], b.x[i], c.x[i])); }
inline vf vkeep_first(vf v, int64_t count, float fill) { BS_LANEWISE(i < count ? v.x[i] : fill); }
inline vf vdup_even(vf v) { BS_LANEWISE(v.x[i & ~1]); }
inline vf vdup_odd(vf v) { BS_LANEWISE(v.x[i | 1]); }
inline vf vswap_pairs(vf v) { BS_LANEWISE(v.x[i ^ 1]); }
inline vf vfmaddsub(vf a, vf b, vf c) { BS_LANEWISE((i & 1) ? fmaf(a.x[i], b.x[i], c.x[i]) : fmaf(a.x[i], b.x[i], -c.x[i])); }
inline vf vexp(vf v) { BS_LANEWISE(v.x[i] < -87.3365478515625f ? 0.0f : expf(v.x[i] < 88.0f ? v.x[i] : 88.0f)); }
inline float bf16_bits_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
inline vf vload_kv(const float* p) { return vload(p); }
inline vf vload_kv(const KvF16* p) { BS_LANEWISE(fp16_to_fp32(p[i].bits)); }
inline vf vload_kv(const KvBf16* p) { BS_LANEWISE(bf16_bits_to_float(p[i].bits)); }
#undef BS_LANEWISE
inline float hsum(vf v) {
  float s = 0.0f;
  for (int i = 0; i < 8; ++i) s += v.x[i];
  return s;
}
inline void hsum8(const vf* a, float* out) {
  for (int i = 0; i < 8; ++i) out[i] = hsum(a[i]);
}
inline float hmax(vf v) {
  float m = v.x[0];
  for (int i = 1; i < 8; ++i) m = fmax2(m, v.x[i]);
  return m;
}
#endif

// Row j of KV head h of K (k_side) or V as fp32: in place when the cache is fp32, else
// widened into tmp [head_dim]. head_dim is a multiple of kLanes (the backend checks).
inline const float* kv_row_f32(const KvView& kv, bool k_side, int64_t h, int64_t j, float* tmp) {
  const void* base = k_side ? kv.k : kv.v;
  const int64_t at = kv_row_offset(kv, h, j);
  if (kv.dtype == TensorType::F32) return static_cast<const float*>(base) + at;
  if (kv.dtype == TensorType::F16) {
    const KvF16* row = static_cast<const KvF16*>(base) + at;
    for (int64_t d = 0; d < kv.head_dim; d += kLanes) vstore(tmp + d, vload_kv(row + d));
  } else {
    const KvBf16* row = static_cast<const KvBf16*>(base) + at;
    for (int64_t d = 0; d < kv.head_dim; d += kLanes) vstore(tmp + d, vload_kv(row + d));
  }
  return tmp;
}

}  // namespace bs::kernels::cpu::BS_ISA_NS
