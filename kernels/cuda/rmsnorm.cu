#include "kernels/cuda/rmsnorm.cuh"

#include "kernels/cuda/cuda_check.h"
#include "kernels/op_math.h"

namespace bs::kernels::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void rmsnorm_rows(const float* __restrict__ x, const float* __restrict__ weight, float* out, int64_t dim,
                             float eps) {
  const float* row = x + blockIdx.x * dim;
  float* dst = out + blockIdx.x * dim;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) ss += row[i] * row[i];
  for (int offset = 16; offset > 0; offset /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, offset);
  __shared__ float warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (threadIdx.x == 0) warp_sums[0] = v;
  }
  __syncthreads();
  const float scale = op_math::rms_inv<float>(warp_sums[0], dim, eps);
  for (int64_t i = threadIdx.x; i < dim; i += kThreads) dst[i] = row[i] * scale * weight[i];
}

}  // namespace

void rmsnorm(const float* x, const float* weight, float* out, int64_t n, int64_t dim, float eps, cudaStream_t stream) {
  if (n <= 0 || dim <= 0) return;
  rmsnorm_rows<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, weight, out, dim, eps);
  BS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace bs::kernels::cuda
