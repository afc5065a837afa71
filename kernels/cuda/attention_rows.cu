#include "kernels/cuda/attention_rows.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"

namespace bs::kernels::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kChunk = 32;            // keys scored at once: one per lane
constexpr int kMaxPairsPerLane = 4;   // V and the output: lane l owns elements 2(l + 32r), +1; head_dim <= 256
constexpr int kMaxWarps = 8;          // query heads of a group at once per block
// A row of `keys` keys is cut into ceil(keys / kKeysPerSplit) splits (at most kMaxSplits),
// each a multiple of kChunk keys but the last: a row's splits depend on its own length
// only, never on the capacity or the other rows, so its result is the same bits whatever
// the batch.
constexpr int64_t kKeysPerSplit = 64;
constexpr int64_t kMaxSplits = 64;
// Blocks per (row, KV head) in the launch: enough for ~kTargetBlocks blocks in all,
// at least kMinSplitBlocks; a block loops over its row's splits s = blockIdx.y,
// blockIdx.y + gridDim.y, ... so a small grid still covers long rows, and a large batch
// of short rows does not launch (and retire) thousands of empty blocks.
constexpr int64_t kTargetBlocks = 2048;
constexpr int64_t kMinSplitBlocks = 8;
constexpr int kCombineWarps = 4;
constexpr int kCombinePerLane = 8;    // the combine: lane l owns elements l + 32r

// A split's partial result: [max, sum, acc[head_dim]] (acc not yet divided by sum).
__host__ __device__ inline int64_t partial_floats(int64_t head_dim) { return head_dim + 2; }

// How a row's keys are split: `count` splits of `per` keys (a multiple of kChunk, the
// last split shorter), count = 0 when the row has no key.
struct RowSplits {
  int64_t keys, per, count;
};

__device__ inline RowSplits row_splits(int32_t qpos, int64_t capacity, int64_t splits_cap) {
  RowSplits r;
  const int64_t last = int64_t{qpos} + 1;
  r.keys = last < capacity ? last : capacity;
  if (r.keys <= 0) {
    r.keys = 0;
    r.per = kChunk;
    r.count = 0;
    return r;
  }
  int64_t want = (r.keys + kKeysPerSplit - 1) / kKeysPerSplit;
  want = want < kMaxSplits ? want : kMaxSplits;
  want = want < splits_cap ? want : splits_cap;  // binds only if a capacity exceeds max_keys
  const int64_t even = (r.keys + want - 1) / want;
  r.per = (even + kChunk - 1) / kChunk * kChunk;
  r.count = (r.keys + r.per - 1) / r.per;  // <= want
  return r;
}

__device__ inline int64_t shfl_i64(int64_t x, int src) {
  return static_cast<int64_t>(__shfl_sync(kFull, static_cast<long long>(x), src));
}

// The two 16-bit elements of a 32-bit word (element 0 in the low half), as fp32.
template <TensorType kType>
__device__ inline float2 widen_pair(uint32_t w) {
  if constexpr (kType == TensorType::BF16) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
  } else {
    return make_float2(__half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu))),
                       __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16))));
  }
}

// Element `at` of a pool of kType as its exact fp32 value.
template <TensorType kType>
__device__ inline float element(const void* base, int64_t at) {
  if constexpr (kType == TensorType::F32) {
    return __ldg(static_cast<const float*>(base) + at);
  } else {
    const unsigned short bits = __ldg(static_cast<const unsigned short*>(base) + at);
    if constexpr (kType == TensorType::BF16) return __uint_as_float(static_cast<uint32_t>(bits) << 16);
    else return __half2float(__ushort_as_half(bits));
  }
}

