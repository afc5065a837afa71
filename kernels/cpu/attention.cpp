// Tiled causal attention with online softmax (flash-attention style), fp32 AVX-512.
//
// Work item: one KV head and a block of kRows query rows, where the rows of a KV head
// are (token, query head of its group) pairs, so the grouped query heads share every
// K/V tile they load. For each tile of kKeys keys:
//   S = Q·Kᵀ   (K pre-transposed per head, so 16 keys are one vector and the head
//               dimension is the reduction loop: broadcasts + FMAs, no horizontal sums)
//   online softmax: running max m and sum l per row, O rescaled by e^(m_old - m_new)
//   O += P·V   (broadcast p, FMA with a V row)
#include "kernels/cpu/simd_math.h"  // first: see the note there
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/attention_blocks.h"
#include "kernels/cpu/ops.h"

namespace bs::kernels::cpu {
namespace {

constexpr int kRows = kAttentionRows;
constexpr int kKeys = 64;   // keys per tile (4 vectors)
constexpr int kMaxHeadDim = 256;

// Process one block of up to kRows rows of one KV head over keys [0, key_end).
// kt: [head_dim, kt_stride] transposed keys; v: [n_kv, head_dim] (row stride head_dim).
void attend_block(const AttentionRow* rows, int nrows, const float* kt, int64_t kt_stride, const float* v,
                  int64_t head_dim, int64_t key_end, float scale) {
  alignas(64) float s[kRows][kKeys];
  alignas(64) float o[kRows][kMaxHeadDim];
  float m[kRows], l[kRows];
  for (int r = 0; r < kRows; ++r) {
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.0f;
    std::memset(o[r], 0, sizeof(float) * head_dim);
  }
  const float* qr[kRows];
  int32_t pos[kRows];
  for (int r = 0; r < kRows; ++r) {
    qr[r] = rows[r < nrows ? r : 0].q;
    pos[r] = r < nrows ? rows[r].pos : -1;
  }
  const int64_t dvecs = head_dim / 16;

  for (int64_t k0 = 0; k0 < key_end; k0 += kKeys) {
    const int64_t kn = std::min<int64_t>(kKeys, key_end - k0);
    // ---- S = Q Kᵀ for kRows x 64 keys: 16 accumulators
    __m512 acc[kRows][4];
    for (int r = 0; r < kRows; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
    const float* ktile = kt + k0;
    for (int64_t d = 0; d < head_dim; ++d) {
      const float* krow = ktile + d * kt_stride;
      const __m512 k_0 = _mm512_loadu_ps(krow), k_1 = _mm512_loadu_ps(krow + 16);
      const __m512 k_2 = _mm512_loadu_ps(krow + 32), k_3 = _mm512_loadu_ps(krow + 48);
      for (int r = 0; r < kRows; ++r) {
        const __m512 qv = _mm512_set1_ps(qr[r][d]);
        acc[r][0] = _mm512_fmadd_ps(qv, k_0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(qv, k_1, acc[r][1]);
        acc[r][2] = _mm512_fmadd_ps(qv, k_2, acc[r][2]);
        acc[r][3] = _mm512_fmadd_ps(qv, k_3, acc[r][3]);
      }
    }
    // ---- mask, online softmax
    const __m512 vscale = _mm512_set1_ps(scale);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int r = 0; r < kRows; ++r) {
      __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
      __mmask16 valid[4];
      for (int c = 0; c < 4; ++c) {
        const __m512i key = _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int32_t>(k0 + c * 16)));
        // valid: key <= pos and key < key_end
        valid[c] = _mm512_cmple_epi32_mask(key, _mm512_set1_epi32(pos[r])) &
                   _mm512_cmplt_epi32_mask(key, _mm512_set1_epi32(static_cast<int32_t>(k0 + kn)));
        acc[r][c] = _mm512_mul_ps(acc[r][c], vscale);
        mx = _mm512_mask_max_ps(mx, valid[c], mx, acc[r][c]);
      }
      const float tile_max = hmax512(mx);
      if (tile_max == -std::numeric_limits<float>::infinity()) {
        for (int c = 0; c < 4; ++c) _mm512_store_ps(s[r] + c * 16, _mm512_setzero_ps());
        continue;
      }
      const float m_new = std::max(m[r], tile_max);
      const float alpha = std::exp(m[r] - m_new);  // 0 when m[r] = -inf
      const __m512 vm = _mm512_set1_ps(m_new);
      __m512 sum = _mm512_setzero_ps();
      for (int c = 0; c < 4; ++c) {
        const __m512 p = _mm512_maskz_mov_ps(valid[c], exp512(_mm512_sub_ps(acc[r][c], vm)));
        _mm512_store_ps(s[r] + c * 16, p);
        sum = _mm512_add_ps(sum, p);
      }
      l[r] = l[r] * alpha + hsum512(sum);
      m[r] = m_new;
      if (alpha != 1.0f) {
        const __m512 va = _mm512_set1_ps(alpha);
        for (int64_t dv = 0; dv < dvecs; ++dv)
          _mm512_store_ps(o[r] + dv * 16, _mm512_mul_ps(_mm512_load_ps(o[r] + dv * 16), va));
      }
    }
    // ---- O += P V, four 16-wide slices of the head dimension at a time
    const float* vtile = v + k0 * head_dim;
    for (int64_t d0 = 0; d0 < dvecs; d0 += 4) {
      const int64_t width = std::min<int64_t>(4, dvecs - d0);
      __m512 oacc[kRows][4];
      for (int r = 0; r < kRows; ++r)
        for (int c = 0; c < width; ++c) oacc[r][c] = _mm512_load_ps(o[r] + (d0 + c) * 16);
      for (int64_t j = 0; j < kn; ++j) {
        const float* vrow = vtile + j * head_dim + d0 * 16;
        __m512 vv[4];
        for (int c = 0; c < width; ++c) vv[c] = _mm512_loadu_ps(vrow + c * 16);
        for (int r = 0; r < kRows; ++r) {
          const __m512 p = _mm512_set1_ps(s[r][j]);
          for (int c = 0; c < width; ++c) oacc[r][c] = _mm512_fmadd_ps(p, vv[c], oacc[r][c]);
        }
      }
      for (int r = 0; r < kRows; ++r)
        for (int c = 0; c < width; ++c) _mm512_store_ps(o[r] + (d0 + c) * 16, oacc[r][c]);
    }
  }
  for (int r = 0; r < nrows; ++r) {
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    for (int64_t d = 0; d < head_dim; ++d) rows[r].out[d] = o[r][d] * inv;
  }
}

}  // namespace

