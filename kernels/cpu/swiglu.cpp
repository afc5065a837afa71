#include "kernels/cpu/simd_math.h"  // first: see the note there
#include <cmath>

#include "kernels/cpu/ops.h"

namespace bs::kernels::cpu {

void swiglu(const float* gate_up, float* out, int64_t n, int64_t ff) {
  const int64_t vec_end = ff & ~int64_t{15};
#pragma omp parallel for schedule(static) if (n >= 8)
  for (int64_t t = 0; t < n; ++t) {
    const float* gate = gate_up + t * 2 * ff;
    const float* up = gate + ff;
    float* o = out + t * ff;
    int64_t i = 0;
    for (; i < vec_end; i += 16) {
      const __m512 g = _mm512_loadu_ps(gate + i);
      // silu(g) = g / (1 + e^-g)
      const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
      const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
      _mm512_storeu_ps(o + i, _mm512_mul_ps(silu, _mm512_loadu_ps(up + i)));
    }
    for (; i < ff; ++i) o[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  }
}

}  // namespace bs::kernels::cpu
