#include "kernels/cuda/attention_mass.cuh"

#include <math_constants.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"

namespace bs::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxHeadDim = 256;

// The block's reduction of one value per thread (max or sum), every thread gets it.
template <bool kMax>
__device__ float block_reduce(float x, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) {
    const float y = __shfl_xor_sync(0xffffffffu, x, o);
    x = kMax ? fmaxf(x, y) : x + y;
  }
  const int lane = static_cast<int>(threadIdx.x & 31), warp = static_cast<int>(threadIdx.x >> 5);
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  if (warp == 0) {
    x = lane < kThreads / 32 ? scratch[lane] : (kMax ? -CUDART_INF_F : 0.0f);
    for (int o = 16; o > 0; o >>= 1) {
      const float y = __shfl_xor_sync(0xffffffffu, x, o);
      x = kMax ? fmaxf(x, y) : x + y;
    }
    if (lane == 0) scratch[0] = x;
  }
  __syncthreads();
  const float r = scratch[0];
  __syncthreads();  // scratch is free for the next reduction
  return r;
}

template <TensorType kDtype>
__global__ void __launch_bounds__(kThreads)
    mass_per_row(const float* __restrict__ q, const int32_t* __restrict__ qpos, DevicePagedKv kv, int64_t n,
                 int64_t q_heads, int64_t n_kv, float scale, double* __restrict__ out) {
  __shared__ float qs[kMaxHeadDim];
  __shared__ float scratch[kThreads / 32];
  const int64_t h = blockIdx.x / n, i = blockIdx.x % n;
  const int64_t count = min(n_kv, static_cast<int64_t>(qpos[i]) + 1);
  if (count <= 0) return;  // the whole block
  const int64_t hd = kv.head_dim, g = h / (q_heads / kv.kv_heads);
  for (int64_t d = threadIdx.x; d < hd; d += kThreads) qs[d] = q[(i * q_heads + h) * hd + d];
  __syncthreads();
  auto score = [&](int64_t j) {
    const int64_t row = kv.row_offset(g, j);
    float s = 0.0f;
    for (int64_t d = 0; d < hd; ++d) s = fmaf(qs[d], load_kv(kDtype, kv.k, row + d), s);
    return s * scale;
  };
  float mx = -CUDART_INF_F;
  for (int64_t j = threadIdx.x; j < count; j += kThreads) mx = fmaxf(mx, score(j));
  mx = block_reduce<true>(mx, scratch);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < count; j += kThreads) sum += expf(score(j) - mx);
  sum = block_reduce<false>(sum, scratch);
  for (int64_t j = threadIdx.x; j < count; j += kThreads)
    atomicAdd(out + j, static_cast<double>(expf(score(j) - mx) / sum));
}

}  // namespace

void attention_mass(const float* q, const int32_t* qpos, const DevicePagedKv& kv, int64_t n, int64_t q_heads,
                    int64_t n_kv, float scale, double* out, cudaStream_t stream) {
  if (kv.head_dim > kMaxHeadDim)
    throw std::invalid_argument("cuda attention_mass: head_dim " + std::to_string(kv.head_dim) + " > 256");
  if (n_kv <= 0) return;
  BS_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(n_kv) * sizeof(double), stream));
  if (n <= 0) return;
  const dim3 grid(static_cast<unsigned>(n * q_heads)), block(kThreads);
  if (kv.dtype == TensorType::F32)
    mass_per_row<TensorType::F32><<<grid, block, 0, stream>>>(q, qpos, kv, n, q_heads, n_kv, scale, out);
  else if (kv.dtype == TensorType::F16)
    mass_per_row<TensorType::F16><<<grid, block, 0, stream>>>(q, qpos, kv, n, q_heads, n_kv, scale, out);
  else
    mass_per_row<TensorType::BF16><<<grid, block, 0, stream>>>(q, qpos, kv, n, q_heads, n_kv, scale, out);
  BS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace bs::kernels::cuda
