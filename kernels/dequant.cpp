#include "kernels/dequant.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include <cpuid.h>
#include <immintrin.h>

#include "kernels/op_math.h"

// Exactness note: ggml rounds q * d and (q * d) + m separately. q has at most 8 significant
// bits and d (an fp16) 11, so q * d is exact in fp32 and a fused multiply-add gives the same
// result: these loops match ggml bit for bit whatever the compiler's fp-contract setting.

namespace bs::kernels {

namespace {

// Block geometry (also in the type table, kernels/tensor_types.cpp).
constexpr int64_t kQK4_0 = 32;
constexpr int64_t kQK4_1 = 32;
constexpr int64_t kQK5 = 32;
constexpr int64_t kQK8_0 = 32;
constexpr int64_t kBlockBytesQ4_0 = 2 + 16;
constexpr int64_t kBlockBytesQ4_1 = 2 + 2 + 16;
constexpr int64_t kBlockBytesQ5_0 = 2 + 4 + 16;
constexpr int64_t kBlockBytesQ5_1 = 2 + 2 + 4 + 16;
constexpr int64_t kBlockBytesQ8_0 = 2 + 32;

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline float bits_to_f32(uint32_t u) { return std::bit_cast<float>(u); }
inline uint32_t f32_to_bits(float f) { return std::bit_cast<uint32_t>(f); }

}  // namespace

// ---- scalar conversions ---------------------------------------------------------------

float fp16_to_fp32(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return op_math::half_bits_to_float(h);
#endif
}

uint16_t fp32_to_fp16(float f) {
#if defined(__F16C__)
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
#else
  // Same algorithm as ggml's portable GGML_COMPUTE_FP32_TO_FP16.
  const float scale_to_inf = 0x1.0p+112f;
  const float scale_to_zero = 0x1.0p-110f;
  float base = std::fabs(f) * scale_to_inf;
  base = base * scale_to_zero;
  const uint32_t w = f32_to_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xff000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = bits_to_f32((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = f32_to_bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007c00u;
  const uint32_t mantissa_bits = bits & 0x00000fffu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xff000000u ? 0x7e00u : nonsign));
#endif
}

float bf16_to_fp32(uint16_t h) { return bits_to_f32(static_cast<uint32_t>(h) << 16); }

uint16_t fp32_to_bf16(float f) {
  const uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: truncate, force the quiet bit
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  return static_cast<uint16_t>((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

// ---- K/V elements ---------------------------------------------------------------------

namespace {

// F16C row conversions for a baseline build: compiled for F16C here only (static
// functions, so no other code shares their instructions) and called only where the
// CPU has it. A KV cache converts every K/V row a forward writes or a chunk load reads.
__attribute__((target("avx,f16c"))) void f32_to_f16_f16c(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) dst[i] = fp32_to_fp16(src[i]);
}
__attribute__((target("avx,f16c"))) void f16_to_f32_f16c(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; ++i) dst[i] = fp16_to_fp32(src[i]);
}
bool cpu_has_f16c() {
  // F16C is CPUID leaf 1, ECX bit 29 (clang 14's __builtin_cpu_supports lacks "f16c");
  // "avx" also checks that the OS saves the YMM state.
  static const bool has = [] {
    __builtin_cpu_init();
    unsigned eax, ebx, ecx, edx;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
  }();
  return has;
}

}  // namespace

void kv_from_fp32(TensorType type, const float* src, void* dst, int64_t n) {
  switch (type) {
    case TensorType::F32:
      if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case TensorType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      if (cpu_has_f16c()) return f32_to_f16_f16c(src, d, n);
      for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_fp16(src[i]);
      return;
    }
    case TensorType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_bf16(src[i]);
      return;
    }
    default:
      throw std::invalid_argument(std::string("KV elements cannot be ") + type_traits(type).name);
  }
}

void kv_to_fp32(TensorType type, const void* src, float* dst, int64_t n) {
  switch (type) {
    case TensorType::F32:
      if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case TensorType::F16: {
      const auto* s = static_cast<const uint16_t*>(src);
      if (cpu_has_f16c()) return f16_to_f32_f16c(s, dst, n);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(s[i]);
      return;
    }
    case TensorType::BF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(s[i]);
      return;
    }
    default:
      throw std::invalid_argument(std::string("KV elements cannot be ") + type_traits(type).name);
  }
}

// ---- row dequantization ---------------------------------------------------------------

