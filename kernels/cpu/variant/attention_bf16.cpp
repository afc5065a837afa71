// The attention of kernels/cpu/variant/attention.cpp with bf16 dot products
// (AVX512-BF16 vdpbf16ps: 32 multiply-adds per instruction instead of 16):
// Q, K, V and the softmax probabilities are rounded to bf16, scores, the online
// softmax and the output accumulate in fp32. The CPU backend
// (kernels/cpu/cpu_backend.cpp) uses it at Precision::BF16 for more than
// kDecodeMaxQueries (4) query rows when head_dim % 32 == 0; fewer rows go to
// attention_decode, other head dims to the fp32 attention. A bf16 cache passes through
// unchanged (widened, then rounded back: exact); an f16 one is rounded to bf16 like an
// fp32 one.
//
// Layouts built per call, per KV head (zero-padded to whole tiles):
//   kp [head_dim/2, kt_stride] 32-bit words: (K[key][2j], K[key][2j+1]) — a vector
//      load gives one dimension pair of 16 consecutive keys.
//   vp [kt_stride/2, head_dim] 32-bit words: (V[2p][d], V[2p+1][d]) — a vector load
//      gives one key pair of 16 consecutive dimensions.
#include "kernels/cpu/variant/simd.h"  // first: see the note there
#if BS_ISA_LEVEL >= 3  // only the avx512bf16 variant has bf16 dot products
#include "kernels/cpu/variant/attention_blocks.h"
#include "kernels/cpu/variant/variant_ops.h"
#include "kernels/dequant.h"

namespace bs::kernels::cpu::BS_ISA_NS {
namespace {

constexpr int kRows = kAttentionRows;
constexpr int kKeys = 64;
constexpr int kMaxHeadDim = 256;

inline uint32_t pack_bf16_pair(float lo, float hi) {
  return static_cast<uint32_t>(fp32_to_bf16(lo)) | (static_cast<uint32_t>(fp32_to_bf16(hi)) << 16);
}

void attend_block_bf16(const AttentionRow* rows, int nrows, const uint32_t* kp, const uint32_t* vp, int64_t kt_stride,
                       int64_t head_dim, int64_t key_begin, int64_t key_end, float scale) {
  alignas(64) uint32_t sp[kRows][kKeys / 2];      // probabilities as bf16 pairs
  alignas(64) float o[kRows][kMaxHeadDim];
  uint32_t qp[kRows][kMaxHeadDim / 2];             // query as bf16 pairs
  float m[kRows], l[kRows];
  int32_t pos[kRows], lo[kRows];
  const int64_t pairs = head_dim / 2;
  for (int r = 0; r < kRows; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
    memset(o[r], 0, sizeof(float) * head_dim);
    const float* q = rows[r < nrows ? r : 0].q;
    for (int64_t j = 0; j < pairs; ++j) qp[r][j] = pack_bf16_pair(q[2 * j], q[2 * j + 1]);
    pos[r] = r < nrows ? rows[r].pos : -1;
    lo[r] = r < nrows ? rows[r].lo : 0;
  }
  int32_t min_pos = pos[0], max_lo = lo[0];
  for (int r = 1; r < nrows; ++r) {
    min_pos = (pos[r] < min_pos ? pos[r] : min_pos);
    max_lo = (lo[r] > max_lo ? lo[r] : max_lo);
  }
  const int64_t dvecs = head_dim / 16;
  const __m512 vscale = _mm512_set1_ps(scale);
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);

