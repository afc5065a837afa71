// dst[i] = src[rows[i]] on the device: the rows that go on (the blend's narrowing).
// Copies, bit-identical to the CPU's. Row indices are the caller's to validate (the
// backend checks them on the host before it uploads them).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace bs::kernels::cuda {

void gather_rows(const float* src,     // device [*, width]
                 const int32_t* rows,  // device [n], each a row of src
                 float* dst,           // device [n, width]; must not overlap src
                 int64_t n, int64_t width, cudaStream_t stream);

}  // namespace bs::kernels::cuda
