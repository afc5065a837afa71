#include "kernels/cuda/rope.cuh"

#include <stdexcept>

#include "kernels/cuda/cuda_check.h"
#include "kernels/op_math.h"

namespace bs::kernels::cuda {
namespace {

// One thread per (token, head, pair); blockIdx.y is the token.
__global__ void rope_pairs(float* x, const float* __restrict__ cos_sin, int64_t heads, int64_t head_dim,
                           bool interleaved) {
  const int64_t t = blockIdx.y, half = head_dim / 2;
  const float* cs = cos_sin + t * half * 2;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < heads * half;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t h = e / half, i = e % half;
    float* v = x + (t * heads + h) * head_dim;
    const int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    float y0, y1;
    op_math::rotate_pair(v[a], v[b], cs[2 * i], cs[2 * i + 1], y0, y1);
    v[a] = y0;
    v[b] = y1;
  }
}

// One thread per (token, head, pair) computes the angle's (cos, sin) and rotates that
// pair; blockIdx.y is the token, blockIdx.z the head. Every head computes the same
// angle again rather than one thread looping over the heads: on an H200 the loop made
// the kernel 9 us for one token (Nsight Compute, 2026-11-26), a double sincos and 32
// heads one after another.
__global__ void rope_positions(float* x, const int32_t* __restrict__ pos, const float* __restrict__ inv_freq,
                               int64_t head_dim, bool interleaved) {
  const int64_t t = blockIdx.y, h = blockIdx.z, half = head_dim / 2;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < half;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double angle = static_cast<double>(pos[t]) * static_cast<double>(inv_freq[i]);
    double sd, cd;
    sincos(angle, &sd, &cd);
    const float c = static_cast<float>(cd), s = static_cast<float>(sd);
    const int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    float* v = x + (t * gridDim.z + h) * head_dim;
    float y0, y1;
    op_math::rotate_pair(v[a], v[b], c, s, y0, y1);
    v[a] = y0;
    v[b] = y1;
  }
}

}  // namespace

void rope_at_positions(float* x, const int32_t* pos, const float* inv_freq, int64_t n, int64_t heads,
                       int64_t head_dim, bool interleaved, cudaStream_t stream) {
  if (n <= 0 || heads <= 0 || head_dim < 2) return;
  if (heads > 65535) throw std::invalid_argument("cuda rope_at_positions: more than 65535 heads");  // gridDim.z
  constexpr int kThreads = 64;
  const unsigned blocks_x = static_cast<unsigned>((head_dim / 2 + kThreads - 1) / kThreads);
  for (int64_t t0 = 0; t0 < n; t0 += 65535) {  // gridDim.y is at most 65535
    const int64_t rows = n - t0 < 65535 ? n - t0 : 65535;
    rope_positions<<<dim3(blocks_x, static_cast<unsigned>(rows), static_cast<unsigned>(heads)), kThreads, 0,
                     stream>>>(x + t0 * heads * head_dim, pos + t0, inv_freq, head_dim, interleaved);
    BS_CUDA_CHECK(cudaGetLastError());
  }
}

void rope(float* x, const float* cos_sin, int64_t n, int64_t heads, int64_t head_dim, bool interleaved,
          cudaStream_t stream) {
  if (n <= 0 || heads <= 0 || head_dim < 2) return;
  constexpr int kThreads = 128;
  const unsigned blocks_x = static_cast<unsigned>((heads * (head_dim / 2) + kThreads - 1) / kThreads);
  for (int64_t t0 = 0; t0 < n; t0 += 65535) {  // gridDim.y is at most 65535
    const int64_t rows = n - t0 < 65535 ? n - t0 : 65535;
    rope_pairs<<<dim3(blocks_x, static_cast<unsigned>(rows)), kThreads, 0, stream>>>(
        x + t0 * heads * head_dim, cos_sin + t0 * (head_dim / 2) * 2, heads, head_dim, interleaved);
    BS_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace bs::kernels::cuda