// q . k of one key row (head_dim d) at element `row` of `k`, q in shared memory.
// kVec: every row starts 16-byte aligned and d * element bytes is a multiple of 16.
template <TensorType kType, bool kVec>
__device__ inline float dot_row(const float* __restrict__ qs, const void* __restrict__ k, int64_t row, int d) {
  float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  if constexpr (kVec) {
    const float4* q4 = reinterpret_cast<const float4*>(qs);
    if constexpr (kType == TensorType::F32) {
      const float4* k4 = reinterpret_cast<const float4*>(static_cast<const float*>(k) + row);
      const int pieces = d / 4;
#pragma unroll 8
      for (int m = 0; m < pieces; ++m) {
        const float4 kk = __ldg(k4 + m), qq = q4[m];
        a.x = fmaf(qq.x, kk.x, a.x);
        a.y = fmaf(qq.y, kk.y, a.y);
        a.z = fmaf(qq.z, kk.z, a.z);
        a.w = fmaf(qq.w, kk.w, a.w);
      }
    } else {
      const uint4* k4 = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(k) + row);
      const int pieces = d / 8;
#pragma unroll 4
      for (int m = 0; m < pieces; ++m) {
        const uint4 kk = __ldg(k4 + m);
        const float4 q0 = q4[2 * m], q1 = q4[2 * m + 1];
        const float2 k01 = widen_pair<kType>(kk.x), k23 = widen_pair<kType>(kk.y);
        const float2 k45 = widen_pair<kType>(kk.z), k67 = widen_pair<kType>(kk.w);
        a.x = fmaf(q0.x, k01.x, a.x);
        a.y = fmaf(q0.y, k01.y, a.y);
        a.z = fmaf(q0.z, k23.x, a.z);
        a.w = fmaf(q0.w, k23.y, a.w);
        a.x = fmaf(q1.x, k45.x, a.x);
        a.y = fmaf(q1.y, k45.y, a.y);
        a.z = fmaf(q1.z, k67.x, a.z);
        a.w = fmaf(q1.w, k67.y, a.w);
      }
    }
  } else {
    int i = 0;
#pragma unroll 1
    for (; i + 4 <= d; i += 4) {
      a.x = fmaf(qs[i], element<kType>(k, row + i), a.x);
      a.y = fmaf(qs[i + 1], element<kType>(k, row + i + 1), a.y);
      a.z = fmaf(qs[i + 2], element<kType>(k, row + i + 2), a.z);
      a.w = fmaf(qs[i + 3], element<kType>(k, row + i + 3), a.w);
    }
    for (; i < d; ++i) a.x = fmaf(qs[i], element<kType>(k, row + i), a.x);
  }
  return (a.x + a.y) + (a.z + a.w);
}

// Elements e, e + 1 of the V row at `row` (e + 1 read only when < d). kVec: e is even
// and the pair is 2 * element bytes aligned.
template <TensorType kType, bool kVec>
__device__ inline float2 v_pair(const void* __restrict__ v, int64_t row, int e, int d) {
  if constexpr (kVec) {
    if constexpr (kType == TensorType::F32) {
      return __ldg(reinterpret_cast<const float2*>(static_cast<const float*>(v) + row + e));
    } else {
      return widen_pair<kType>(__ldg(reinterpret_cast<const unsigned int*>(static_cast<const uint16_t*>(v) + row + e)));
    }
  } else {
    return make_float2(element<kType>(v, row + e), e + 1 < d ? element<kType>(v, row + e + 1) : 0.0f);
  }
}

// One warp, one query head h (q already in qs), one split s of the row: its keys in
// chunks of 32, a lane per key for the scores, a lane per pair of elements for V.
// count == 1: the warp writes the normalised output; otherwise the split's partial.
template <TensorType kType, bool kVec>
__device__ void split_of_head(const DevicePagedKv& kv, const float* __restrict__ qs, int64_t kvh, int d,
                              float scale, const RowSplits& sp, int64_t s, float* __restrict__ partial_item,
                              float* __restrict__ out_item) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int64_t begin = s * sp.per;
  const int64_t end = begin + sp.per < sp.keys ? begin + sp.per : sp.keys;
  // A chunk starts at a multiple of 32 (sp.per is one), so with pages of >= 32 positions
  // its keys are consecutive rows of one page.
  const bool one_page = kv.page_shift >= 5;
  float running_max = -INFINITY, lane_sum = 0.0f;  // lane_sum: this lane's keys' share of the sum
  float2 acc[kMaxPairsPerLane];
