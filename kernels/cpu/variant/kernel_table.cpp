// This variant's table (kernels/cpu/kernel_table.h).
#include "kernels/cpu/variant/simd.h"  // first: see the note there
#include "kernels/cpu/variant/variant_ops.h"

namespace bs::kernels::cpu::BS_ISA_NS {

extern const CpuKernels kKernels;
const CpuKernels kKernels = {
    static_cast<CpuIsa>(BS_ISA_LEVEL),
    rmsnorm,
    rope,
    swiglu,
    geglu,
    softmax_exps,
    attention,
    attention_decode,
    attention_decode_rows,
#if BS_ISA_LEVEL >= 3
    attention_bf16,
#else
    nullptr,
#endif
    gemv_quantized,
#if BS_ISA_LEVEL >= 1
    gemv_int8,
#else
    nullptr,
#endif
#if BS_ISA_LEVEL >= 3
    to_bf16,
#else
    nullptr,
#endif
    dequantize_row_fast,
};

}  // namespace bs::kernels::cpu::BS_ISA_NS
