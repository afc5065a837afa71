#include "kernels/cuda/sample.cuh"

#include <cub/device/device_segmented_radix_sort.cuh>

#include <cstdint>
#include <stdexcept>

#include "kernels/cuda/cuda_check.h"

namespace bs::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// argmax_rows: one block per row, wide and with several 16-byte loads in flight per
// thread. The first version (256 threads, one 4-byte load at a time) took 195 us for a
// 128,256-entry row on an H200 (Nsight Compute, 2026-11-26): one multiprocessor waiting
// on one load per thread.
constexpr int kArgmaxThreads = 1024;
constexpr int kArgmaxLoads = 4;  // float4 loads per thread before the compares

// Whether (v, i) beats (best, at): larger, or equal and earlier (std::max_element's
// first maximum). A NaN never beats anything.
__device__ inline void consider(float v, int64_t i, float& best, int64_t& at) {
  if (v > best || (v == best && i < at)) best = v, at = i;
}

// For each row: greedy rows get their argmax here; sampled rows are left to pick_sorted.
// `vector`: every row starts 16-byte aligned (vocab % 4 == 0 and an aligned base), so a
// thread reads 4 logits per load. The winner is the same whatever the order of visits:
// the largest value, the smallest index among equals.
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_rows(const float* __restrict__ logits, int64_t vocab, const SampleRow* __restrict__ rows,
                int32_t* __restrict__ tokens, bool vector) {
  const int64_t r = blockIdx.x;
  if (rows[r].temperature > 0.0f && vocab > 1) return;
  const float* l = logits + r * vocab;
  float best = -INFINITY;
  int64_t at = INT64_MAX;  // no index yet
  if (vector) {
    const int64_t quads = vocab / 4;
    const float4* l4 = reinterpret_cast<const float4*>(l);
    for (int64_t q0 = threadIdx.x; q0 < quads; q0 += static_cast<int64_t>(blockDim.x) * kArgmaxLoads) {
      float4 v[kArgmaxLoads];
#pragma unroll
      for (int k = 0; k < kArgmaxLoads; ++k) {
        const int64_t q = q0 + static_cast<int64_t>(k) * blockDim.x;
        v[k] = q < quads ? l4[q] : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
      }
#pragma unroll
      for (int k = 0; k < kArgmaxLoads; ++k) {
        const int64_t q = q0 + static_cast<int64_t>(k) * blockDim.x;
        if (q >= quads) break;
        consider(v[k].x, 4 * q, best, at);
        consider(v[k].y, 4 * q + 1, best, at);
        consider(v[k].z, 4 * q + 2, best, at);
        consider(v[k].w, 4 * q + 3, best, at);
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) consider(l[i], i, best, at);
  }
  __shared__ float vals[kArgmaxThreads];
  __shared__ int64_t idx[kArgmaxThreads];
  vals[threadIdx.x] = best;
  idx[threadIdx.x] = at;
  __syncthreads();
  for (int stride = kArgmaxThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride)
      consider(vals[threadIdx.x + stride], idx[threadIdx.x + stride], vals[threadIdx.x], idx[threadIdx.x]);
    __syncthreads();
  }
  // std::max_element keeps a NaN first element (nothing compares above it): so does this.
  if (threadIdx.x == 0) tokens[r] = static_cast<int32_t>(l[0] != l[0] || idx[0] >= vocab ? 0 : idx[0]);
}

__global__ void fill_iota(int32_t* __restrict__ iota, int32_t* __restrict__ offsets, int64_t n, int64_t vocab) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n * vocab;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    iota[e] = static_cast<int32_t>(e % vocab);
    if (e % vocab == 0) offsets[e / vocab] = static_cast<int32_t>(e);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) offsets[n] = static_cast<int32_t>(n * vocab);
}

