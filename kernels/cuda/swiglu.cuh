// SwiGLU on the device: out[t, i] = silu(gate[t, i]) * up[t, i] (kernels/op_math.h),
// fp32, one thread per output element.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace bs::kernels::cuda {

void swiglu(const float* gate_up,  // device [n, 2 * ff]: gate [ff] then up [ff] per row
            float* out,            // device [n, ff]
            int64_t n, int64_t ff, cudaStream_t stream);

}  // namespace bs::kernels::cuda
