#include "kernels/cuda/index_check.cuh"

#include "kernels/cuda/cuda_check.h"

namespace bs::kernels::cuda {
namespace {

__global__ void check_range(const int32_t* __restrict__ idx, int64_t n, int64_t limit, int32_t code, int32_t* flag) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if (idx[i] < 0 || idx[i] >= limit) atomicCAS(flag, 0, code);
}

}  // namespace

void flag_out_of_range(const int32_t* idx, int64_t n, int64_t limit, int32_t code, int32_t* flag, cudaStream_t stream) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  check_range<<<static_cast<unsigned>(blocks < 1024 ? blocks : 1024), kThreads, 0, stream>>>(idx, n, limit, code, flag);
  BS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace bs::kernels::cuda