#pragma unroll
  for (int r = 0; r < kMaxPairsPerLane; ++r) acc[r] = make_float2(0.0f, 0.0f);

  for (int64_t base = begin; base < end; base += kChunk) {
    const int64_t j = base + lane;
    const bool valid = j < end;
    int64_t row = 0;
    float score = -INFINITY;
    if (valid) {
      row = kv.row_offset(kvh, j);
      score = dot_row<kType, kVec>(qs, kv.k, row, d) * scale;
    }
    float chunk_max = score;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2)
      chunk_max = fmaxf(chunk_max, __shfl_xor_sync(kFull, chunk_max, offset));
    const float new_max = fmaxf(running_max, chunk_max);  // lane 0's key is valid: finite
    const float correction = __expf(running_max - new_max);  // 0 on the first chunk
    const float p = valid ? __expf(score - new_max) : 0.0f;
    lane_sum = lane_sum * correction + p;
    running_max = new_max;
#pragma unroll
    for (int r = 0; r < kMaxPairsPerLane; ++r) {
      acc[r].x *= correction;
      acc[r].y *= correction;
    }
    const int cnt = static_cast<int>(end - base < kChunk ? end - base : kChunk);  // the warp's, >= 1
    const int64_t row0 = shfl_i64(row, 0);
#pragma unroll(kVec ? 4 : 1)
    for (int jj = 0; jj < cnt; ++jj) {
      const float pj = __shfl_sync(kFull, p, jj);
      const int64_t rj = one_page ? row0 + static_cast<int64_t>(jj) * d : shfl_i64(row, jj);
#pragma unroll
      for (int r = 0; r < kMaxPairsPerLane; ++r) {
        const int e = 2 * (lane + 32 * r);
        if (e < d) {
          const float2 vv = v_pair<kType, kVec>(kv.v, rj, e, d);
          acc[r].x = fmaf(pj, vv.x, acc[r].x);
          acc[r].y = fmaf(pj, vv.y, acc[r].y);
        }
      }
    }
  }
  float sum = lane_sum;
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFull, sum, offset);

  if (out_item != nullptr) {  // the row's only split
#pragma unroll
    for (int r = 0; r < kMaxPairsPerLane; ++r) {
      const int e = 2 * (lane + 32 * r);
      if (e < d) out_item[e] = acc[r].x / sum;
      if (e + 1 < d) out_item[e + 1] = acc[r].y / sum;
    }
  } else {
    float* o = partial_item + s * partial_floats(d);
    if (lane == 0) {
      o[0] = running_max;
      o[1] = sum;
    }
#pragma unroll
    for (int r = 0; r < kMaxPairsPerLane; ++r) {
      const int e = 2 * (lane + 32 * r);
      if (e < d) o[2 + e] = acc[r].x;
      if (e + 1 < d) o[2 + e + 1] = acc[r].y;
    }
  }
}

// The block's work for one row and KV head: warp w takes the group's query heads w,
// w + warps, ..., each over the splits blockIdx.y, blockIdx.y + gridDim.y, ...
template <TensorType kType, bool kVec>
__device__ void heads_of_block(const float* __restrict__ q, const DevicePagedKv& kv, float* __restrict__ partial,
                               float* __restrict__ out, float* __restrict__ qs, int64_t t, int64_t kvh,
                               int64_t q_heads, int64_t group, int d, int64_t splits_cap, float scale,
                               int64_t keys, int64_t per, int64_t count) {
  const RowSplits sp{keys, per, count};
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int warps = static_cast<int>(blockDim.x / 32);
  for (int64_t hh = warp; hh < group; hh += warps) {
    const int64_t item = t * q_heads + kvh * group + hh;  // (row, query head)
    __syncwarp();  // the previous head's reads of qs are done
    for (int i = lane; i < d; i += 32) qs[i] = q[item * d + i];
    __syncwarp();
    float* partial_item = partial + item * splits_cap * partial_floats(d);
    float* out_item = sp.count == 1 ? out + item * d : nullptr;
    for (int64_t s = blockIdx.y; s < sp.count; s += gridDim.y)
      split_of_head<kType, kVec>(kv, qs, kvh, d, scale, sp, s, partial_item, out_item);
  }
}

