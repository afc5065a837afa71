// SwiGLU: out = silu(gate) * up, gate and up side by side in one row.
#include "kernels/cpu/variant/simd.h"  // first: see the note there
#include "kernels/cpu/variant/variant_ops.h"

namespace bs::kernels::cpu::BS_ISA_NS {

void swiglu(const float* gate_up, float* out, int64_t n, int64_t ff) {
  const int64_t vec_end = ff / kLanes * kLanes;
#pragma omp parallel for schedule(static) if (n >= 8)
  for (int64_t t = 0; t < n; ++t) {
    const float* gate = gate_up + t * 2 * ff;
    const float* up = gate + ff;
    float* o = out + t * ff;
    int64_t i = 0;
    for (; i < vec_end; i += kLanes) {
      const vf g = vload(gate + i);
      // silu(g) = g / (1 + e^-g)
      const vf silu = vdiv(g, vadd(vset1(1.0f), vexp(vsub(vzero(), g))));
      vstore(o + i, vmul(silu, vload(up + i)));
    }
    for (; i < ff; ++i) o[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
  }
}

}  // namespace bs::kernels::cpu::BS_ISA_NS