void attention(const float* q, const int32_t* qpos, const float* k, const float* v, float* out, int64_t n,
               int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t n_kv, int64_t kv_stride,
               float scale) {
  if (head_dim % 16 != 0 || head_dim > kMaxHeadDim)
    throw std::invalid_argument("cpu attention: head_dim must be a multiple of 16 and <= 256");
  if (n == 0) return;
  // Transposed keys per head, padded to a whole tile: [kv_heads, head_dim, kt_stride].
  const int64_t kt_stride = (n_kv + kKeys - 1) / kKeys * kKeys;
  std::vector<float> kt(static_cast<size_t>(kv_heads * head_dim * kt_stride), 0.0f);
  // V needs a zero-padded tail too, since P·V reads whole rows of the last tile only
  // up to kn; no padding required there. K transpose is O(n_kv · head_dim) per head.
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t h = 0; h < kv_heads; ++h)
    for (int64_t j0 = 0; j0 < n_kv; j0 += 64) {
      const float* src = k + h * kv_stride * head_dim;
      float* dst = kt.data() + h * head_dim * kt_stride;
      const int64_t j1 = std::min(n_kv, j0 + 64);
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t d = 0; d < head_dim; ++d) dst[d * kt_stride + j] = src[j * head_dim + d];
    }

  for_each_row_block(q, qpos, out, n, q_heads, kv_heads, head_dim, n_kv,
                     [&](int64_t h, const AttentionRow* rows, int nrows, int64_t key_end) {
                       attend_block(rows, nrows, kt.data() + h * head_dim * kt_stride, kt_stride, v + h * kv_stride * head_dim,
                   head_dim, key_end, scale);
                     });
}

}  // namespace bs::kernels::cpu