// One block per (row t, KV head, blockIdx.y), one warp per query head of the group: the
// group's warps read the same K/V rows (L1 hits). The six (dtype, aligned) paths in one
// kernel took 132 registers (each alone ~76); capped at 96 ptxas still spills nothing
// (sm_80, sm_90), and 128-thread blocks fit 5 per SM instead of 3. (__maxnreg__ is
// CUDA 12.4's; before it, 128 through the launch bounds.)
#if __CUDACC_VER_MAJOR__ > 12 || (__CUDACC_VER_MAJOR__ == 12 && __CUDACC_VER_MINOR__ >= 4)
#define BS_ATTENTION_ROWS_REGS __maxnreg__(96)
#else
#define BS_ATTENTION_ROWS_REGS __launch_bounds__(32 * kMaxWarps, 2)
#endif
__global__ void BS_ATTENTION_ROWS_REGS split_pass(const float* __restrict__ q, const int32_t* __restrict__ qpos,
                           const DevicePagedKv* __restrict__ views, float* __restrict__ partial,
                           float* __restrict__ out, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                           int64_t splits_cap, float scale) {
  const int64_t t = blockIdx.x / kv_heads, kvh = blockIdx.x % kv_heads;
  const DevicePagedKv& kv = views[t];
  const RowSplits sp = row_splits(qpos[t], kv.capacity, splits_cap);
  const int64_t group = q_heads / kv_heads;
  const int d = static_cast<int>(head_dim);
  if (sp.count == 0) {  // no key: zeros, as the combine gives a row without keys
    if (blockIdx.y != 0) return;
    for (int64_t hh = threadIdx.x / 32; hh < group; hh += blockDim.x / 32)
      for (int i = static_cast<int>(threadIdx.x % 32); i < d; i += 32) out[(t * q_heads + kvh * group + hh) * d + i] = 0.0f;
    return;
  }
  if (blockIdx.y >= sp.count) return;
  extern __shared__ float4 shared_q[];  // [warps][round_up(head_dim, 4)]
  float* qs = reinterpret_cast<float*>(shared_q) + (threadIdx.x / 32) * ((d + 3) / 4 * 4);
  const int64_t eb = kv.dtype == TensorType::F32 ? 4 : 2;
  const bool vec = ((reinterpret_cast<uintptr_t>(kv.k) | reinterpret_cast<uintptr_t>(kv.v)) % 16 == 0) &&
                   (head_dim * eb) % 16 == 0 && (kv.page_stride * eb) % 16 == 0 && (kv.head_stride * eb) % 16 == 0;
  if (kv.dtype == TensorType::F32) {
    if (vec) heads_of_block<TensorType::F32, true>(q, kv, partial, out, qs, t, kvh, q_heads, group, d, splits_cap, scale, sp.keys, sp.per, sp.count);
    else heads_of_block<TensorType::F32, false>(q, kv, partial, out, qs, t, kvh, q_heads, group, d, splits_cap, scale, sp.keys, sp.per, sp.count);
  } else if (kv.dtype == TensorType::F16) {
    if (vec) heads_of_block<TensorType::F16, true>(q, kv, partial, out, qs, t, kvh, q_heads, group, d, splits_cap, scale, sp.keys, sp.per, sp.count);
    else heads_of_block<TensorType::F16, false>(q, kv, partial, out, qs, t, kvh, q_heads, group, d, splits_cap, scale, sp.keys, sp.per, sp.count);
  } else {
    if (vec) heads_of_block<TensorType::BF16, true>(q, kv, partial, out, qs, t, kvh, q_heads, group, d, splits_cap, scale, sp.keys, sp.per, sp.count);
    else heads_of_block<TensorType::BF16, false>(q, kv, partial, out, qs, t, kvh, q_heads, group, d, splits_cap, scale, sp.keys, sp.per, sp.count);
  }
}
#undef BS_ATTENTION_ROWS_REGS

