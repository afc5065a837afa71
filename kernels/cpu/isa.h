// Which CPU kernel variant runs: the best one the CPU supports, chosen once at
// start-up, optionally capped by BLENDSERVE_CPU_ISA (tests use the cap to run the
// lower variants on any machine). oneDNN keeps its own dispatch (ONEDNN_MAX_CPU_ISA).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace bs::kernels::cpu {

// Ordered: each level includes the ones below it.
enum class CpuIsa : int {
  Scalar = 0,      // baseline x86-64
  Avx2 = 1,        // AVX2 + FMA + F16C
  Avx512 = 2,      // AVX-512 F/BW/VL/DQ
  Avx512Bf16 = 3,  // AVX-512 + AVX512-BF16 (native bf16 dot products)
};
inline constexpr CpuIsa kAllIsas[] = {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Avx512Bf16};

// "scalar", "avx2", "avx512", "avx512bf16" (the BLENDSERVE_CPU_ISA spellings).
const char* isa_name(CpuIsa isa);
std::optional<CpuIsa> parse_isa(std::string_view name);

// The best variant this CPU (and OS) can execute, from cpuid.
CpuIsa detect_cpu_isa();

// detect_cpu_isa() capped by BLENDSERVE_CPU_ISA when set. A cap above what the CPU has
// is clamped with a one-line warning; an unknown name throws std::invalid_argument
// naming the valid ones. A CPU below AVX2 gets the scalar variant and a one-line
// warning. Evaluated once; later calls return the same answer.
CpuIsa selected_cpu_isa();

// The same decision for an explicit environment value (nullptr: unset); `warnings`
// receives the lines selected_cpu_isa() prints. For tests.
CpuIsa resolve_cpu_isa(const char* env_value, CpuIsa detected, std::string* warnings);

}  // namespace bs::kernels::cpu
