// Embedding rows on the device: out[t] = the table's row ids[t], dequantized to fp32
// from the stored type (F32, F16, BF16, Q8_0, Q4_0, Q4_1), bit-exact to the CPU's
// dequantization (kernels/op_math.h). An id outside [0, vocab) reads no memory and gets
// a row of NaN (the backend flags it with index_check.cuh and reports it at its next
// wait).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/tensor_types.h"

namespace bs::kernels::cuda {

// Throws std::invalid_argument for a type without a device decoder, or dim not a
// multiple of the type's block size.
void embed(TensorType type,
           const void* table,     // device [vocab] rows of `type`, dim elements each
           const int32_t* ids,    // device [n], each in [0, vocab)
           float* out,            // device [n, dim]
           int64_t n, int64_t dim,
           int64_t vocab,         // rows of the table
           cudaStream_t stream);

}  // namespace bs::kernels::cuda