// One warp per (row, head) of a row with >= 2 splits: the splits' partials rescaled to
// their common maximum (rows of one split or none were written by split_pass).
__global__ void combine(const float* __restrict__ partial, const int32_t* __restrict__ qpos,
                        const DevicePagedKv* __restrict__ views, float* __restrict__ out, int64_t n,
                        int64_t q_heads, int64_t d, int64_t splits_cap) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kCombineWarps + threadIdx.x / 32;
  if (item >= n * q_heads) return;
  const int lane = threadIdx.x % 32;
  const int64_t t = item / q_heads;
  const RowSplits sp = row_splits(qpos[t], views[t].capacity, splits_cap);
  if (sp.count <= 1) return;
  const float* first = partial + item * splits_cap * partial_floats(d);
  float m = -INFINITY;
  for (int64_t s = 0; s < sp.count; ++s) m = fmaxf(m, first[s * partial_floats(d)]);
  float total = 0.0f, acc[kCombinePerLane] = {};
  if (m != -INFINITY) {
    for (int64_t s = 0; s < sp.count; ++s) {
      const float* p = first + s * partial_floats(d);
      if (p[0] == -INFINITY) continue;
      const float w = __expf(p[0] - m);
      total += p[1] * w;
#pragma unroll
      for (int r = 0; r < kCombinePerLane; ++r) {
        const int64_t i = lane + 32 * r;
        if (i < d) acc[r] += p[2 + i] * w;
      }
    }
  }
  float* o = out + item * d;  // item = t * q_heads + h
#pragma unroll
  for (int r = 0; r < kCombinePerLane; ++r) {
    const int64_t i = lane + 32 * r;
    if (i < d) o[i] = total > 0.0f ? acc[r] / total : 0.0f;
  }
}

}  // namespace

void attention_rows(const float* q, const int32_t* qpos, const DevicePagedKv* views, float* out, int64_t n,
                    int64_t q_heads, int64_t kv_heads, int64_t head_dim, float scale, int64_t max_keys,
                    DeviceAllocation& scratch, cudaStream_t stream) {
  if (head_dim > 2 * 32 * kMaxPairsPerLane)
    throw std::invalid_argument("cuda attention_rows: head_dim " + std::to_string(head_dim) + " > 256");
  if (kv_heads <= 0 || q_heads % kv_heads != 0)
    throw std::invalid_argument("cuda attention_rows: " + std::to_string(q_heads) + " query heads over " +
                                std::to_string(kv_heads) + " KV heads");
  if (n <= 0 || q_heads <= 0 || head_dim <= 0) return;
  const int64_t splits_cap = std::clamp<int64_t>((max_keys + kKeysPerSplit - 1) / kKeysPerSplit, 1, kMaxSplits);
  const size_t bytes = static_cast<size_t>(n * q_heads * splits_cap * partial_floats(head_dim)) * sizeof(float);
  if (scratch.bytes() < bytes) scratch = DeviceAllocation(bytes);
  const int64_t group = q_heads / kv_heads;
  const int64_t warps = std::min<int64_t>(group, kMaxWarps);
  const int64_t pairs = n * kv_heads;  // (row, KV head)
  if (pairs > 0x7fffffff)
    throw std::invalid_argument("cuda attention_rows: " + std::to_string(pairs) + " (row, KV head) pairs");
  const int64_t split_blocks =
      std::min(splits_cap, std::max(kMinSplitBlocks, (kTargetBlocks + pairs - 1) / pairs));
  const size_t shared = static_cast<size_t>(warps * ((head_dim + 3) / 4 * 4)) * sizeof(float);
  split_pass<<<dim3(static_cast<unsigned>(pairs), static_cast<unsigned>(split_blocks)),
               static_cast<unsigned>(32 * warps), shared, stream>>>(q, qpos, views, scratch.as<float>(), out, q_heads,
                                                                     kv_heads, head_dim, splits_cap, scale);
  BS_CUDA_CHECK(cudaGetLastError());
  combine<<<static_cast<unsigned>((n * q_heads + kCombineWarps - 1) / kCombineWarps), 32 * kCombineWarps, 0,
            stream>>>(scratch.as<float>(), qpos, views, out, n, q_heads, head_dim, splits_cap);
  BS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace bs::kernels::cuda