// One block per sampled row, over its logits sorted descending (ties: lower index first).
__global__ void pick_sorted(const float* __restrict__ sorted, const int32_t* __restrict__ order, int64_t vocab,
                            const SampleRow* __restrict__ rows, int32_t* __restrict__ tokens) {
  const int64_t r = blockIdx.x;
  const SampleRow row = rows[r];
  if (row.temperature <= 0.0f || vocab <= 1) return;
  int64_t keep = vocab;
  if (row.top_k > 0 && row.top_k < vocab) keep = row.top_k;
  keep = keep < kMaxCandidates ? keep : kMaxCandidates;
  const float* l = sorted + r * vocab;
  const int32_t* id = order + r * vocab;
  __shared__ double probs[kMaxCandidates];
  const float inv_t = 1.0f / row.temperature;
  const double mx = l[0];
  for (int64_t i = threadIdx.x; i < keep; i += blockDim.x) probs[i] = exp((static_cast<double>(l[i]) - mx) * inv_t);
  __syncthreads();
  if (threadIdx.x != 0) return;
  // The host's order of every sum (kernels/sampling.cpp: pick_token).
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += probs[i];
  if (row.top_p < 1.0f) {
    double cum = 0;
    for (int64_t i = 0; i < keep; ++i) {
      cum += probs[i] / sum;
      if (cum >= row.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (keep < 2) {
    tokens[r] = id[0];
    return;
  }
  double kept_sum = 0.0;
  for (int64_t i = 0; i < keep; ++i) kept_sum += probs[i];
  double cum = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    cum = i + 1 == keep ? 1.0 : cum + probs[i] / kept_sum;
    if (cum >= row.uniform) {
      tokens[r] = id[i];
      return;
    }
  }
  tokens[r] = id[keep - 1];
}

void* grow(DeviceAllocation& a, size_t bytes) {
  if (a.bytes() < bytes) a = DeviceAllocation(bytes);
  return a.get();
}

}  // namespace

void sample_rows(const float* logits, int64_t n, int64_t vocab, const SampleRow* rows, int32_t* tokens_out,
                 SampleScratch& scratch, cudaStream_t stream) {
  if (n <= 0) return;
  if (n * vocab >= (int64_t{1} << 31)) throw std::invalid_argument("cuda sample_rows: n * vocab must be < 2^31");
  auto* d_rows = static_cast<SampleRow*>(grow(scratch.rows, static_cast<size_t>(n) * sizeof(SampleRow)));
  auto* d_tokens = static_cast<int32_t*>(grow(scratch.tokens, static_cast<size_t>(n) * sizeof(int32_t)));
  BS_CUDA_CHECK(cudaMemcpyAsync(d_rows, rows, static_cast<size_t>(n) * sizeof(SampleRow), cudaMemcpyHostToDevice,
                                stream));
  bool sampled = false;
  for (int64_t r = 0; r < n; ++r) sampled = sampled || (rows[r].temperature > 0.0f && vocab > 1);
  const bool vector = vocab % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  argmax_rows<<<static_cast<unsigned>(n), kArgmaxThreads, 0, stream>>>(logits, vocab, d_rows, d_tokens, vector);
  BS_CUDA_CHECK(cudaGetLastError());
  if (sampled) {
    const size_t cells = static_cast<size_t>(n * vocab);
    auto* sorted = static_cast<float*>(grow(scratch.sorted, cells * sizeof(float)));
    auto* order = static_cast<int32_t*>(grow(scratch.order, cells * sizeof(int32_t)));
    auto* iota = static_cast<int32_t*>(grow(scratch.iota, cells * sizeof(int32_t)));
    auto* offsets = static_cast<int32_t*>(grow(scratch.offsets, static_cast<size_t>(n + 1) * sizeof(int32_t)));
    if (scratch.iota_rows != n || scratch.iota_vocab != vocab) {
      const int64_t blocks = (n * vocab + kThreads - 1) / kThreads;
      fill_iota<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), kThreads, 0, stream>>>(iota, offsets, n,
                                                                                                  vocab);
      BS_CUDA_CHECK(cudaGetLastError());
      scratch.iota_rows = n;
      scratch.iota_vocab = vocab;
    }
    size_t temp_bytes = 0;
    BS_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
        nullptr, temp_bytes, logits, sorted, iota, order, static_cast<int>(n * vocab), static_cast<int>(n), offsets,
        offsets + 1, 0, 32, stream));
    void* temp = grow(scratch.temp, temp_bytes);
    BS_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
        temp, temp_bytes, logits, sorted, iota, order, static_cast<int>(n * vocab), static_cast<int>(n), offsets,
        offsets + 1, 0, 32, stream));
    pick_sorted<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(sorted, order, vocab, d_rows, d_tokens);
    BS_CUDA_CHECK(cudaGetLastError());
  }
  BS_CUDA_CHECK(cudaMemcpyAsync(tokens_out, d_tokens, static_cast<size_t>(n) * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                stream));
}

}  // namespace bs::kernels::cuda
