#include "kernels/cuda/split_qkv.cuh"

#include "kernels/cuda/cuda_check.h"

namespace bs::kernels::cuda {
namespace {

// One thread per element of a qkv row; blockIdx.y is the row.
__global__ void split_rows(const float* __restrict__ qkv, float* __restrict__ q, float* __restrict__ k,
                           float* __restrict__ v, int64_t q_dim, int64_t kv_dim) {
  const int64_t width = q_dim + 2 * kv_dim;
  const int64_t t = blockIdx.y;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < width;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = qkv[t * width + i];
    if (i < q_dim) q[t * q_dim + i] = x;
    else if (i < q_dim + kv_dim) k[t * kv_dim + (i - q_dim)] = x;
    else v[t * kv_dim + (i - q_dim - kv_dim)] = x;
  }
}

}  // namespace

void split_qkv(const float* qkv, float* q, float* k, float* v, int64_t n, int64_t q_dim, int64_t kv_dim,
               cudaStream_t stream) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  const int64_t width = q_dim + 2 * kv_dim;
  const unsigned blocks_x = static_cast<unsigned>((width + kThreads - 1) / kThreads);
  for (int64_t t0 = 0; t0 < n; t0 += 65535) {  // gridDim.y is at most 65535
    const int64_t rows = n - t0 < 65535 ? n - t0 : 65535;
    split_rows<<<dim3(blocks_x, static_cast<unsigned>(rows)), kThreads, 0, stream>>>(
        qkv + t0 * width, q + t0 * q_dim, k + t0 * kv_dim, v + t0 * kv_dim, q_dim, kv_dim);
    BS_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace bs::kernels::cuda
