// Per-element arithmetic of the ops, written once for every backend: the scalar
// reference (kernels/ref/, in double) and the CUDA kernels (kernels/cuda/, in fp32)
// call the same functions, so CI, which has no GPU, still tests the arithmetic the GPU
// runs (through the reference), and the two cannot drift apart. Plain C++ that nvcc
// compiles for the device too; no CUDA or CAF headers.
#pragma once

#include <math.h>

#include <cstdint>

#if defined(__CUDACC__)
#define BS_HOST_DEVICE __host__ __device__
#else
#define BS_HOST_DEVICE
#endif

namespace bs::kernels::op_math {

// exp in T's own precision (expf for float: the device has no double exp at fp32 speed).
template <typename T>
BS_HOST_DEVICE inline T exp_of(T x) {
  if constexpr (sizeof(T) == 4) return expf(x);
  else return exp(x);
}

// SwiGLU's element: silu(gate) * up = gate / (1 + e^-gate) * up.
template <typename T>
BS_HOST_DEVICE inline T silu_mul(T gate, T up) {
  return gate / (T(1) + exp_of(-gate)) * up;
}

// RMSNorm's scale of a row: 1 / sqrt(mean of squares + eps), from the row's sum of
// squares over dim elements.
template <typename T>
BS_HOST_DEVICE inline T rms_inv(T sum_sq, int64_t dim, T eps) {
  if constexpr (sizeof(T) == 4) return T(1) / sqrtf(sum_sq / static_cast<T>(dim) + eps);
  else return T(1) / sqrt(sum_sq / static_cast<T>(dim) + eps);
}

}  // namespace bs::kernels::op_math
