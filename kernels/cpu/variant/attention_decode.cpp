// Attention for a handful of query tokens (decode steps): reads the cache rows as
// they are, fp32, one query head per work item. The tiled kernel re-layouts K per
// call, which costs as much as the whole product when there is one query.
#include "kernels/cpu/variant/simd.h"  // first: see the note there
#include <omp.h>

#include "kernels/cpu/variant/variant_ops.h"

namespace bs::kernels::cpu::BS_ISA_NS {

void attention_decode(const float* q, const int32_t* qpos, const float* k, const float* v, float* out, int64_t n,
                      int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t n_kv, int64_t kv_stride,
                      float scale) {
  constexpr int kMaxDimVecs = 256 / kLanes;
  const int64_t group = q_heads / kv_heads;
  const int64_t dvecs = head_dim / kLanes;
  // Scores of one (token, head) at a time, one row per thread.
  const int64_t stride = (n_kv + 15) / 16 * 16;
  Scratch scores_buf(static_cast<size_t>(omp_get_max_threads() * stride) * sizeof(float));
#pragma omp parallel
  {
    float* scores = scores_buf.as<float>() + omp_get_thread_num() * stride;
#pragma omp for schedule(static) collapse(2)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < q_heads; ++h) {
        const float* qv = q + (t * q_heads + h) * head_dim;
        const float* kh = k + (h / group) * kv_stride * head_dim;
        const float* vh = v + (h / group) * kv_stride * head_dim;
        float* o = out + (t * q_heads + h) * head_dim;
        const int64_t count = imin(n_kv, static_cast<int64_t>(qpos[t]) + 1);
        if (count <= 0) {
          memset(o, 0, sizeof(float) * head_dim);
          continue;
        }
        vf qr[kMaxDimVecs];
        for (int64_t c = 0; c < dvecs; ++c) qr[c] = vload(qv + c * kLanes);
        float mx = -INFINITY;
        for (int64_t j = 0; j < count; ++j) {
          const float* kr = kh + j * head_dim;
          vf acc = vmul(qr[0], vload(kr));
          for (int64_t c = 1; c < dvecs; ++c) acc = vfma(qr[c], vload(kr + c * kLanes), acc);
          scores[j] = hsum(acc) * scale;
          mx = fmax2(mx, scores[j]);
        }
        // softmax numerators, a vector at a time
        const vf vmx = vset1(mx);
        vf vsum = vzero();
        int64_t j = 0;
        for (; j + kLanes <= count; j += kLanes) {
          const vf e = vexp(vsub(vload(&scores[j]), vmx));
          vstore(&scores[j], e);
          vsum = vadd(vsum, e);
        }
        float sum = hsum(vsum);
        for (; j < count; ++j) sum += (scores[j] = expf(scores[j] - mx));
        vf acc[kMaxDimVecs];
        for (int64_t c = 0; c < dvecs; ++c) acc[c] = vzero();
        for (j = 0; j < count; ++j) {
          const vf p = vset1(scores[j]);
          const float* vr = vh + j * head_dim;
          for (int64_t c = 0; c < dvecs; ++c) acc[c] = vfma(p, vload(vr + c * kLanes), acc[c]);
        }
        const vf inv = vset1(1.0f / sum);
        for (int64_t c = 0; c < dvecs; ++c) vstore(o + c * kLanes, vmul(acc[c], inv));
      }
  }
}

}  // namespace bs::kernels::cpu::BS_ISA_NS
