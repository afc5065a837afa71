// Work split shared by the tiled attention kernels (fp32 and bf16) of one variant.
//
// The rows of a KV head are (token, query head of its group) pairs, so the grouped
// query heads share every K/V tile a block loads. Blocks of kAttentionRows rows
// are the parallel work items; the latest (longest, causally) run first.
#pragma once

#include "kernels/cpu/variant/simd.h"

namespace bs::kernels::cpu::BS_ISA_NS {

constexpr int kAttentionRows = 4;

struct AttentionRow {
  const float* q;  // [head_dim]
  float* out;      // [head_dim]
  int32_t pos;     // the row sees keys [lo, pos]
  int32_t lo;      // the first key it sees: 0, or pos - window + 1 under a sliding window
};

// Calls block(kv_head, rows, nrows, key_begin, key_end) for every block, in parallel;
// [key_begin, key_end) bounds the keys any row of the block may see (window: the
// sliding window, KvView::window; 0 for none).
template <class Block>
void for_each_row_block(const float* q,       // [n, q_heads, head_dim]
                        const int32_t* qpos,  // [n]
                        float* out,           // [n, q_heads, head_dim]
                        int64_t n, int64_t q_heads, int64_t kv_heads, int64_t head_dim, int64_t n_kv,
                        int64_t window, const Block& block) {
  const int64_t group = q_heads / kv_heads;
  const int64_t rows_per_head = n * group;
  const int64_t blocks_per_head = (rows_per_head + kAttentionRows - 1) / kAttentionRows;
  const int64_t total_blocks = kv_heads * blocks_per_head;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t b = total_blocks - 1; b >= 0; --b) {
    const int64_t h = b / blocks_per_head;
    const int64_t r0 = (b % blocks_per_head) * kAttentionRows;
    AttentionRow rows[kAttentionRows];
    int nrows = 0;
    int64_t key_end = 0, key_begin = n_kv;
    for (int64_t r = r0; r < imin(rows_per_head, r0 + kAttentionRows); ++r) {
      const int64_t t = r / group, qh = h * group + r % group;
      const int64_t lo = window > 0 ? imax(0, static_cast<int64_t>(qpos[t]) - window + 1) : 0;
      rows[nrows++] = AttentionRow{q + (t * q_heads + qh) * head_dim, out + (t * q_heads + qh) * head_dim, qpos[t],
                                   static_cast<int32_t>(lo)};
      key_end = imax(key_end, imin(n_kv, static_cast<int64_t>(qpos[t]) + 1));
      key_begin = imin(key_begin, lo);
    }
    block(h, rows, nrows, imin(key_begin, key_end), key_end);
  }
}

}  // namespace bs::kernels::cpu::BS_ISA_NS
