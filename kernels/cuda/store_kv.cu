#include "kernels/cuda/store_kv.cuh"

#include "kernels/cuda/cuda_check.h"

namespace bs::kernels::cuda {
namespace {

// blockIdx.y: the token; threads stride over its kv_heads * head_dim elements.
__global__ void store_rows(DevicePagedKv kv, const int32_t* __restrict__ pos, const float* __restrict__ k,
                           const float* __restrict__ v) {
  const int64_t t = blockIdx.y, width = kv.kv_heads * kv.head_dim;
  if (pos[t] < 0 || pos[t] >= kv.capacity) return;  // no memory touched (flagged by the caller)
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < width;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t h = e / kv.head_dim, i = e % kv.head_dim;
    const int64_t at = kv.row_offset(h, pos[t]) + i;
    store_kv_element(kv.dtype, kv.k, at, k[t * width + e]);
    if (v) store_kv_element(kv.dtype, kv.v, at, v[t * width + e]);
  }
}

// blockIdx.y: the row t, written into its own cache views[t]; a position outside that
// cache sets *flag to `code` (first failure wins) and writes nothing.
__global__ void store_rows_each(const DevicePagedKv* __restrict__ views, const int32_t* __restrict__ pos,
                                const float* __restrict__ k, const float* __restrict__ v, int64_t width,
                                int32_t* __restrict__ flag, int32_t code) {
  const int64_t t = blockIdx.y;
  const DevicePagedKv& kv = views[t];
  const int64_t p = pos[t];
  if (p < 0 || p >= kv.capacity) {
    if (blockIdx.x == 0 && threadIdx.x == 0) atomicCAS(flag, 0, code);
    return;
  }
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < width;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t h = e / kv.head_dim, i = e % kv.head_dim;
    const int64_t at = kv.row_offset(h, p) + i;
    store_kv_element(kv.dtype, kv.k, at, k[t * width + e]);
    if (v) store_kv_element(kv.dtype, kv.v, at, v[t * width + e]);
  }
}

}  // namespace

void store_kv_rows(const DevicePagedKv* views, const int32_t* pos, const float* k, const float* v, int64_t n,
                   int64_t kv_heads, int64_t head_dim, int32_t* flag, int32_t code, cudaStream_t stream) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  const int64_t width = kv_heads * head_dim;
  const unsigned blocks_x = static_cast<unsigned>((width + kThreads - 1) / kThreads);
  for (int64_t t0 = 0; t0 < n; t0 += 65535) {  // gridDim.y is at most 65535
    const int64_t rows = n - t0 < 65535 ? n - t0 : 65535;
    store_rows_each<<<dim3(blocks_x, static_cast<unsigned>(rows)), kThreads, 0, stream>>>(
        views + t0, pos + t0, k + t0 * width, v ? v + t0 * width : nullptr, width, flag, code);
    BS_CUDA_CHECK(cudaGetLastError());
  }
}

void store_kv(const DevicePagedKv& kv, const int32_t* pos, const float* k, const float* v, int64_t n,
              cudaStream_t stream) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  const unsigned blocks_x = static_cast<unsigned>((kv.kv_heads * kv.head_dim + kThreads - 1) / kThreads);
  for (int64_t t0 = 0; t0 < n; t0 += 65535) {  // gridDim.y is at most 65535
    const int64_t rows = n - t0 < 65535 ? n - t0 : 65535;
    const int64_t width = kv.kv_heads * kv.head_dim;
    store_rows<<<dim3(blocks_x, static_cast<unsigned>(rows)), kThreads, 0, stream>>>(
        kv, pos + t0, k + t0 * width, v ? v + t0 * width : nullptr);
    BS_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace bs::kernels::cuda
