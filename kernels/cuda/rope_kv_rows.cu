#include "kernels/cuda/rope_kv_rows.cuh"

#include "kernels/cuda/cuda_check.h"
#include "kernels/op_math.h"

namespace bs::kernels::cuda {
namespace {

// One thread per (head, row, pair).
__global__ void rotate_rows(DevicePagedKv kv, int64_t first, int64_t m, const float* __restrict__ cos_sin,
                            bool interleaved) {
  const int64_t half = kv.head_dim / 2, count = kv.kv_heads * m * half;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t h = e / (m * half), j = first + (e / half) % m, i = e % half;
    const int64_t row = kv.row_offset(h, j);
    const int64_t a = row + (interleaved ? 2 * i : i), b = row + (interleaved ? 2 * i + 1 : i + half);
    float y0, y1;
    op_math::rotate_pair(load_kv(kv.dtype, kv.k, a), load_kv(kv.dtype, kv.k, b), cos_sin[2 * i], cos_sin[2 * i + 1],
                         y0, y1);
    store_kv_element(kv.dtype, kv.k, a, y0);
    store_kv_element(kv.dtype, kv.k, b, y1);
  }
}

}  // namespace

void rope_kv_rows(const DevicePagedKv& kv, int64_t first, int64_t m, const float* cos_sin, bool interleaved,
                  cudaStream_t stream) {
  if (m <= 0 || kv.kv_heads <= 0 || kv.head_dim < 2) return;
  constexpr int kThreads = 256;
  const int64_t count = kv.kv_heads * m * (kv.head_dim / 2);
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  rotate_rows<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), kThreads, 0, stream>>>(kv, first, m, cos_sin,
                                                                                               interleaved);
  BS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace bs::kernels::cuda
