// Attention for a handful of query tokens (decode steps): reads the cache rows as
// they are, fp32, one query head per work item. The tiled kernels re-layout K/V
// per call, which costs as much as the whole product when there is one query.
#include "kernels/cpu/simd_math.h"  // first: see the note there
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/ops.h"

namespace bs::kernels::cpu {

void attention_decode(const float* q, const int32_t* qpos, const float* k, const float* v, float* out, int64_t n,
                      int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t n_kv, int64_t kv_stride,
                      float scale) {
  if (head_dim % 16 != 0) throw std::invalid_argument("cpu attention (decode): head_dim must be a multiple of 16");
  const int64_t group = q_heads / kv_heads;
  const int64_t dvecs = head_dim / 16;
#pragma omp parallel
  {
    std::vector<float> scores(static_cast<size_t>(n_kv));
#pragma omp for schedule(static) collapse(2)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < q_heads; ++h) {
        const float* qv = q + (t * q_heads + h) * head_dim;
        const float* kh = k + (h / group) * kv_stride * head_dim;
        const float* vh = v + (h / group) * kv_stride * head_dim;
        float* o = out + (t * q_heads + h) * head_dim;
        const int64_t count = std::min<int64_t>(n_kv, static_cast<int64_t>(qpos[t]) + 1);
        if (count <= 0) {
          std::fill(o, o + head_dim, 0.0f);
          continue;
        }
        __m512 qr[16];
        for (int64_t c = 0; c < dvecs && c < 16; ++c) qr[c] = _mm512_loadu_ps(qv + c * 16);
        float mx = -INFINITY;
        for (int64_t j = 0; j < count; ++j) {
          const float* kr = kh + j * head_dim;
          __m512 acc = _mm512_mul_ps(qr[0], _mm512_loadu_ps(kr));
          for (int64_t c = 1; c < dvecs; ++c) acc = _mm512_fmadd_ps(qr[c], _mm512_loadu_ps(kr + c * 16), acc);
          scores[j] = hsum512(acc) * scale;
          mx = std::max(mx, scores[j]);
        }
        // softmax numerators, 16 at a time
        const __m512 vmx = _mm512_set1_ps(mx);
        __m512 vsum = _mm512_setzero_ps();
        int64_t j = 0;
        for (; j + 16 <= count; j += 16) {
          const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(&scores[j]), vmx));
          _mm512_storeu_ps(&scores[j], e);
          vsum = _mm512_add_ps(vsum, e);
        }
        float sum = hsum512(vsum);
        for (; j < count; ++j) sum += (scores[j] = std::exp(scores[j] - mx));
        __m512 acc[16];
        for (int64_t c = 0; c < dvecs; ++c) acc[c] = _mm512_setzero_ps();
        for (j = 0; j < count; ++j) {
          const __m512 p = _mm512_set1_ps(scores[j]);
          const float* vr = vh + j * head_dim;
          for (int64_t c = 0; c < dvecs; ++c) acc[c] = _mm512_fmadd_ps(p, _mm512_loadu_ps(vr + c * 16), acc[c]);
        }
        const __m512 inv = _mm512_set1_ps(1.0f / sum);
        for (int64_t c = 0; c < dvecs; ++c) _mm512_storeu_ps(o + c * 16, _mm512_mul_ps(acc[c], inv));
      }
  }
}

}  // namespace bs::kernels::cpu
