// The blend's top-k on the device: the indices of the k largest scores, largest first,
// equal scores by lower index, NaN after every number — the reference's order, by the
// same comparison (kernels/op_math.h: ranks_before). Each index's rank is counted
// against every other score (O(n^2) comparisons, tiled through shared memory: n is a
// prompt's cached tokens, thousands), and the index is written at its rank if that is
// below k. Exact, and no sort to get wrong.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace bs::kernels::cuda {

// Throws std::invalid_argument unless 0 <= k <= n.
void top_k(const double* score,  // device [n]
           int64_t n, int64_t k,
           int32_t* out,         // device [k]
           cudaStream_t stream);

}  // namespace bs::kernels::cuda
