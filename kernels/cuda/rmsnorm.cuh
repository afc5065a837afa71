// RMSNorm on the device: out[t, i] = x[t, i] * rms_inv(sum_i x[t, i]^2) * weight[i]
// (kernels/op_math.h), fp32. One block per row; the row's sum of squares is reduced in
// fp32 across the block (a different order than the CPU's, so within ~1e-6 relative).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace bs::kernels::cuda {

void rmsnorm(const float* x,       // device [n, dim]
             const float* weight,  // device [dim]
             float* out,           // device [n, dim]; may equal x
             int64_t n, int64_t dim, float eps, cudaStream_t stream);

}  // namespace bs::kernels::cuda
