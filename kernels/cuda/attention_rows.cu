#include "kernels/cuda/attention_rows.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"

namespace bs::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxDimPerLane = 8;    // head_dim <= 32 * 8
// A warp walks its split's keys one after another (dot, reduce, exp, V), so a split is
// latency-bound: 256 keys per split made one row over 32 keys cost 57 us per layer on an
// H200 (Nsight Compute, 2026-11-26); 64 gives 4x the warps for the same keys.
constexpr int64_t kKeysPerSplit = 64;
constexpr int64_t kMaxSplits = 64;

// A split's partial result: [max, sum, acc[head_dim]] (acc not yet divided by sum).
__host__ __device__ inline int64_t partial_floats(int64_t head_dim) { return head_dim + 2; }

// One warp per (row, head, split): lane l holds elements l, l + 32, ... of the query and
// of the running output.
__global__ void split_pass(const float* __restrict__ q, const int32_t* __restrict__ qpos,
                           const DevicePagedKv* __restrict__ views, float* __restrict__ partial, int64_t n,
                           int64_t q_heads, int64_t kv_heads, int64_t d, int64_t splits, float scale) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (item >= n * q_heads * splits) return;
  const int lane = threadIdx.x % 32;
  const int64_t s = item % splits, h = (item / splits) % q_heads, t = item / (splits * q_heads);
  const DevicePagedKv& kv = views[t];
  const int64_t kvh = h / (q_heads / kv_heads);
  const int64_t keys = qpos[t] + 1 < kv.capacity ? qpos[t] + 1 : kv.capacity;  // <= 0: no key
  const int64_t per = (keys + splits - 1) / splits;
  const int64_t begin = s * per, end = begin + per < keys ? begin + per : keys;
  const float* qv = q + (t * q_heads + h) * d;
  float qr[kMaxDimPerLane], acc[kMaxDimPerLane];
  for (int r = 0; r < kMaxDimPerLane; ++r) {
    const int64_t i = lane + 32 * r;
    qr[r] = i < d ? qv[i] : 0.0f;
    acc[r] = 0.0f;
  }
  float running_max = -INFINITY, denom = 0.0f;
  for (int64_t j = begin; j < end; ++j) {
    const int64_t row = kv.row_offset(kvh, j);
    float dot = 0.0f;
    for (int r = 0; r < kMaxDimPerLane; ++r) {
      const int64_t i = lane + 32 * r;
      if (i < d) dot += qr[r] * load_kv(kv.dtype, kv.k, row + i);
    }
    for (int offset = 16; offset > 0; offset /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    dot *= scale;
    const float new_max = fmaxf(running_max, dot);
    const float correction = __expf(running_max - new_max);  // 0 on the first key
    const float p = __expf(dot - new_max);
    denom = denom * correction + p;
    for (int r = 0; r < kMaxDimPerLane; ++r) {
      const int64_t i = lane + 32 * r;
      if (i < d) acc[r] = acc[r] * correction + p * load_kv(kv.dtype, kv.v, row + i);
    }
    running_max = new_max;
  }
  float* out = partial + item * partial_floats(d);
  if (lane == 0) {
    out[0] = running_max;  // -inf for a split without keys
    out[1] = denom;
  }
  for (int r = 0; r < kMaxDimPerLane; ++r) {
    const int64_t i = lane + 32 * r;
    if (i < d) out[2 + i] = acc[r];
  }
}

// One warp per (row, head): the splits' partials rescaled to their common maximum.
__global__ void combine(const float* __restrict__ partial, float* __restrict__ out, int64_t n, int64_t q_heads,
                        int64_t d, int64_t splits) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (item >= n * q_heads) return;
  const int lane = threadIdx.x % 32;
  const float* first = partial + item * splits * partial_floats(d);
  float m = -INFINITY;
  for (int64_t s = 0; s < splits; ++s) m = fmaxf(m, first[s * partial_floats(d)]);
  float total = 0.0f, acc[kMaxDimPerLane] = {};
  if (m != -INFINITY) {
    for (int64_t s = 0; s < splits; ++s) {
      const float* p = first + s * partial_floats(d);
      if (p[0] == -INFINITY) continue;  // a split without keys
      const float w = __expf(p[0] - m);
      total += p[1] * w;
      for (int r = 0; r < kMaxDimPerLane; ++r) {
        const int64_t i = lane + 32 * r;
        if (i < d) acc[r] += p[2 + i] * w;
      }
    }
  }
  float* o = out + item * d;  // item = t * q_heads + h
  for (int r = 0; r < kMaxDimPerLane; ++r) {
    const int64_t i = lane + 32 * r;
    if (i < d) o[i] = total > 0.0f ? acc[r] / total : 0.0f;
  }
}

}  // namespace

void attention_rows(const float* q, const int32_t* qpos, const DevicePagedKv* views, float* out, int64_t n,
                    int64_t q_heads, int64_t kv_heads, int64_t head_dim, float scale, int64_t max_keys,
                    DeviceAllocation& scratch, cudaStream_t stream) {
  if (head_dim > 32 * kMaxDimPerLane)
    throw std::invalid_argument("cuda attention_rows: head_dim " + std::to_string(head_dim) + " > 256");
  if (kv_heads <= 0 || q_heads % kv_heads != 0)
    throw std::invalid_argument("cuda attention_rows: " + std::to_string(q_heads) + " query heads over " +
                                std::to_string(kv_heads) + " KV heads");
  if (n <= 0) return;
  const int64_t splits = std::clamp<int64_t>((max_keys + kKeysPerSplit - 1) / kKeysPerSplit, 1, kMaxSplits);
  const size_t bytes = static_cast<size_t>(n * q_heads * splits * partial_floats(head_dim)) * sizeof(float);
  if (scratch.bytes() < bytes) scratch = DeviceAllocation(bytes);
  const int64_t items = n * q_heads * splits;
  split_pass<<<static_cast<unsigned>((items + kWarpsPerBlock - 1) / kWarpsPerBlock), 32 * kWarpsPerBlock, 0,
               stream>>>(q, qpos, views, scratch.as<float>(), n, q_heads, kv_heads, head_dim, splits, scale);
  BS_CUDA_CHECK(cudaGetLastError());
  combine<<<static_cast<unsigned>((n * q_heads + kWarpsPerBlock - 1) / kWarpsPerBlock), 32 * kWarpsPerBlock, 0,
            stream>>>(scratch.as<float>(), out, n, q_heads, head_dim, splits);
  BS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace bs::kernels::cuda