void dequantize_f32(const void* src, float* dst, int64_t n) {
  if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void dequantize_f16(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = fp16_to_fp32(load_u16(s + 2 * i));
}

void dequantize_bf16(const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(load_u16(s + 2 * i));
}

void dequantize_q4_0(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const uint8_t*>(src);
  const int64_t nb = n / kQK4_0;
  for (int64_t i = 0; i < nb; ++i, b += kBlockBytesQ4_0) {
    const float d = fp16_to_fp32(load_u16(b));
    const uint8_t* qs = b + 2;
    float* y = dst + i * kQK4_0;
    for (int j = 0; j < 16; ++j) {
      const int x0 = (qs[j] & 0x0f) - 8;
      const int x1 = (qs[j] >> 4) - 8;
      y[j] = static_cast<float>(x0) * d;
      y[j + 16] = static_cast<float>(x1) * d;
    }
  }
}

void dequantize_q4_1(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const uint8_t*>(src);
  const int64_t nb = n / kQK4_1;
  for (int64_t i = 0; i < nb; ++i, b += kBlockBytesQ4_1) {
    const float d = fp16_to_fp32(load_u16(b));
    const float m = fp16_to_fp32(load_u16(b + 2));
    const uint8_t* qs = b + 4;
    float* y = dst + i * kQK4_1;
    for (int j = 0; j < 16; ++j) {
      const float p0 = static_cast<float>(qs[j] & 0x0f) * d;
      const float p1 = static_cast<float>(qs[j] >> 4) * d;
      y[j] = p0 + m;
      y[j + 16] = p1 + m;
    }
  }
}

// Q5_0 / Q5_1: element e's fifth bit is bit e of the block's 32-bit qh (little endian).
void dequantize_q5_0(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const uint8_t*>(src);
  const int64_t nb = n / kQK5;
  for (int64_t i = 0; i < nb; ++i, b += kBlockBytesQ5_0) {
    const float d = fp16_to_fp32(load_u16(b));
    uint32_t qh;
    std::memcpy(&qh, b + 2, sizeof qh);
    const uint8_t* qs = b + 6;
    float* y = dst + i * kQK5;
    for (int j = 0; j < 16; ++j) {
      const int x0 = static_cast<int>((qs[j] & 0x0f) | (((qh >> j) & 1u) << 4)) - 16;
      const int x1 = static_cast<int>((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16;
      y[j] = static_cast<float>(x0) * d;
      y[j + 16] = static_cast<float>(x1) * d;
    }
  }
}

void dequantize_q5_1(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const uint8_t*>(src);
  const int64_t nb = n / kQK5;
  for (int64_t i = 0; i < nb; ++i, b += kBlockBytesQ5_1) {
    const float d = fp16_to_fp32(load_u16(b));
    const float m = fp16_to_fp32(load_u16(b + 2));
    uint32_t qh;
    std::memcpy(&qh, b + 4, sizeof qh);
    const uint8_t* qs = b + 8;
    float* y = dst + i * kQK5;
    for (int j = 0; j < 16; ++j) {
      const float p0 = static_cast<float>((qs[j] & 0x0f) | (((qh >> j) & 1u) << 4)) * d;
      const float p1 = static_cast<float>((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) * d;
      y[j] = p0 + m;
      y[j + 16] = p1 + m;
    }
  }
}

void dequantize_q8_0(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const uint8_t*>(src);
  const int64_t nb = n / kQK8_0;
  for (int64_t i = 0; i < nb; ++i, b += kBlockBytesQ8_0) {
    const float d = fp16_to_fp32(load_u16(b));
    const auto* qs = reinterpret_cast<const int8_t*>(b + 2);
    float* y = dst + i * kQK8_0;
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
  }
}

namespace {

const TensorTypeTraits& check_row(TensorType type, int64_t n) {
  const TensorTypeTraits* t = find_tensor_type(static_cast<uint32_t>(type));
  if (!t) throw std::invalid_argument("dequantize: unsupported ggml type " + std::to_string(static_cast<uint32_t>(type)));
  if (n < 0 || n % t->block_elements != 0) {
    throw std::invalid_argument("dequantize: element count " + std::to_string(n) +
                                " is not a non-negative multiple of the block size " +
                                std::to_string(t->block_elements));
  }
  return *t;
}

}  // namespace

void dequantize_row(TensorType type, const void* src, float* dst, int64_t n) { check_row(type, n).to_f32(src, dst, n); }

void dequantize_row_to_bf16(TensorType type, const void* src, uint16_t* dst, int64_t n) {
  const TensorTypeTraits& t = check_row(type, n);
  if (type == TensorType::BF16) {
    if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(uint16_t));
    return;
  }
  // Chunks of whole blocks through a small fp32 buffer.
  constexpr int64_t kChunk = 256;  // a multiple of every block size
  float buf[kChunk];
  const auto* s = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = n - i < kChunk ? n - i : kChunk;
    t.to_f32(s + (i / t.block_elements) * t.block_bytes, buf, len);
    for (int64_t j = 0; j < len; ++j) dst[i + j] = fp32_to_bf16(buf[j]);
  }
}

}  // namespace bs::kernels
