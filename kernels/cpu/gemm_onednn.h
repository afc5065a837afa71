// Prefill-size GEMMs through oneDNN (baseline code: oneDNN's templates must never be
// instantiated in a per-ISA variant file). oneDNN dispatches on the CPU by itself
// (AVX2, AVX-512, AVX512-BF16, AMX), capped by ONEDNN_MAX_CPU_ISA.
//
// The weights are read from their stored rows (the memory-mapped file) on every call:
// no packed or dequantized copy is kept, so a loaded model's resident memory stays near
// its file size (tools/bench/RESULTS.md, "Memory"). Rows stored at the GEMM's precision
// (F32 at F32, BF16 at BF16) are multiplied in place; any other type is dequantized by chunks of rows into
// a per-thread scratch of a few MB just before its chunk is multiplied. Measured against
// keeping a packed bf16 copy: tools/bench/results/streamed_gemm_*.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/kernel_table.h"

namespace bs::kernels::cpu {

// Whether oneDNN creates a bf16 matmul on this CPU (Debian's oneDNN 2.6 has none below
// AVX-512, and no reference fallback). Probed once.
bool onednn_bf16_matmul_available();
// Seconds spent creating matmul primitives (once per row count and shape), all threads.
double onednn_primitive_creation_seconds();

// y = x · Wᵀ for W the concatenation of `parts`' rows (one part, or the query, key and
// value rows of a fused product: Backend::prepare_fused), every part with the same
// in_features; the parts may differ in type. Chunks of rows may span parts, so a fused
// product is one GEMM of its whole width, as if its rows were one matrix. Dequantization
// into the scratch runs on the OpenMP threads, as the products do, through
// `kernels.dequantize_row` (vectorized) where it takes the type.
void gemm_stored(const CpuKernels& kernels,
                 const std::vector<WeightView>& parts,  // each [out_features, in_features] rows of its type
                 Precision precision,  // F32, or BF16 (x as bf16, products in bf16)
                 const void* x,        // [n, in_features]: float at F32, bf16 bits at BF16
                 float* y,             // [n, sum of the parts' out_features]
                 int64_t n);

// Frees the calling thread's GEMM buffers (the dequantized chunks, the dense output, the
// oneDNN scratchpad): Backend::release_scratch. The cached primitives stay.
void release_gemm_thread_buffers();

}  // namespace bs::kernels::cpu