  for (int64_t k0 = key_begin / kKeys * kKeys; k0 < key_end; k0 += kKeys) {
    const int64_t kn = imin(kKeys, key_end - k0);
    __m512 acc[kRows][4];
    for (int r = 0; r < kRows; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
    for (int64_t j = 0; j < pairs; ++j) {
      const uint32_t* krow = kp + j * kt_stride + k0;
      const __m512bh k_0 = (__m512bh)_mm512_loadu_si512(krow);
      const __m512bh k_1 = (__m512bh)_mm512_loadu_si512(krow + 16);
      const __m512bh k_2 = (__m512bh)_mm512_loadu_si512(krow + 32);
      const __m512bh k_3 = (__m512bh)_mm512_loadu_si512(krow + 48);
      for (int r = 0; r < kRows; ++r) {
        const __m512bh qv = (__m512bh)_mm512_set1_epi32(static_cast<int>(qp[r][j]));
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], qv, k_0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], qv, k_1);
        acc[r][2] = _mm512_dpbf16_ps(acc[r][2], qv, k_2);
        acc[r][3] = _mm512_dpbf16_ps(acc[r][3], qv, k_3);
      }
    }
    // Masking is only needed on the causal diagonal, the window's edge and the ragged
    // last tile.
    const bool full_tile = kn == kKeys && k0 + kKeys - 1 <= min_pos && k0 >= max_lo;
    for (int r = 0; r < kRows; ++r) {
      __m512 mx = _mm512_set1_ps(-INFINITY);
      __mmask16 valid[4];
      for (int c = 0; c < 4; ++c) {
        if (full_tile) {
          valid[c] = 0xFFFF;
        } else {
          const __m512i key = _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int32_t>(k0 + c * 16)));
          valid[c] = _mm512_cmple_epi32_mask(key, _mm512_set1_epi32(pos[r])) &
                     _mm512_cmpge_epi32_mask(key, _mm512_set1_epi32(lo[r])) &
                     _mm512_cmplt_epi32_mask(key, _mm512_set1_epi32(static_cast<int32_t>(k0 + kn)));
        }
        acc[r][c] = _mm512_mul_ps(acc[r][c], vscale);
        mx = _mm512_mask_max_ps(mx, valid[c], mx, acc[r][c]);
      }
      const float tile_max = hmax(mx);
      if (tile_max == -INFINITY) {
        memset(sp[r], 0, sizeof sp[r]);
        continue;
      }
      const float m_new = fmax2(m[r], tile_max);
      const float alpha = expf(m[r] - m_new);
      const __m512 vm = _mm512_set1_ps(m_new);
      __m512 sum = _mm512_setzero_ps();
      __m512 p[4];
      for (int c = 0; c < 4; ++c) {
        p[c] = _mm512_maskz_mov_ps(valid[c], vexp(_mm512_sub_ps(acc[r][c], vm)));
        sum = _mm512_add_ps(sum, p[c]);
      }
      // 64 probabilities -> 32 bf16 pairs (keys 2i, 2i+1): two 32-lane conversions.
      const __m512bh b01 = _mm512_cvtne2ps_pbh(p[1], p[0]);
      const __m512bh b23 = _mm512_cvtne2ps_pbh(p[3], p[2]);
      _mm512_store_si512(sp[r], (__m512i)b01);
      _mm512_store_si512(sp[r] + 16, (__m512i)b23);
      l[r] = l[r] * alpha + hsum(sum);
      m[r] = m_new;
      if (alpha != 1.0f) {
        const __m512 va = _mm512_set1_ps(alpha);
        for (int64_t dv = 0; dv < dvecs; ++dv)
          _mm512_store_ps(o[r] + dv * 16, _mm512_mul_ps(_mm512_load_ps(o[r] + dv * 16), va));
      }
    }
    // O += P V over key pairs; the bf16 sum accumulates the probabilities as rounded,
    // l above uses fp32 ones: the difference is within bf16 rounding.
    const int64_t kpairs = (kn + 1) / 2;
    const uint32_t* vtile = vp + (k0 / 2) * head_dim;
    for (int64_t d0 = 0; d0 < dvecs; d0 += 4) {
      const int64_t width = imin(4, dvecs - d0);
      __m512 oacc[kRows][4];
      for (int r = 0; r < kRows; ++r)
        for (int c = 0; c < width; ++c) oacc[r][c] = _mm512_load_ps(o[r] + (d0 + c) * 16);
      for (int64_t j = 0; j < kpairs; ++j) {
        const uint32_t* vrow = vtile + j * head_dim + d0 * 16;
        __m512bh vv[4];
        for (int c = 0; c < width; ++c) vv[c] = (__m512bh)_mm512_loadu_si512(vrow + c * 16);
        for (int r = 0; r < kRows; ++r) {
          const __m512bh pv = (__m512bh)_mm512_set1_epi32(static_cast<int>(sp[r][j]));
          for (int c = 0; c < width; ++c) oacc[r][c] = _mm512_dpbf16_ps(oacc[r][c], pv, vv[c]);
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

void attention_bf16(const float* q, const int32_t* qpos, const KvView& kv, float* out, int64_t n, int64_t q_heads,
                    int64_t n_kv, float scale) {
  if (n == 0) return;
  const int64_t kv_heads = kv.kv_heads, head_dim = kv.head_dim;
  const int64_t pairs = head_dim / 2;
  const int64_t kt_stride = (n_kv + kKeys - 1) / kKeys * kKeys;
  // Zero padding matters: padded keys get probability 0, and 0 * NaN would poison O.
  Scratch kp_buf(static_cast<size_t>(kv_heads * pairs * kt_stride) * sizeof(uint32_t), /*zero=*/true);
  Scratch vp_buf(static_cast<size_t>(kv_heads * (kt_stride / 2) * head_dim) * sizeof(uint32_t), /*zero=*/true);
  uint32_t* kp = kp_buf.as<uint32_t>();
  uint32_t* vp = vp_buf.as<uint32_t>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t h = 0; h < kv_heads; ++h)
    for (int64_t j0 = 0; j0 < n_kv; j0 += 64) {
      uint32_t* kd = kp + h * pairs * kt_stride;
      uint32_t* vd = vp + h * (kt_stride / 2) * head_dim;
      const int64_t j1 = imin(n_kv, j0 + 64);
      alignas(64) uint32_t row[kMaxHeadDim / 2];
      alignas(64) float wide[kMaxHeadDim], wide1[kMaxHeadDim];  // half-precision rows widened
      for (int64_t key = j0; key < j1; ++key) {
        // K row -> bf16 pairs (adjacent dimensions), scattered into the transposed layout
        const float* kr = kv_row_f32(kv, /*k_side=*/true, h, key, wide);
        for (int64_t d = 0; d < head_dim; d += 32) {
          const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(kr + d + 16), _mm512_loadu_ps(kr + d));
          _mm512_store_si512(row + d / 2, (__m512i)b);
        }
        for (int64_t j = 0; j < pairs; ++j) kd[j * kt_stride + key] = row[j];
      }
      // V rows 2p and 2p+1 -> interleaved bf16 pairs per dimension
      const __m512i lo_idx = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38,
                                              6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
      const __m512i hi_idx = _mm512_add_epi16(lo_idx, _mm512_set1_epi16(16));
      for (int64_t key = j0; key < j1; key += 2) {
        const float* v0 = kv_row_f32(kv, /*k_side=*/false, h, key, wide);
        const bool has_next = key + 1 < n_kv;
        // rows of a pair may lie in two pages
        const float* v1 = has_next ? kv_row_f32(kv, /*k_side=*/false, h, key + 1, wide1) : v0;
        for (int64_t d = 0; d < head_dim; d += 32) {
          const __m512i a = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(v0 + d + 16), _mm512_loadu_ps(v0 + d));
          const __m512i b = has_next ? (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(v1 + d + 16),
                                                                    _mm512_loadu_ps(v1 + d))
                                     : _mm512_setzero_si512();
          uint32_t* dst = vd + (key / 2) * head_dim + d;
          _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(a, lo_idx, b));
          _mm512_storeu_si512(dst + 16, _mm512_permutex2var_epi16(a, hi_idx, b));
        }
      }
    }

  for_each_row_block(q, qpos, out, n, q_heads, kv_heads, head_dim, n_kv, kv.window,
                     [&](int64_t h, const AttentionRow* rows, int nrows, int64_t key_begin, int64_t key_end) {
                       attend_block_bf16(rows, nrows, kp + h * pairs * kt_stride, vp + h * (kt_stride / 2) * head_dim,
                        kt_stride, head_dim, key_begin, key_end, scale);
                     });
}

// dst = bf16(src), round to nearest even: the activations of the bf16 GEMMs.
void to_bf16(const float* src, uint16_t* dst, int64_t count) {
  const int64_t vec_end = count & ~int64_t{31};
#pragma omp parallel for schedule(static) if (count >= 65536)
  for (int64_t i = 0; i < vec_end; i += 32) {
    const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
    _mm512_storeu_si512(dst + i, (__m512i)b);
  }
  for (int64_t i = vec_end; i < count; ++i) dst[i] = fp32_to_bf16(src[i]);
}

}  // namespace bs::kernels::cpu::BS_ISA_NS
#endif  // BS_ISA_LEVEL >= 3
