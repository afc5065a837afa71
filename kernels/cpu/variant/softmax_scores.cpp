// One query head's softmax numerators over keys held transposed (Backend::attention_mass
// on the CPU): the dot products run across keys, a vector of keys per FMA, so the
// question's rows reading a 6k-token prompt at every check layer stay a small part of
// the blend's time.
#include "kernels/cpu/variant/simd.h"  // first: see the note there
#include "kernels/cpu/variant/variant_ops.h"

namespace bs::kernels::cpu::BS_ISA_NS {

float softmax_exps(const float* q, const float* kt, int64_t stride, int64_t head_dim, int64_t count, float scale,
                   float* e) {
  constexpr int64_t kBlock = 4 * kLanes;  // four accumulators in flight
  const vf vscale = vset1(scale);
  vf vmx = vset1(-3.402823466e38f);
  float mx = -3.402823466e38f;
  int64_t j = 0;
  for (; j + kBlock <= count; j += kBlock) {
    vf a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
    for (int64_t d = 0; d < head_dim; ++d) {
      const vf qd = vset1(q[d]);
      const float* row = kt + d * stride + j;
      a0 = vfma(qd, vload(row), a0);
      a1 = vfma(qd, vload(row + kLanes), a1);
      a2 = vfma(qd, vload(row + 2 * kLanes), a2);
      a3 = vfma(qd, vload(row + 3 * kLanes), a3);
    }
    a0 = vmul(a0, vscale), a1 = vmul(a1, vscale), a2 = vmul(a2, vscale), a3 = vmul(a3, vscale);
    vstore(e + j, a0);
    vstore(e + j + kLanes, a1);
    vstore(e + j + 2 * kLanes, a2);
    vstore(e + j + 3 * kLanes, a3);
    vmx = vmax(vmx, vmax(vmax(a0, a1), vmax(a2, a3)));
  }
  for (; j < count; ++j) {
    float s = 0.0f;
    for (int64_t d = 0; d < head_dim; ++d) s += q[d] * kt[d * stride + j];
    e[j] = s * scale;
    mx = fmax2(mx, e[j]);
  }
  // The lanes reduced through memory: GCC 12 warns (-Wuninitialized, bug 105593) in
  // the AVX-512 headers' extract used by hmax/hsum as inlined here.
  float lanes[kLanes];
  vstore(lanes, vmx);
  for (int l = 0; l < kLanes; ++l) mx = fmax2(mx, lanes[l]);
  const vf vm = vset1(mx);
  vf vsum = vzero();
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    const vf x = vexp(vsub(vload(e + i), vm));
    vstore(e + i, x);
    vsum = vadd(vsum, x);
  }
  float sum = 0.0f;
  for (; i < count; ++i) sum += (e[i] = expf(e[i] - mx));
  vstore(lanes, vsum);
  for (int l = 0; l < kLanes; ++l) sum += lanes[l];
  return sum;
}

}  // namespace bs::kernels::cpu::BS_ISA_NS
