// Rotary embedding with a precomputed (cos, sin) table per row.
#include "kernels/cpu/variant/simd.h"  // first: see the note there
#include "kernels/cpu/variant/variant_ops.h"

namespace bs::kernels::cpu::BS_ISA_NS {

void rope(float* x, const float* cos_sin, int64_t n, int64_t heads, int64_t head_dim, RopeStyle style) {
  const int64_t half = head_dim / 2;
  constexpr int64_t kPairs = kLanes / 2;  // dimension pairs per vector
#pragma omp parallel for schedule(static) if (n >= 32)
  for (int64_t t = 0; t < n; ++t) {
    const float* cs = cos_sin + t * half * 2;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (t * heads + h) * head_dim;
      if (style == RopeStyle::Interleaved) {
        // pairs (2i, 2i+1): the (cos, sin) table has the same interleaving as v
        int64_t i = 0;
        for (; i + kPairs <= half; i += kPairs) {
          const vf xv = vload(v + 2 * i);
          const vf c_s = vload(cs + 2 * i);
          // even: x0 c - x1 s ; odd: x1 c + x0 s
          const vf t1 = vmul(vswap_pairs(xv), vdup_odd(c_s));
          vstore(v + 2 * i, vfmaddsub(xv, vdup_even(c_s), t1));
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

}  // namespace bs::kernels::cpu::BS_ISA_NS
