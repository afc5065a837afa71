// Per-element arithmetic of the ops, written once for every backend: the scalar
// reference (kernels/ref/, in double) and the CUDA kernels (kernels/cuda/, in fp32)
// call the same functions, so CI, which has no GPU, still tests the arithmetic the GPU
// runs (through the reference), and the two cannot drift apart. Plain C++ that nvcc
// compiles for the device too; no CUDA or CAF headers.
#pragma once

#include <math.h>

#include <cstdint>

#if defined(__CUDACC__)
#define BS_HOST_DEVICE __host__ __device__
#else
#define BS_HOST_DEVICE
#endif

namespace bs::kernels::op_math {

// exp in T's own precision (expf for float: the device has no double exp at fp32 speed).
template <typename T>
BS_HOST_DEVICE inline T exp_of(T x) {
  if constexpr (sizeof(T) == 4) return expf(x);
  else return exp(x);
}

// SwiGLU's element: silu(gate) * up = gate / (1 + e^-gate) * up.
template <typename T>
BS_HOST_DEVICE inline T silu_mul(T gate, T up) {
  return gate / (T(1) + exp_of(-gate)) * up;
}

// GeGLU's element (Gemma): gelu(gate) * up with GELU's tanh approximation,
// 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * up (transformers' gelu_pytorch_tanh,
// ggml's gelu).
template <typename T>
BS_HOST_DEVICE inline T gelu_tanh_mul(T gate, T up) {
  const T inner = T(0.7978845608028654) * (gate + T(0.044715) * gate * gate * gate);
  if constexpr (sizeof(T) == 4) return T(0.5) * gate * (T(1) + tanhf(inner)) * up;
  else return T(0.5) * gate * (T(1) + tanh(inner)) * up;
}

// RMSNorm's scale of a row: 1 / sqrt(mean of squares + eps), from the row's sum of
// squares over dim elements.
template <typename T>
BS_HOST_DEVICE inline T rms_inv(T sum_sq, int64_t dim, T eps) {
  if constexpr (sizeof(T) == 4) return T(1) / sqrtf(sum_sq / static_cast<T>(dim) + eps);
  else return T(1) / sqrt(sum_sq / static_cast<T>(dim) + eps);
}

// RoPE's rotation of one dimension pair by the angle whose cos and sin are c and s:
// (x0, x1) -> (x0 c - x1 s, x0 s + x1 c).
template <typename T>
BS_HOST_DEVICE inline void rotate_pair(T x0, T x1, T c, T s, T& y0, T& y1) {
  y0 = x0 * c - x1 * s;
  y1 = x0 * s + x1 * c;
}

// The blend's deviation of one token's row of one KV head: adds to `dev`, in double,
// (fresh_k[i] - cached_k[i])^2 and then (fresh_v[i] - cached_v[i])^2 for i = 0, 1, ...
// (each only when asked for), the order every backend uses, so their sums are
// bit-identical.
BS_HOST_DEVICE inline double add_row_deviation(double dev, const float* fresh_k, const float* cached_k,
                                               const float* fresh_v, const float* cached_v, int64_t head_dim,
                                               bool with_k, bool with_v) {
  for (int64_t i = 0; i < head_dim; ++i) {
#if defined(__CUDA_ARCH__)
    // No fused multiply-add on the device (nvcc contracts by default): the host's
    // separate product and sum, so the sums are bit-identical.
    if (with_k) {
      const double d = static_cast<double>(__fsub_rn(fresh_k[i], cached_k[i]));
      dev = __dadd_rn(dev, __dmul_rn(d, d));
    }
    if (with_v) {
      const double d = static_cast<double>(__fsub_rn(fresh_v[i], cached_v[i]));
      dev = __dadd_rn(dev, __dmul_rn(d, d));
    }
#else
    if (with_k) dev += static_cast<double>(fresh_k[i] - cached_k[i]) * (fresh_k[i] - cached_k[i]);
    if (with_v) dev += static_cast<double>(fresh_v[i] - cached_v[i]) * (fresh_v[i] - cached_v[i]);
#endif
  }
  return dev;
}

// top_k's order: whether score a at index ia comes before score b at index ib. Larger
// first, equal scores by lower index, NaN after every number (NaNs by lower index).
BS_HOST_DEVICE inline bool ranks_before(double a, int64_t ia, double b, int64_t ib) {
  const bool a_nan = a != a, b_nan = b != b;
  if (a_nan || b_nan) return !a_nan || (b_nan && ia < ib);
  return a > b || (a == b && ia < ib);
}

// ---- stored elements (ggml's formats, kernels/dequant.h), bit-exact to the CPU's ----

BS_HOST_DEVICE inline float float_of_bits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
#endif
}

// IEEE half -> float, exact (subnormals normalised, inf/NaN kept with their payload).
// The CPU's fp16_to_fp32 without F16C is this function.
BS_HOST_DEVICE inline float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return float_of_bits(sign);
    uint32_t e = 127 - 15 + 1;  // subnormal half: normalise
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    return float_of_bits(sign | (e << 23) | ((mant & 0x3ffu) << 13));
  }
  if (exp == 31) return float_of_bits(sign | 0x7f800000u | (mant << 13));
  return float_of_bits(sign | ((exp + (127 - 15)) << 23) | (mant << 13));
}

BS_HOST_DEVICE inline float bf16_bits_to_float(uint16_t h) { return float_of_bits(static_cast<uint32_t>(h) << 16); }

// Little-endian 16 bits at p (blocks are byte-packed: no alignment).
BS_HOST_DEVICE inline uint16_t load_u16_le(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (static_cast<uint16_t>(p[1]) << 8));
}

// a * b + c rounded twice, as the CPU writes it. For the block formats q * d is exact in
// fp32 (kernels/dequant.cpp's note), so an FMA would give the same; rounding each step
// explicitly keeps that true whatever nvcc contracts.
BS_HOST_DEVICE inline float mul_add_unfused(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(a, b), c);
#else
  return a * b + c;
#endif
}

// Element j (0..31) of one 32-element block: Q4_0 (fp16 d, 16 bytes: element j in the
// low nibble of byte j, j + 16 in the high one; (q - 8) * d), Q4_1 (fp16 d, fp16 m, the
// same nibbles; q * d + m), Q8_0 (fp16 d, 32 int8; q * d).
BS_HOST_DEVICE inline float q4_0_element(const uint8_t* block, int j) {
  const uint8_t byte = block[2 + (j & 15)];
  const int q = (j < 16 ? (byte & 0x0f) : (byte >> 4)) - 8;
#if defined(__CUDA_ARCH__)
  return __fmul_rn(static_cast<float>(q), half_bits_to_float(load_u16_le(block)));
#else
  return static_cast<float>(q) * half_bits_to_float(load_u16_le(block));
#endif
}

BS_HOST_DEVICE inline float q4_1_element(const uint8_t* block, int j) {
  const uint8_t byte = block[4 + (j & 15)];
  const int q = j < 16 ? (byte & 0x0f) : (byte >> 4);
  return mul_add_unfused(static_cast<float>(q), half_bits_to_float(load_u16_le(block)),
                         half_bits_to_float(load_u16_le(block + 2)));
}

BS_HOST_DEVICE inline float q8_0_element(const uint8_t* block, int j) {
  const int8_t q = static_cast<int8_t>(block[2 + j]);
#if defined(__CUDA_ARCH__)
  return __fmul_rn(static_cast<float>(q), half_bits_to_float(load_u16_le(block)));
#else
  return static_cast<float>(q) * half_bits_to_float(load_u16_le(block));
#endif
}

}  // namespace bs::kernels::op_math
