// Decode-size products on the device: y = x W^T + bias for up to kGemvMaxRows (64) rows,
// with W the bf16 weights of linear.cuh and x rounded to bf16 as linear() rounds it
// (once per call, into `scratch`), fp32 accumulation. Each output feature's weight row
// is read once per call (16-byte loads where the row allows) for all the rows at once:
// decode is weight-bandwidth-bound, and 64 rows in one pass read the weights once where
// four 16-row passes read them four times.
//
// The CUDA backend's default for these is now cuBLAS at a fixed 64 rows (linear.cuh's
// linear_padded), which keeps the same contract by fixing the shape: measured on an H200
// (2026-11-27) this GEMV is compute-bound from ~8 rows (n fp32 FMAs per weight; a 1B
// decode step of 32 rows 14.9 ms against 3.4 ms), and 15% faster at one row (1.98 vs
// 2.32 ms). BLENDSERVE_CUDA_DECODE_GEMM=gemv selects it.
//
// Why our own kernel and not plain cuBLAS: every row's sum is computed in an order that
// does not depend on how many rows there are (gemv_bf16.cu: lane l of the warp owning a
// feature adds the products of groups l, l + 32, ... into its own partial sum with fmaf,
// then a fixed xor-shuffle tree adds the 32 partial sums), so row i of a batch equals row
// i alone, bit for bit — the Backend's linear_exact_rows() contract that lets a batched
// decode step equal one-token forwards (cuBLAS picks its algorithm by shape, which changes
// the order, unless the shape is fixed as linear_padded fixes it). The
// kernel is templated on a row bucket R (1, 2, 4, ..., 64: the smallest >= n) so one row
// keeps few registers; the loop, the fmaf order and the tree are the same in every
// bucket, so the buckets agree bit for bit. That order is also the first version's
// (x read as fp32 per lane, one 16-byte weight load per lane at a time), so results are
// bit-identical to it too: what changed since is only when loads are issued and where
// x is read from.
//
// Bandwidth at one row: the first version kept one 16-byte weight load in flight per
// lane (~35% of an H200's HBM bandwidth, 2026-11-26); each lane now issues U (8 at 1-2
// rows) independent weight loads before it uses them, 4 warps per block so small
// products (512-feature k/v projections) spread over more SMs. Weights are streamed
// (evict-first), keeping x in L1/L2.
//
// x traffic: a warp reads n rows of x for every feature it owns, n bytes of x per byte
// of W; at 64 rows that is 64x the weights' bytes through L1 — far beyond what L1 (or
// L2 on a miss) delivers. So (a) a warp owns F features (F = 2 at 4-8 and 64 rows, 4 at
// 16-32) sharing each x load: n / F bytes of x per byte of W, with R * F fp32
// accumulators (<= 128) per lane; (b) from 16 rows the block stages x in shared memory,
// 32 groups (256 values) of each row at a time, double-buffered with cp.async: x leaves
// L2 once per block of 8 warps x F features, n / (8 F) bytes per byte of W (4 at 64 rows,
// 1 at 32, 0.5 at 16: under the arithmetic's time below), and each warp's x reads hit
// shared memory, 16 bytes per lane and row without bank conflicts. A product with fewer
// than 256 blocks of F features per warp takes F = 1 instead (parallelism over sharing).
//
// Compute bound: a 64-row product is 64 fmaf per weight element; an H200's fp32 FMA rate
// (~33 T/s) is ~14 rows' worth of its weight bandwidth (~2.4 G bf16 per ms), so from ~16
// rows the time grows with the rows even read once (one pass of 32 or 64 rows saves the
// weight reads, not the arithmetic; tensor cores would be the next step, in an order of
// their own).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/linear.cuh"

namespace bs::kernels::cuda {

inline constexpr int64_t kGemvMaxRows = 64;

// Throws std::invalid_argument for n outside [1, kGemvMaxRows]. Launches the kernel
// of n's row bucket (gemv_bf16.cu).
void gemv_bf16(const Bf16Weights& w,
               const float* x,              // device [n, in_features]
               float* y,                    // device [n, out_features]
               int64_t n,
               const float* bias,           // device [out_features] or nullptr
               DeviceAllocation& scratch,   // x as bf16 [n, in_features], grown as needed
               cudaStream_t stream);

}  // namespace bs::kernels::cuda
