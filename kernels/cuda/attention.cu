#include "kernels/cuda/attention.cuh"

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"

namespace bs::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;
constexpr int kMaxDimPerLane = 8;  // head_dim <= 32 * 8

// One warp per (query t, head h): lane l holds elements l, l + 32, ... of the query and
// of the running output.
__global__ void attention_warps(const float* __restrict__ q, const int32_t* __restrict__ qpos, DevicePagedKv kv,
                                float* __restrict__ out, int64_t n, int64_t q_heads, int64_t n_kv, float scale) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (item >= n * q_heads) return;
  const int lane = threadIdx.x % 32;
  const int64_t t = item / q_heads, h = item % q_heads;
  const int64_t d = kv.head_dim, kvh = h / (q_heads / kv.kv_heads);
  const float* qv = q + (t * q_heads + h) * d;
  float qr[kMaxDimPerLane], acc[kMaxDimPerLane];
  for (int r = 0; r < kMaxDimPerLane; ++r) {
    const int64_t i = lane + 32 * r;
    qr[r] = i < d ? qv[i] : 0.0f;
    acc[r] = 0.0f;
  }
  const int64_t last = qpos[t] < n_kv - 1 ? qpos[t] : n_kv - 1;
  float running_max = -INFINITY, denom = 0.0f;
  for (int64_t j = 0; j <= last; ++j) {
    const int64_t row = kv.row_offset(kvh, j);
    float s = 0.0f;
    for (int r = 0; r < kMaxDimPerLane; ++r) {
      const int64_t i = lane + 32 * r;
      if (i < d) s += qr[r] * load_kv(kv.dtype, kv.k, row + i);
    }
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    s *= scale;
    const float new_max = fmaxf(running_max, s);
    const float correction = __expf(running_max - new_max);  // 0 on the first key
    const float p = __expf(s - new_max);
    denom = denom * correction + p;
    for (int r = 0; r < kMaxDimPerLane; ++r) {
      const int64_t i = lane + 32 * r;
      if (i < d) acc[r] = acc[r] * correction + p * load_kv(kv.dtype, kv.v, row + i);
    }
    running_max = new_max;
  }
  float* o = out + (t * q_heads + h) * d;
  for (int r = 0; r < kMaxDimPerLane; ++r) {
    const int64_t i = lane + 32 * r;
    if (i < d) o[i] = denom > 0.0f ? acc[r] / denom : 0.0f;
  }
}

}  // namespace

void attention(const float* q, const int32_t* qpos, const DevicePagedKv& kv, float* out, int64_t n, int64_t q_heads,
               int64_t n_kv, float scale, cudaStream_t stream) {
  if (kv.head_dim > 32 * kMaxDimPerLane)
    throw std::invalid_argument("cuda attention: head_dim " + std::to_string(kv.head_dim) + " > 256");
  if (kv.kv_heads <= 0 || q_heads % kv.kv_heads != 0)
    throw std::invalid_argument("cuda attention: " + std::to_string(q_heads) + " query heads over " +
                                std::to_string(kv.kv_heads) + " KV heads");
  if (n <= 0 || n_kv <= 0) return;
  const int64_t items = n * q_heads;
  const int64_t blocks = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  attention_warps<<<static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0, stream>>>(q, qpos, kv, out, n, q_heads,
                                                                                       n_kv, scale);
  BS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace bs::kernels::cuda
