#include "kernels/kquant_blocks.h"

#include <cstring>

#include "kernels/dequant.h"

namespace bs::kernels {
namespace {

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return fp16_to_fp32(h);
}

// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j from scales[12].
inline void scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
  }
}

}  // namespace

KSubBlockScales k_sub_block_scales(TensorType type, const uint8_t* super, int s) {
  KSubBlockScales out{};
  if (type == TensorType::Q6_K) {
    const float d = half_at(super + 208);
    const auto* sc = reinterpret_cast<const int8_t*>(super + 192);
    const int n = s / 4, k = s % 4;
    out.scale[0] = d * static_cast<float>(sc[8 * n + 2 * k]);
    out.scale[1] = d * static_cast<float>(sc[8 * n + 2 * k + 1]);
    out.offset = 0.0f;
    return out;
  }
  const float d = half_at(super), dmin = half_at(super + 2);
  uint8_t sc, m;
  scale_min_k4(s, super + 4, &sc, &m);
  out.scale[0] = out.scale[1] = d * static_cast<float>(sc);
  out.offset = dmin * static_cast<float>(m);
  return out;
}

void k_sub_block_quants(TensorType type, const uint8_t* super, int s, int8_t* q) {
  if (type == TensorType::Q6_K) {
    const int n = s / 4, k = s % 4;
    const uint8_t* ql = super + 64 * n + (k & 1) * 32;
    const uint8_t* qh = super + 128 + 32 * n;
    for (int l = 0; l < 32; ++l) {
      const int lo = k >= 2 ? ql[l] >> 4 : ql[l] & 0xF;
      const int hi = (qh[l] >> (2 * k)) & 3;
      q[l] = static_cast<int8_t>((lo | (hi << 4)) - 32);
    }
    return;
  }
  const uint8_t* qs = super + (type == TensorType::Q5_K ? 48 : 16) + 32 * (s / 2);
  const uint8_t* qh = super + 16;  // Q5_K only
  for (int l = 0; l < 32; ++l) {
    int v = s % 2 ? qs[l] >> 4 : qs[l] & 0xF;
    if (type == TensorType::Q5_K) v |= ((qh[l] >> s) & 1) << 4;
    q[l] = static_cast<int8_t>(v);
  }
}

namespace {

template <TensorType T>
void dequantize_k(const void* src, float* dst, int64_t n, int64_t block_bytes) {
  const auto* b = static_cast<const uint8_t*>(src);
  int8_t q[32];
  for (int64_t i = 0; i < n / kQK_K; ++i, b += block_bytes)
    for (int s = 0; s < kKSubBlocks; ++s) {
      const KSubBlockScales sc = k_sub_block_scales(T, b, s);
      k_sub_block_quants(T, b, s, q);
      float* y = dst + i * kQK_K + s * 32;
      for (int e = 0; e < 32; ++e) y[e] = sc.scale[e / 16] * static_cast<float>(q[e]) - sc.offset;
    }
}

}  // namespace

void dequantize_q4_k(const void* src, float* dst, int64_t n) {
  dequantize_k<TensorType::Q4_K>(src, dst, n, kBlockBytesQ4_K);
}
void dequantize_q5_k(const void* src, float* dst, int64_t n) {
  dequantize_k<TensorType::Q5_K>(src, dst, n, kBlockBytesQ5_K);
}
void dequantize_q6_k(const void* src, float* dst, int64_t n) {
  dequantize_k<TensorType::Q6_K>(src, dst, n, kBlockBytesQ6_K);
}

}  // namespace bs::kernels
