// The attention query rows pay each key, on the device (Backend::attention_mass: the
// blend's query-aware selection). A block per (query head, row) walks the row's keys
// three times — max, sum of exps, weights — recomputing each score rather than
// holding n_kv of them (a 32k-token prompt's row would not fit shared memory), and
// adds each weight to out[key] with a double atomic. The atomics make the order of
// the additions the scheduler's: the sums agree with the CPU's to rounding, not bit
// for bit (the selection's ties can differ; tensor-parallel ranks still agree, as the
// leader broadcasts the selection). It runs over a few dozen question rows at the
// check layers only, so it is written for clarity, not tuned.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/paged_kv.cuh"

namespace bs::kernels::cuda {

// out is zeroed first. head_dim <= 256.
void attention_mass(const float* q,       // device [n, q_heads, kv.head_dim]
                    const int32_t* qpos,  // device [n]
                    const DevicePagedKv& kv, int64_t n, int64_t q_heads, int64_t n_kv, float scale,
                    double* out,          // device [n_kv]
                    cudaStream_t stream);

}  // namespace bs::kernels::cuda
