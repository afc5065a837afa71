// Attention for a handful of query tokens (decode steps): reads the cache rows as
// they are stored (fp32, or f16/bf16 widened to fp32 as each vector is loaded, so a
// half-precision cache moves half the bytes). The tiled kernel re-layouts K per call,
// which costs as much as the whole product when there is one query.
//
// Work items are query heads, or, when there are enough of them to share out, the
// query heads of one KV head together (GQA groups): then every block of K/V rows is
// brought into L1 once and used by each head of the group in turn, instead of each
// head streaming the whole K/V (larger than L1) from L2 again. A head's arithmetic is
// the same either way (bit-identical results), only the loop order around it changes.
//
// Scores are made 8 keys at a time: 8 independent dot products (one FMA chain each)
// finished by one horizontal-add tree (hsum8). One key at a time, a score is a chain of
// head_dim / kLanes dependent FMAs plus a horizontal sum, which leaves the FMA units
// waiting on latency.
#include "kernels/cpu/variant/simd.h"  // first: see the note there
#include <omp.h>

#include "kernels/cpu/variant/variant_ops.h"

namespace bs::kernels::cpu::BS_ISA_NS {
namespace {

constexpr int kMaxDimVecs = 256 / kLanes;
constexpr int kKeys = 8;        // keys per block of scores
constexpr int kValueRows = 32;  // V rows per block of the weighted sum (8 KB at head_dim 64)
constexpr int kMaxGroup = 16;   // query heads per item at most

// The next work item's K rows (KV head h of kv), fetched into L2 during this item's
// weighted sum (the cache is far larger than the caches).
struct Prefetch {
  const KvView* kv = nullptr;
  int64_t h = 0;
  int64_t count = 0;
};

template <class E>
inline void prefetch_row(const E* row, int64_t head_dim) {
  const char* p = reinterpret_cast<const char*>(row);
  for (int64_t at = 0; at < head_dim * static_cast<int64_t>(sizeof(E)); at += 64) _mm_prefetch(p + at, _MM_HINT_T1);
}

// g query heads (q: [g, head_dim]) over rows [first, first + count) of KV head kvh,
// count >= 1 (first > 0 under a sliding window).
// scores: g rows of `stride` floats (count rounded up to 16). DV: head_dim / kLanes
// when it is a compile-time count (the accumulators then stay in registers), else 0.
// E: the stored element (float, KvF16, KvBf16). Rows are addressed one by one through
// the page table, so a row's arithmetic is the same wherever its page lies.
template <int DV, class E>
void attend_heads_dv(const float* q, int64_t g, const KvView& kv, int64_t kvh, float* out, int64_t first,
                     int64_t count, float scale, float* scores, int64_t stride, Prefetch pf) {
  const int64_t head_dim = kv.head_dim;
  const int64_t dvecs = DV > 0 ? DV : head_dim / kLanes;
  // q·k of 8 keys per block; past the last key the block repeats it (scores not used).
  for (int64_t j0 = 0; j0 < count; j0 += kKeys) {
    const E* kr[kKeys];
    for (int i = 0; i < kKeys; ++i) kr[i] = kv_k_row<E>(kv, kvh, first + imin(j0 + i, count - 1));
    for (int64_t j = j0; j < imin(j0 + kKeys, count); ++j) prefetch_row(kv_v_row<E>(kv, kvh, first + j), head_dim);
    for (int64_t h = 0; h < g; ++h) {
      const float* qv = q + h * head_dim;
      vf acc[kKeys];
      const vf q0 = vload(qv);
      for (int i = 0; i < kKeys; ++i) acc[i] = vmul(q0, vload_kv(kr[i]));
      for (int64_t c = 1; c < dvecs; ++c) {
        const vf qc = vload(qv + c * kLanes);
        for (int i = 0; i < kKeys; ++i) acc[i] = vfma(qc, vload_kv(kr[i] + c * kLanes), acc[i]);
      }
      hsum8(acc, scores + h * stride + j0);
    }
  }
  // Per head: scale, max, softmax numerators (a vector at a time), their sum.
  float inv_sum[kMaxGroup];
  for (int64_t h = 0; h < g; ++h) {
    float* sc = scores + h * stride;
    const vf vscale = vset1(scale);
    vf vmx = vset1(-INFINITY);
    int64_t j = 0;
    for (; j + kLanes <= count; j += kLanes) {
      const vf s = vmul(vload(&sc[j]), vscale);
      vstore(&sc[j], s);
      vmx = vmax(vmx, s);
    }
    float mx = hmax(vmx);
    for (; j < count; ++j) mx = fmax2(mx, sc[j] *= scale);
    const vf vm = vset1(mx);
    vf vsum = vzero();
    for (j = 0; j + kLanes <= count; j += kLanes) {
      const vf e = vexp(vsub(vload(&sc[j]), vm));
      vstore(&sc[j], e);
      vsum = vadd(vsum, e);
    }
    float sum = hsum(vsum);
    for (; j < count; ++j) sum += (sc[j] = expf(sc[j] - mx));
    inv_sum[h] = 1.0f / sum;
    for (int64_t c = 0; c < dvecs; ++c) vstore(out + h * head_dim + c * kLanes, vzero());
  }
  // Weighted sum of V, kValueRows rows at a time (in L1 for every head of the group);
  // each head's accumulators add the rows in order.
  for (int64_t j0 = 0; j0 < count; j0 += kValueRows) {
    const int64_t j1 = imin(count, j0 + kValueRows);
    if (pf.kv)
      for (int64_t j = pf.count * j0 / count; j < pf.count * j1 / count; ++j)
        prefetch_row(kv_k_row<E>(*pf.kv, pf.h, j), head_dim);
    for (int64_t h = 0; h < g; ++h) {
      const float* sc = scores + h * stride;
      float* o = out + h * head_dim;
      vf acc[DV > 0 ? DV : kMaxDimVecs];
      for (int64_t c = 0; c < dvecs; ++c) acc[c] = vload(o + c * kLanes);
      for (int64_t j = j0; j < j1; ++j) {
        const vf p = vset1(sc[j]);
        const E* vr = kv_v_row<E>(kv, kvh, first + j);
        for (int64_t c = 0; c < dvecs; ++c) acc[c] = vfma(p, vload_kv(vr + c * kLanes), acc[c]);
      }
      for (int64_t c = 0; c < dvecs; ++c) vstore(o + c * kLanes, acc[c]);
    }
  }
  for (int64_t h = 0; h < g; ++h) {
    const vf inv = vset1(inv_sum[h]);
    for (int64_t c = 0; c < dvecs; ++c) vstore(out + h * head_dim + c * kLanes, vmul(vload(out + h * head_dim + c * kLanes), inv));
  }
}

template <class E>
inline void attend_heads_as(const float* q, int64_t g, const KvView& kv, int64_t kvh, float* out, int64_t first,
                            int64_t count, float scale, float* scores, int64_t stride, Prefetch pf) {
  switch (kv.head_dim / kLanes) {
    case 4: return attend_heads_dv<4, E>(q, g, kv, kvh, out, first, count, scale, scores, stride, pf);
    case 8: return attend_heads_dv<8, E>(q, g, kv, kvh, out, first, count, scale, scores, stride, pf);
    case 16: return attend_heads_dv<16, E>(q, g, kv, kvh, out, first, count, scale, scores, stride, pf);
    default: return attend_heads_dv<0, E>(q, g, kv, kvh, out, first, count, scale, scores, stride, pf);
  }
}

// Keys [first, end). pf.kv, when set, has kv's dtype (the rows of one call share it:
// the backend checks).
inline void attend_heads(const float* q, int64_t g, const KvView& kv, int64_t kvh, float* out, int64_t first,
                         int64_t end, float scale, float* scores, int64_t stride, Prefetch pf) {
  const int64_t count = end - first;
  if (count <= 0) {
    memset(out, 0, sizeof(float) * g * kv.head_dim);
    return;
  }
  if (kv.dtype == TensorType::F16)
    return attend_heads_as<KvF16>(q, g, kv, kvh, out, first, count, scale, scores, stride, pf);
  if (kv.dtype == TensorType::BF16)
    return attend_heads_as<KvBf16>(q, g, kv, kvh, out, first, count, scale, scores, stride, pf);
  return attend_heads_as<float>(q, g, kv, kvh, out, first, count, scale, scores, stride, pf);
}

// Rows of queries, each over its own cache kv[i], rows [first[i], end[i]) of it. Items are
// (row, KV head) with all its query heads when there are at least two per thread (and
// at most kMaxGroup heads), else (row, query head).
void attend_rows(const float* q, const int64_t* first, const int64_t* end, const KvView* kv, float* out, int64_t n,
                 int64_t q_heads, float scale) {
  const int64_t kv_heads = kv[0].kv_heads, head_dim = kv[0].head_dim;
  const int64_t group = q_heads / kv_heads;
  int64_t longest = 0;
  for (int64_t i = 0; i < n; ++i) longest = imax(longest, end[i] - first[i]);
  const int64_t stride = (longest + 15) / 16 * 16;
  const int threads = omp_get_max_threads();
  const int64_t g = (n * kv_heads >= 2 * threads && group <= kMaxGroup) ? group : 1;
  const int64_t per_row = q_heads / g;  // items per row
  Scratch scores_buf(static_cast<size_t>(threads * g * stride) * sizeof(float));
#pragma omp parallel
  {
    float* scores = scores_buf.as<float>() + omp_get_thread_num() * g * stride;
#pragma omp for schedule(static)
    for (int64_t item = 0; item < n * per_row; ++item) {
      const int64_t i = item / per_row, h0 = (item % per_row) * g, kvh = h0 / group;
      Prefetch pf;  // the next KV head's K: of this row, or the next row's first
      if ((h0 + g) % group == 0) {
        if (kvh + 1 < kv_heads) {
          pf = Prefetch{&kv[i], kvh + 1, end[i]};
        } else if (i + 1 < n) {
          pf = Prefetch{&kv[i + 1], 0, end[i + 1]};
        }
      }
      attend_heads(q + (i * q_heads + h0) * head_dim, g, kv[i], kvh, out + (i * q_heads + h0) * head_dim, first[i],
                   end[i], scale, scores, stride, pf);
    }
  }
}

}  // namespace

void attention_decode(const float* q, const int32_t* qpos, const KvView& kv, float* out, int64_t n, int64_t q_heads,
                      int64_t n_kv, float scale) {
  // Every query over the same cache.
  Scratch rows_buf(static_cast<size_t>(n) * (sizeof(KvView) + 2 * sizeof(int64_t)));
  KvView* views = rows_buf.as<KvView>();
  int64_t* first = reinterpret_cast<int64_t*>(views + n);
  int64_t* end = first + n;
  for (int64_t t = 0; t < n; ++t) {
    views[t] = kv;
    end[t] = imin(n_kv, static_cast<int64_t>(qpos[t]) + 1);
    first[t] = kv.first_visible(qpos[t]);
  }
  attend_rows(q, first, end, views, out, n, q_heads, scale);
}

// A row of attention_decode_rows is attention_decode of that row alone (n = 1,
// n_kv = qpos + 1): the same per-head arithmetic, whatever the items.
void attention_decode_rows(const float* q, const int32_t* qpos, const KvView* kv, float* out, int64_t n,
                           int64_t q_heads, float scale) {
  Scratch bounds_buf(static_cast<size_t>(2 * n) * sizeof(int64_t));
  int64_t* first = bounds_buf.as<int64_t>();
  int64_t* end = first + n;
  for (int64_t i = 0; i < n; ++i) {
    end[i] = static_cast<int64_t>(qpos[i]) + 1;
    first[i] = kv[i].first_visible(qpos[i]);
  }
  attend_rows(q, first, end, kv, out, n, q_heads, scale);
}

}  // namespace bs::kernels::cpu::BS_ISA_NS
