#include "kernels/cuda/residual_add.cuh"

#include "kernels/cuda/cuda_check.h"

namespace bs::kernels::cuda {
namespace {

__global__ void add_elements(float* __restrict__ y, const float* __restrict__ x, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] += x[i];
}

}  // namespace

void residual_add(float* y, const float* x, int64_t count, cudaStream_t stream) {
  if (count <= 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  add_elements<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), kThreads, 0, stream>>>(y, x, count);
  BS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace bs::kernels::cuda
