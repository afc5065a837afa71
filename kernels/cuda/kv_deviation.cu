#include "kernels/cuda/kv_deviation.cuh"

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.h"
#include "kernels/op_math.h"

namespace bs::kernels::cuda {
namespace {

constexpr int kMaxHeadDim = 256;

// One thread per token: its heads in order, each cached row widened into local arrays,
// then the shared per-row arithmetic.
__global__ void deviation_per_token(DevicePagedKv kv, const int32_t* __restrict__ pos, const float* __restrict__ k,
                                    const float* __restrict__ v, int64_t n, bool with_k, bool with_v,
                                    double* __restrict__ out) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= n) return;
  const int64_t p = pos[t];
  if (p < 0 || p >= kv.capacity) {
    out[t] = __longlong_as_double(0x7ff8000000000000LL);  // NaN
    return;
  }
  const int64_t d = kv.head_dim;
  float ck[kMaxHeadDim], cv[kMaxHeadDim];
  double dev = 0.0;
  for (int64_t h = 0; h < kv.kv_heads; ++h) {
    const int64_t row = kv.row_offset(h, p);
    for (int64_t i = 0; i < d; ++i) {
      ck[i] = load_kv(kv.dtype, kv.k, row + i);
      cv[i] = load_kv(kv.dtype, kv.v, row + i);
    }
    const float* kf = k + (t * kv.kv_heads + h) * d;
    const float* vf = v + (t * kv.kv_heads + h) * d;
    dev = op_math::add_row_deviation(dev, kf, ck, vf, cv, d, with_k, with_v);
  }
  out[t] = dev;
}

}  // namespace

void kv_deviation(const DevicePagedKv& kv, const int32_t* pos, const float* k, const float* v, int64_t n, bool with_k,
                  bool with_v, double* out, cudaStream_t stream) {
  if (kv.head_dim > kMaxHeadDim)
    throw std::invalid_argument("cuda kv_deviation: head_dim " + std::to_string(kv.head_dim) + " > 256");
  if (n <= 0) return;
  constexpr int kThreads = 128;
  deviation_per_token<<<static_cast<unsigned>((n + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      kv, pos, k, v, n, with_k, with_v, out);
  BS_CUDA_CHECK(cudaGetLastError());
}

}  // namespace bs::kernels::cuda
