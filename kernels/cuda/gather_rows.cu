#include "kernels/cuda/gather_rows.cuh"

#include "kernels/cuda/cuda_check.h"

namespace bs::kernels::cuda {
namespace {

// blockIdx.y: the output row; threads stride over its width.
__global__ void gather(const float* __restrict__ src, const int32_t* __restrict__ rows, float* __restrict__ dst,
                       int64_t width) {
  const int64_t i = blockIdx.y;
  const float* from = src + static_cast<int64_t>(rows[i]) * width;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < width;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i * width + c] = from[c];
}

}  // namespace

void gather_rows(const float* src, const int32_t* rows, float* dst, int64_t n, int64_t width, cudaStream_t stream) {
  if (n <= 0 || width <= 0) return;
  constexpr int kThreads = 256;
  const unsigned blocks_x = static_cast<unsigned>((width + kThreads - 1) / kThreads);
  for (int64_t i0 = 0; i0 < n; i0 += 65535) {
    const int64_t count = n - i0 < 65535 ? n - i0 : 65535;
    gather<<<dim3(blocks_x, static_cast<unsigned>(count)), kThreads, 0, stream>>>(src, rows + i0, dst + i0 * width,
                                                                                  width);
    BS_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace bs::kernels::cuda
