// The residual add on the device: y[i] += x[i], fp32 (bit-identical to the CPU's).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace bs::kernels::cuda {

void residual_add(float* y,        // device [count]
                  const float* x,  // device [count]
                  int64_t count, cudaStream_t stream);

}  // namespace bs::kernels::cuda
