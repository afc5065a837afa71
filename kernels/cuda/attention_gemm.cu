#include "kernels/cuda/attention_gemm.cuh"

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_grid.cuh"

namespace bs::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// K and V rows [0, n_kv) of every KV head from the paged cache into contiguous bf16:
// dst [2, kv_heads, n_kv, head_dim].
__global__ void gather_kv_bf16(DevicePagedKv kv, int64_t n_kv, __nv_bfloat16* __restrict__ dst) {
  const int64_t d = kv.head_dim, per = kv.kv_heads * n_kv * d;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < 2 * per;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t which = e / per, r = e % per;
    const int64_t h = r / (n_kv * d), j = (r / d) % n_kv, i = r % d;
    const int64_t at = kv.row_offset(h, j) + i;
    dst[e] = __float2bfloat16_rn(load_kv(kv.dtype, which == 0 ? kv.k : kv.v, at));
  }
}

__global__ void to_bf16(const float* __restrict__ x, __nv_bfloat16* __restrict__ out, int64_t count) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[e] = __float2bfloat16_rn(x[e]);
}

// One block per row of S ([group * rows] rows of n_kv scores, already scaled): row r is
// query row t0 + r % rows of the block; keys past its position are masked. Writes the
// probabilities as bf16 (0 where masked; a row with no key all 0).
__global__ void causal_softmax(const float* __restrict__ scores, __nv_bfloat16* __restrict__ probs,
                               const int32_t* __restrict__ qpos, int64_t t0, int64_t rows, int64_t n_kv) {
  const int64_t r = blockIdx.x;
  const int64_t t = t0 + r % rows;
  const int64_t last = qpos[t] < n_kv - 1 ? qpos[t] : n_kv - 1;  // may be < 0: no key
  const float* s = scores + r * n_kv;
  __nv_bfloat16* p = probs + r * n_kv;
  __shared__ float reduce[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;

  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j <= last; j += blockDim.x) mx = fmaxf(mx, s[j]);
  for (int o = 16; o > 0; o /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) reduce[warp] = mx;
  __syncthreads();
  if (warp == 0) {
    float m = lane < warps ? reduce[lane] : -INFINITY;
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) reduce[0] = m;
  }
  __syncthreads();
  mx = reduce[0];
  __syncthreads();

  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j <= last; j += blockDim.x) sum += __expf(s[j] - mx);
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) reduce[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    float total = lane < warps ? reduce[lane] : 0.0f;
    for (int o = 16; o > 0; o /= 2) total += __shfl_xor_sync(0xffffffffu, total, o);
    if (lane == 0) reduce[0] = total;
  }
  __syncthreads();
  const float inv = reduce[0] > 0.0f ? 1.0f / reduce[0] : 0.0f;
  for (int64_t j = threadIdx.x; j < n_kv; j += blockDim.x)
    p[j] = __float2bfloat16_rn(j <= last ? __expf(s[j] - mx) * inv : 0.0f);
}

void* grow(DeviceAllocation& a, size_t bytes) {
  if (a.bytes() < bytes) a = DeviceAllocation(bytes);
  return a.get();
}

}  // namespace

void attention_gemm(const CublasHandle& cublas, const float* q, const int32_t* qpos, const DevicePagedKv& kv,
                    float* out, int64_t n, int64_t q_heads, int64_t n_kv, float scale, AttentionGemmScratch& scratch,
                    cudaStream_t stream) {
  if (kv.kv_heads <= 0 || q_heads % kv.kv_heads != 0)
    throw std::invalid_argument("cuda attention_gemm: " + std::to_string(q_heads) + " query heads over " +
                                std::to_string(kv.kv_heads) + " KV heads");
  if (n <= 0 || n_kv <= 0) return;
  cublas.use_stream(stream);
  const int64_t d = kv.head_dim, group = q_heads / kv.kv_heads;
  auto* kvc = static_cast<__nv_bfloat16*>(grow(scratch.kv, static_cast<size_t>(2 * kv.kv_heads * n_kv * d) * 2));
  auto* qb = static_cast<__nv_bfloat16*>(grow(scratch.q, static_cast<size_t>(n * q_heads * d) * 2));
  gather_kv_bf16<<<grid_for(2 * kv.kv_heads * n_kv * d, kThreads), kThreads, 0, stream>>>(kv, n_kv, kvc);
  BS_CUDA_CHECK(cudaGetLastError());
  to_bf16<<<grid_for(n * q_heads * d, kThreads), kThreads, 0, stream>>>(q, qb, n * q_heads * d);
  BS_CUDA_CHECK(cudaGetLastError());

  // Rows per block: S (fp32) and P (bf16) of the group's heads within kScoreBytes.
  const int64_t rows = std::max<int64_t>(1, std::min<int64_t>(n, kScoreBytes / (group * n_kv * 6)));
  auto* s = static_cast<float*>(grow(scratch.scores, static_cast<size_t>(group * rows * n_kv) * 4));
  auto* p = static_cast<__nv_bfloat16*>(grow(scratch.probs, static_cast<size_t>(group * rows * n_kv) * 2));
  const __nv_bfloat16* kc = kvc;
  const __nv_bfloat16* vc = kvc + kv.kv_heads * n_kv * d;
  const int ld_q = static_cast<int>(q_heads * d);
  const float zero = 0.0f, one = 1.0f;
  for (int64_t t0 = 0; t0 < n; t0 += rows) {
    const int64_t nb = std::min(rows, n - t0);
    for (int64_t g = 0; g < kv.kv_heads; ++g) {
      // Column-major view: S_i^T [n_kv, nb] = K_g [n_kv, d] * Q_i^T [d, nb], for the group's
      // heads i (K_g shared: stride 0; Q_i one head further: stride d).
      BS_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
          cublas.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n_kv), static_cast<int>(nb), static_cast<int>(d),
          &scale, kc + g * n_kv * d, CUDA_R_16BF, static_cast<int>(d), 0,
          qb + (t0 * q_heads + g * group) * d, CUDA_R_16BF, ld_q, d, &zero, s, CUDA_R_32F, static_cast<int>(n_kv),
          nb * n_kv, static_cast<int>(group), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      causal_softmax<<<static_cast<unsigned>(group * nb), kThreads, 0, stream>>>(s, p, qpos, t0, nb, n_kv);
      BS_CUDA_CHECK(cudaGetLastError());
      // O_i^T [d, nb] = V_g^T [d, n_kv] * P_i^T [n_kv, nb], written into head i's columns
      // of the output rows (ld q_heads * d).
      BS_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
          cublas.get(), CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(d), static_cast<int>(nb), static_cast<int>(n_kv),
          &one, vc + g * n_kv * d, CUDA_R_16BF, static_cast<int>(d), 0, p, CUDA_R_16BF, static_cast<int>(n_kv),
          nb * n_kv, &zero, out + (t0 * q_heads + g * group) * d, CUDA_R_32F, ld_q, d, static_cast<int>(group),
          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  }
}

}  // namespace bs::kernels::cuda
