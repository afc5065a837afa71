// Tiled causal attention with online softmax (flash-attention style), fp32 (a
// half-precision cache is widened to fp32 as its tiles are laid out).
//
// Work item: one KV head and a block of kRows query rows, where the rows of a KV head
// are (token, query head of its group) pairs, so the grouped query heads share every
// K/V tile they load. For each tile of kKeys keys:
//   S = Q·Kᵀ   (K pre-transposed per head, so kLanes keys are one vector and the head
//               dimension is the reduction loop: broadcasts + FMAs, no horizontal sums)
//   online softmax: running max m and sum l per row, O rescaled by e^(m_old - m_new)
//   O += P·V   (broadcast p, FMA with a V row)
#include "kernels/cpu/variant/simd.h"  // first: see the note there
#include "kernels/cpu/variant/attention_blocks.h"
#include "kernels/cpu/variant/variant_ops.h"

namespace bs::kernels::cpu::BS_ISA_NS {
namespace {

constexpr int kRows = kAttentionRows;
constexpr int kKeyVecs = 4;                 // vectors of keys per tile
constexpr int kKeys = kKeyVecs * kLanes;    // 64 keys (AVX-512), 32 (AVX2, scalar)
// Accumulators held at once: kRows x kQkVecs for S, kRows x kPvVecs for O. AVX-512 has
// 32 vector registers, AVX2 16, so AVX2 walks the tile in two halves.
constexpr int kQkVecs = kLanes == 16 ? 4 : 2;
constexpr int kPvVecs = kLanes == 16 ? 4 : 2;
constexpr int kMaxHeadDim = 256;

// o[r][d_off, d_off + W*kLanes) += sum_j s[r][j] * V[j][same dims] over the tile's kn keys.
// W is a compile-time width so the accumulators stay in registers.
template <int W>
inline void accumulate_pv(float (*o)[kMaxHeadDim], const float (*s)[kKeys], const float* vtile, int64_t head_dim,
                          int64_t kn, int64_t d_off) {
  vf oacc[kRows][W];
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < W; ++c) oacc[r][c] = vload(o[r] + d_off + c * kLanes);
  for (int64_t j = 0; j < kn; ++j) {
    const float* vrow = vtile + j * head_dim + d_off;
    vf vv[W];
    for (int c = 0; c < W; ++c) vv[c] = vload(vrow + c * kLanes);
    for (int r = 0; r < kRows; ++r) {
      const vf p = vset1(s[r][j]);
      for (int c = 0; c < W; ++c) oacc[r][c] = vfma(p, vv[c], oacc[r][c]);
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < W; ++c) vstore(o[r] + d_off + c * kLanes, oacc[r][c]);
}

// One block of up to kRows rows of one KV head over keys [key_begin, key_end) (each
// row over its own [lo, pos]).
// kt: [tiles, head_dim, kKeys] transposed keys, one contiguous block per tile;
// vtiles: [tiles] the V rows of each tile, [kKeys, head_dim] (row stride head_dim).
void attend_block(const AttentionRow* rows, int nrows, const float* kt, const float* const* vtiles, int64_t head_dim,
                  int64_t key_begin, int64_t key_end, float scale) {
  alignas(64) float s[kRows][kKeys];
  alignas(64) float o[kRows][kMaxHeadDim];
  float m[kRows], l[kRows];
  const float* qr[kRows];
  int32_t pos[kRows], lo[kRows];
  for (int r = 0; r < kRows; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
    memset(o[r], 0, sizeof(float) * head_dim);
    qr[r] = rows[r < nrows ? r : 0].q;
    pos[r] = r < nrows ? rows[r].pos : -1;
    lo[r] = r < nrows ? rows[r].lo : 0;
  }
  int32_t min_pos = pos[0], max_lo = lo[0];
  for (int r = 1; r < nrows; ++r) {
    min_pos = pos[r] < min_pos ? pos[r] : min_pos;
    max_lo = lo[r] > max_lo ? lo[r] : max_lo;
  }
  const int64_t dvecs = head_dim / kLanes;
  const vf vscale = vset1(scale);

  for (int64_t k0 = key_begin / kKeys * kKeys; k0 < key_end; k0 += kKeys) {
    const int64_t kn = imin(kKeys, key_end - k0);
    // ---- S = Q Kᵀ, scaled
    for (int c0 = 0; c0 < kKeyVecs; c0 += kQkVecs) {
      vf acc[kRows][kQkVecs];
      for (int r = 0; r < kRows; ++r)
        for (int c = 0; c < kQkVecs; ++c) acc[r][c] = vzero();
      const float* ktile = kt + (k0 / kKeys) * head_dim * kKeys + c0 * kLanes;
      for (int64_t d = 0; d < head_dim; ++d) {
        const float* krow = ktile + d * kKeys;
        vf kv[kQkVecs];
        for (int c = 0; c < kQkVecs; ++c) kv[c] = vload(krow + c * kLanes);
        for (int r = 0; r < kRows; ++r) {
          const vf qv = vset1(qr[r][d]);
          for (int c = 0; c < kQkVecs; ++c) acc[r][c] = vfma(qv, kv[c], acc[r][c]);
        }
      }
      for (int r = 0; r < kRows; ++r)
        for (int c = 0; c < kQkVecs; ++c) vstore(s[r] + (c0 + c) * kLanes, vmul(acc[r][c], vscale));
    }
    // ---- mask (only on the causal diagonal, the window's edge and the ragged last
    // tile), online softmax
    const bool full_tile = kn == kKeys && k0 + kKeys - 1 <= min_pos && k0 >= max_lo;
    for (int r = 0; r < kRows; ++r) {
      const int64_t limit = imin(static_cast<int64_t>(pos[r]) + 1, k0 + kn);  // keys < limit are visible
      for (int64_t j = k0; j < imin(static_cast<int64_t>(lo[r]), k0 + kKeys); ++j) s[r][j - k0] = -INFINITY;
      vf mx = vset1(-INFINITY);
      for (int c = 0; c < kKeyVecs; ++c) {
        vf sc = vload(s[r] + c * kLanes);
        if (!full_tile) {
          sc = vkeep_first(sc, limit - (k0 + c * kLanes), -INFINITY);
          vstore(s[r] + c * kLanes, sc);
        }
        mx = vmax(mx, sc);
      }
      const float tile_max = hmax(mx);
      if (tile_max == -INFINITY) {
        memset(s[r], 0, sizeof s[r]);
        continue;
      }
      const float m_new = fmax2(m[r], tile_max);
      const float alpha = m_new > m[r] ? expf(m[r] - m_new) : 1.0f;  // 0 when m[r] = -inf
      const vf vm = vset1(m_new);
      vf sum = vzero();
      for (int c = 0; c < kKeyVecs; ++c) {
        const vf p = vexp(vsub(vload(s[r] + c * kLanes), vm));  // masked: e^-inf = 0
        vstore(s[r] + c * kLanes, p);
        sum = vadd(sum, p);
      }
      l[r] = l[r] * alpha + hsum(sum);
      m[r] = m_new;
      if (alpha != 1.0f) {
        const vf va = vset1(alpha);
        for (int64_t dv = 0; dv < dvecs; ++dv) vstore(o[r] + dv * kLanes, vmul(vload(o[r] + dv * kLanes), va));
      }
    }
    // ---- O += P V, kPvVecs slices of the head dimension at a time (then single ones)
    const float* vtile = vtiles[k0 / kKeys];
    int64_t dv = 0;
    for (; dv + kPvVecs <= dvecs; dv += kPvVecs) accumulate_pv<kPvVecs>(o, s, vtile, head_dim, kn, dv * kLanes);
    for (; dv < dvecs; ++dv) accumulate_pv<1>(o, s, vtile, head_dim, kn, dv * kLanes);
  }
  for (int r = 0; r < nrows; ++r) {
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    for (int64_t d = 0; d < head_dim; ++d) rows[r].out[d] = o[r][d] * inv;
  }
}

}  // namespace

void attention(const float* q, const int32_t* qpos, const KvView& kv, float* out, int64_t n, int64_t q_heads,
               int64_t n_kv, float scale) {
  if (n == 0) return;
  const int64_t kv_heads = kv.kv_heads, head_dim = kv.head_dim;
  // Transposed keys, tile by tile, zero-padded to a whole tile:
  // [kv_heads, kt_stride / kKeys, head_dim, kKeys]. A tile is one contiguous block, so the
  // S loop walks consecutive lines (a plain [head_dim, kt_stride] transpose puts each
  // dimension's row of a tile in another page).
  const int64_t kt_stride = (n_kv + kKeys - 1) / kKeys * kKeys;
  const int64_t tiles = kt_stride / kKeys;
  Scratch kt_buf(static_cast<size_t>(kv_heads * head_dim * kt_stride) * sizeof(float), /*zero=*/true);
  float* kt = kt_buf.as<float>();
  // V is read in place when it is fp32 and every tile lies in one page (pages of at
  // least a tile start on tile boundaries: both are powers of two), else gathered
  // (and widened) per tile.
  const bool v_in_place =
      kv.dtype == TensorType::F32 && (kv.page_count == 1 || (int64_t{1} << kv.page_shift) >= kKeys);
  Scratch vg_buf(v_in_place ? 0 : static_cast<size_t>(kv_heads * kt_stride * head_dim) * sizeof(float));
  Scratch vtiles_buf(static_cast<size_t>(kv_heads * tiles) * sizeof(const float*));
  const float** vtiles = vtiles_buf.as<const float*>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t h = 0; h < kv_heads; ++h)
    for (int64_t j0 = 0; j0 < n_kv; j0 += kKeys) {
      float* dst = kt + h * head_dim * kt_stride + j0 * head_dim;  // this tile
      const int64_t j1 = imin(n_kv, j0 + kKeys);
      alignas(64) float wide[kMaxHeadDim];
      for (int64_t j = j0; j < j1; ++j) {
        const float* src = kv_row_f32(kv, /*k_side=*/true, h, j, wide);
        for (int64_t d = 0; d < head_dim; ++d) dst[d * kKeys + (j - j0)] = src[d];
      }
      if (v_in_place) {
        vtiles[h * tiles + j0 / kKeys] = kv_v_row<float>(kv, h, j0);
      } else {
        float* vdst = vg_buf.as<float>() + (h * kt_stride + j0) * head_dim;
        for (int64_t j = j0; j < j1; ++j) {
          float* row = vdst + (j - j0) * head_dim;
          const float* src = kv_row_f32(kv, /*k_side=*/false, h, j, row);
          if (src != row) memcpy(row, src, sizeof(float) * head_dim);
        }
        vtiles[h * tiles + j0 / kKeys] = vdst;
      }
    }

  for_each_row_block(q, qpos, out, n, q_heads, kv_heads, head_dim, n_kv, kv.window,
                     [&](int64_t h, const AttentionRow* rows, int nrows, int64_t key_begin, int64_t key_end) {
                       attend_block(rows, nrows, kt + h * head_dim * kt_stride, vtiles + h * tiles, head_dim,
                                    key_begin, key_end, scale);
                     });
}

}  // namespace bs::kernels::cpu::BS_ISA_NS
