// The device-side check of ids and positions the ops read through: the values live in
// device memory, so the host cannot look at them before the op runs without waiting for
// the GPU. The check kernel records the first op that saw one out of range in a flag the
// backend reads at its next wait (kernels/cuda/cuda_backend.h); the op's own kernel
// skips such an entry, so no memory outside the tensor is ever touched.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace bs::kernels::cuda {

// *flag = code (only while it is 0: the first failure wins) when some idx[i] is outside
// [0, limit).
void flag_out_of_range(const int32_t* idx,  // device [n]
                       int64_t n, int64_t limit, int32_t code,
                       int32_t* flag,       // device (or mapped host) memory, one int
                       cudaStream_t stream);

}  // namespace bs::kernels::cuda
