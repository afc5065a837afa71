#include "kernels/cuda/swiglu.cuh"

#include "kernels/cuda/cuda_check.h"
#include "kernels/op_math.h"

namespace bs::kernels::cuda {
namespace {

__global__ void swiglu_elements(const float* __restrict__ gate_up, float* __restrict__ out, int64_t n, int64_t ff) {
  const int64_t total = n * ff;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = e / ff, i = e % ff;
    out[e] = op_math::silu_mul(gate_up[t * 2 * ff + i], gate_up[t * 2 * ff + ff + i]);
  }
}

}  // namespace

void swiglu(const float* gate_up, float* out, int64_t n, int64_t ff, cudaStream_t stream) {
  if (n <= 0 || ff <= 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (n * ff + kThreads - 1) / kThreads;
  swiglu_elements<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), kThreads, 0, stream>>>(gate_up, out, n, ff);
  BS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace bs::kernels::cuda
