#include "kernels/cuda/gemv_bf16.cuh"

#include <cuda_bf16.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"

namespace bs::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

// The 8 bf16 values of one 16-byte load as floats.
__device__ inline void unpack8(const uint4& packed, float (&out)[8]) {
  const __nv_bfloat16* v = reinterpret_cast<const __nv_bfloat16*>(&packed);
#pragma unroll
  for (int e = 0; e < 8; ++e) out[e] = __bfloat162float(v[e]);
}

// One warp per output feature o. Lane l takes the row's elements in groups of 8 (one
// 16-byte load of W, and one of each row of x) at groups l, l + 32, ...; `vector` is
// false when the row length is not a multiple of 8 (rows then not 16-byte aligned), and
// lane l takes elements l, l + 32, ... one by one. Each row t of x has its own
// accumulator; the loop and the reduction are the same whatever n is.
__global__ void gemv_rows(const __nv_bfloat16* __restrict__ w, const __nv_bfloat16* __restrict__ x,
                          float* __restrict__ y, const float* __restrict__ bias, int64_t n, int64_t out_features,
                          int64_t in_features, bool vector) {
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (o >= out_features) return;
  const int lane = threadIdx.x % 32;
  const __nv_bfloat16* row = w + o * in_features;
  float acc[kGemvMaxRows];
#pragma unroll
  for (int t = 0; t < kGemvMaxRows; ++t) acc[t] = 0.0f;
  if (vector) {
    const int64_t groups = in_features / 8;
    for (int64_t g = lane; g < groups; g += 32) {
      float wf[8];
      unpack8(reinterpret_cast<const uint4*>(row)[g], wf);
#pragma unroll
      for (int t = 0; t < kGemvMaxRows; ++t) {
        if (t >= n) break;
        float xf[8];
        unpack8(reinterpret_cast<const uint4*>(x + t * in_features)[g], xf);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[t] = fmaf(wf[e], xf[e], acc[t]);
      }
    }
  } else {
    for (int64_t i = lane; i < in_features; i += 32) {
      const float wf = __bfloat162float(row[i]);
#pragma unroll
      for (int t = 0; t < kGemvMaxRows; ++t) {
        if (t >= n) break;
        acc[t] = fmaf(wf, __bfloat162float(x[t * in_features + i]), acc[t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kGemvMaxRows; ++t) {
    if (t >= n) break;
    float s = acc[t];
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    if (lane == 0) y[t * out_features + o] = bias ? s + bias[o] : s;
  }
}

}  // namespace

void gemv_bf16(const Bf16Weights& w, const float* x, float* y, int64_t n, const float* bias,
               DeviceAllocation& scratch, cudaStream_t stream) {
  if (n < 1 || n > kGemvMaxRows)
    throw std::invalid_argument("cuda gemv_bf16: " + std::to_string(n) + " rows (1.." + std::to_string(kGemvMaxRows) +
                                ")");
  const auto* xb = static_cast<const __nv_bfloat16*>(activations_to_bf16(x, n * w.in_features, scratch, stream));
  // Rows of W and of x 16-byte aligned (both allocations start 256-byte aligned).
  const bool vector = w.in_features % 8 == 0;
  const int64_t blocks = (w.out_features + kWarpsPerBlock - 1) / kWarpsPerBlock;
  gemv_rows<<<static_cast<unsigned>(blocks), 32 * kWarpsPerBlock, 0, stream>>>(
      w.data.as<__nv_bfloat16>(), xb, y, bias, n, w.out_features, w.in_features, vector);
  BS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace bs::kernels::cuda
