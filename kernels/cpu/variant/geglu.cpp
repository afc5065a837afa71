// GeGLU (Gemma's feed-forward): out = gelu_tanh(gate) * up, gate and up side by side
// in one row, with GELU's tanh approximation as kernels/op_math.h's gelu_tanh_mul.
// tanh(z) is computed as 1 - 2 / (e^{2z} + 1) on the variant's vector exp (within fp32
// rounding of tanhf; a saturated e^{2z} gives 1, one underflowing to 0 gives -1).
#include "kernels/cpu/variant/simd.h"  // first: see the note there
#include "kernels/cpu/variant/variant_ops.h"

namespace bs::kernels::cpu::BS_ISA_NS {

void geglu(const float* gate_up, float* out, int64_t n, int64_t ff) {
  const int64_t vec_end = ff / kLanes * kLanes;
  constexpr float kSqrt2OverPi = 0.7978845608028654f, kCubic = 0.044715f;
#pragma omp parallel for schedule(static) if (n >= 8)
  for (int64_t t = 0; t < n; ++t) {
    const float* gate = gate_up + t * 2 * ff;
    const float* up = gate + ff;
    float* o = out + t * ff;
    int64_t i = 0;
    for (; i < vec_end; i += kLanes) {
      const vf g = vload(gate + i);
      const vf inner = vmul(vset1(kSqrt2OverPi), vfma(vmul(vset1(kCubic), vmul(g, g)), g, g));
      const vf e2 = vexp(vadd(inner, inner));
      const vf tanh = vsub(vset1(1.0f), vdiv(vset1(2.0f), vadd(e2, vset1(1.0f))));
      const vf gelu = vmul(vmul(vset1(0.5f), g), vadd(vset1(1.0f), tanh));
      vstore(o + i, vmul(gelu, vload(up + i)));
    }
    for (; i < ff; ++i) {
      const float g = gate[i], inner = kSqrt2OverPi * (g + kCubic * g * g * g);
      o[i] = 0.5f * g * (1.0f + tanhf(inner)) * up[i];
    }
  }
}

}  // namespace bs::kernels::cpu::BS_ISA_NS
