// Prefill-size GEMMs through oneDNN (baseline code: oneDNN's templates must never be
// instantiated in a per-ISA variant file). oneDNN dispatches on the CPU by itself
// (AVX2, AVX-512, AVX512-BF16, AMX), capped by ONEDNN_MAX_CPU_ISA.
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/backend.h"
#include "kernels/cpu/kernel_table.h"

namespace bs::kernels::cpu {

// Whether oneDNN creates a bf16 matmul on this CPU (Debian's oneDNN 2.6 has none below
// AVX-512, and no reference fallback). Probed once.
bool onednn_bf16_matmul_available();
// Seconds spent creating matmul primitives (once per row count and shape), all threads.
double onednn_primitive_creation_seconds();

// Weights dequantized once to bf16 or f32 and reordered into oneDNN's blocked layout.
struct DnnlWeights;
void destroy(DnnlWeights* w);
struct DnnlWeightsDeleter {
  void operator()(DnnlWeights* w) const { destroy(w); }
};
using DnnlWeightsPtr = std::unique_ptr<DnnlWeights, DnnlWeightsDeleter>;
DnnlWeightsPtr pack_for_gemm(const WeightView& w, Precision precision);

// y = x · Wᵀ. bf16 weights take bf16 activations, converted by `kernels.to_bf16`.
void gemm(const DnnlWeights& w, const CpuKernels& kernels,
          const float* x,  // [n, in_features]
          float* y,        // [n, out_features]
          int64_t n);

}  // namespace bs::kernels::cpu
