#include "kernels/cpu/simd_math.h"  // first: see the note there
#include "kernels/cpu/ops.h"

namespace bs::kernels::cpu {

void rope(float* x, const float* cos_sin, int64_t n, int64_t heads, int64_t head_dim, RopeStyle style) {
  const int64_t half = head_dim / 2;
#pragma omp parallel for schedule(static) if (n >= 32)
  for (int64_t t = 0; t < n; ++t) {
    const float* cs = cos_sin + t * half * 2;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (t * heads + h) * head_dim;
      if (style == RopeStyle::Interleaved) {
        // pairs (2i, 2i+1): the (cos, sin) table has the same interleaving as v
        int64_t i = 0;
        for (; i + 8 <= half; i += 8) {
          const __m512 xv = _mm512_loadu_ps(v + 2 * i);
          const __m512 c_s = _mm512_loadu_ps(cs + 2 * i);
          const __m512 c = _mm512_moveldup_ps(c_s);       // cos cos ...
          const __m512 s = _mm512_movehdup_ps(c_s);       // sin sin ...
          const __m512 swapped = _mm512_permute_ps(xv, 0xB1);  // x1 x0 ...
          // even: x0 c - x1 s ; odd: x1 c + x0 s
          const __m512 t1 = _mm512_mul_ps(swapped, s);
          _mm512_storeu_ps(v + 2 * i, _mm512_fmaddsub_ps(xv, c, t1));
        }
        for (; i < half; ++i) {
          const float x0 = v[2 * i], x1 = v[2 * i + 1], c = cs[2 * i], s = cs[2 * i + 1];
          v[2 * i] = x0 * c - x1 * s;
          v[2 * i + 1] = x0 * s + x1 * c;
        }
      } else {
        for (int64_t i = 0; i < half; ++i) {
          const float x0 = v[i], x1 = v[i + half], c = cs[2 * i], s = cs[2 * i + 1];
          v[i] = x0 * c - x1 * s;
          v[i + half] = x0 * s + x1 * c;
        }
      }
    }
  }
}

}  // namespace bs::kernels::cpu
