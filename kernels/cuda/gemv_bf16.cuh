// Decode-size products on the device: y = x W^T + bias for up to kGemvMaxRows rows,
// with W the bf16 weights of linear.cuh and x rounded to bf16 as linear() rounds it
// (once per call, into `scratch`), fp32 accumulation. One warp per output feature reads
// its weight row once (16-byte loads where the row allows) for all the rows at once:
// decode is weight-bandwidth-bound.
//
// x is rounded to bf16 once and read 16 bytes (8 values) per lane and row: on an H200
// the first version, which read x as fp32 one value at a time (lanes 32 bytes apart) and
// rounded it in every output feature's warp, took 351 us for 16 rows of a 16384 x 2048
// product against 40 us for one row (Nsight Compute, 2026-11-26), so batched decode
// scaled 4.4x over 32 streams. The products are the same values in the same order, so
// the results are bit-identical to that version's.
//
// Why not cuBLAS for these: every row's sum is computed in an order that does not depend
// on how many rows there are (per-lane partial sums over a fixed stride, then a fixed
// shuffle tree), so row i of a batch equals row i alone, bit for bit — the Backend's
// linear_exact_rows() contract that lets a batched decode step equal one-token forwards
// (cuBLAS picks its algorithm by shape, which changes the order).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/linear.cuh"

namespace bs::kernels::cuda {

inline constexpr int64_t kGemvMaxRows = 16;

// Throws std::invalid_argument for n outside [1, kGemvMaxRows].
void gemv_bf16(const Bf16Weights& w,
               const float* x,              // device [n, in_features]
               float* y,                    // device [n, out_features]
               int64_t n,
               const float* bias,           // device [out_features] or nullptr
               DeviceAllocation& scratch,   // x as bf16 [n, in_features], grown as needed
               cudaStream_t stream);

}  // namespace bs::kernels::cuda
