// RMSNorm: out = x / sqrt(mean(x^2) + eps) * weight, one row per token.
#include "kernels/cpu/variant/simd.h"  // first: see the note there
#include "kernels/cpu/variant/variant_ops.h"

namespace bs::kernels::cpu::BS_ISA_NS {

void rmsnorm(const float* x, const float* weight, float* out, int64_t n, int64_t dim, float eps) {
  const int64_t vec_end = dim / kLanes * kLanes;
#pragma omp parallel for schedule(static) if (n >= 16)
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * dim;
    float* yr = out + t * dim;
    vf acc = vzero();
    int64_t i = 0;
    for (; i < vec_end; i += kLanes) {
      const vf v = vload(xr + i);
      acc = vfma(v, v, acc);
    }
    float ss = hsum(acc);
    for (; i < dim; ++i) ss += xr[i] * xr[i];
    const float scale = 1.0f / sqrtf(ss / static_cast<float>(dim) + eps);
    const vf vs = vset1(scale);
    for (i = 0; i < vec_end; i += kLanes) vstore(yr + i, vmul(vmul(vload(xr + i), vs), vload(weight + i)));
    for (; i < dim; ++i) yr[i] = xr[i] * scale * weight[i];
  }
}

}  // namespace bs::kernels::cpu::BS_ISA_NS
