#include "kernels/cuda/top_k.cuh"

#include <stdexcept>

#include "kernels/cuda/cuda_check.h"
#include "kernels/op_math.h"

namespace bs::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// One thread per index i: rank(i) = how many indices come before it.
__global__ void rank_and_place(const double* __restrict__ score, int64_t n, int64_t k, int32_t* __restrict__ out) {
  __shared__ double tile[kThreads];
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const double mine = i < n ? score[i] : 0.0;
  int64_t rank = 0;
  for (int64_t base = 0; base < n; base += kThreads) {
    const int64_t j = base + threadIdx.x;
    tile[threadIdx.x] = j < n ? score[j] : 0.0;
    __syncthreads();
    const int64_t count = n - base < kThreads ? n - base : kThreads;
    if (i < n)
      for (int64_t u = 0; u < count; ++u) rank += op_math::ranks_before(tile[u], base + u, mine, i) ? 1 : 0;
    __syncthreads();
  }
  if (i < n && rank < k) out[rank] = static_cast<int32_t>(i);
}

}  // namespace

void top_k(const double* score, int64_t n, int64_t k, int32_t* out, cudaStream_t stream) {
  if (k < 0 || k > n) throw std::invalid_argument("cuda top_k: k must be in [0, n]");
  if (k == 0) return;
  rank_and_place<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(score, n, k, out);
  BS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace bs::kernels::cuda
