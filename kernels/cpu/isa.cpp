#include "kernels/cpu/isa.h"

#include <cpuid.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>

namespace bs::kernels::cpu {

const char* isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Scalar: return "scalar";
    case CpuIsa::Avx2: return "avx2";
    case CpuIsa::Avx512: return "avx512";
    case CpuIsa::Avx512Bf16: return "avx512bf16";
  }
  return "?";
}

std::optional<CpuIsa> parse_isa(std::string_view name) {
  for (CpuIsa isa : kAllIsas)
    if (name == isa_name(isa)) return isa;
  return std::nullopt;
}

CpuIsa detect_cpu_isa() {
  // libgcc's cpuid reader also checks (xgetbv) that the OS saves the vector state.
  __builtin_cpu_init();
  // F16C is CPUID leaf 1, ECX bit 29 (clang 14's __builtin_cpu_supports lacks "f16c").
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29));
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  if (!avx2) return CpuIsa::Scalar;
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (!avx512) return CpuIsa::Avx2;
  // AVX512_BF16 is CPUID leaf 7, sub-leaf 1, EAX bit 5 (read directly: clang 14's
  // __builtin_cpu_supports does not know "avx512bf16"). The AVX-512 state is already
  // known to be OS-enabled from the checks above.
  eax = ebx = ecx = edx = 0;
  const bool bf16 = __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 5));
  return bf16 ? CpuIsa::Avx512Bf16 : CpuIsa::Avx512;
}

CpuIsa resolve_cpu_isa(const char* env_value, CpuIsa detected, std::string* warnings) {
  auto warn = [&](const std::string& line) {
    if (warnings) *warnings += line + "\n";
  };
  CpuIsa isa = detected;
  if (env_value && *env_value) {
    const auto cap = parse_isa(env_value);
    if (!cap)
      throw std::invalid_argument(std::string("BLENDSERVE_CPU_ISA='") + env_value +
                                  "' is not one of scalar, avx2, avx512, avx512bf16");
    if (*cap > detected)
      warn(std::string("blendserve: BLENDSERVE_CPU_ISA=") + env_value + " is above what this CPU has; using " +
           isa_name(detected));
    else
      isa = *cap;
  }
  if (detected == CpuIsa::Scalar)
    warn("blendserve: this CPU lacks AVX2/FMA/F16C; running the slow scalar kernels");
  return isa;
}

CpuIsa selected_cpu_isa() {
  static const CpuIsa isa = [] {
    std::string warnings;
    const CpuIsa chosen = resolve_cpu_isa(std::getenv("BLENDSERVE_CPU_ISA"), detect_cpu_isa(), &warnings);
    if (!warnings.empty()) std::fputs(warnings.c_str(), stderr);
    return chosen;
  }();
  return isa;
}

}  // namespace bs::kernels::cpu
