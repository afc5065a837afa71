#include "kernels/cpu/simd_math.h"  // first: see the note there
#include <cmath>

#include "kernels/cpu/ops.h"

namespace bs::kernels::cpu {

void rmsnorm(const float* x, const float* weight, float* out, int64_t n, int64_t dim, float eps) {
  const int64_t vec_end = dim & ~int64_t{15};
#pragma omp parallel for schedule(static) if (n >= 16)
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * dim;
    float* yr = out + t * dim;
    __m512 acc = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i < vec_end; i += 16) {
      const __m512 v = _mm512_loadu_ps(xr + i);
      acc = _mm512_fmadd_ps(v, v, acc);
    }
    float ss = hsum512(acc);
    for (; i < dim; ++i) ss += xr[i] * xr[i];
    const float scale = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    const __m512 vs = _mm512_set1_ps(scale);
    for (i = 0; i < vec_end; i += 16)
      _mm512_storeu_ps(yr + i, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(xr + i), vs), _mm512_loadu_ps(weight + i)));
    for (; i < dim; ++i) yr[i] = xr[i] * scale * weight[i];
  }
}

}  // namespace bs::kernels::cpu
