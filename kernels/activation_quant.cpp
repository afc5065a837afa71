#include "kernels/activation_quant.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/dequant.h"
#include "kernels/kquant_blocks.h"

namespace bs::kernels {

namespace {

template <class Q>
float quantize_block(const float* x, Q* q, float qmax) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const float scale = amax > 0.0f ? amax / qmax : 1.0f;
  const float inv = 1.0f / scale;
  for (int i = 0; i < 32; ++i) q[i] = static_cast<Q>(std::lrintf(x[i] * inv));
  return scale;
}

// Block b (of 32 elements) of a row as integers: element e is scale[e / 16] * q[e] + add
// (the type's dequantizer, exactly: Q4_0 q = nibble - 8, Q5_0 q = 5-bit value - 16,
// Q4_1/Q5_1 add = m, Q8_0 q as stored, the K-quants as kernels/kquant_blocks.h).
void block_as_integers(TensorType type, const uint8_t* row, int64_t b, int* q, float* scale, float& add) {
  add = 0.0f;
  if (is_k_quant(type)) {
    const int64_t bytes = type == TensorType::Q4_K ? kBlockBytesQ4_K : type == TensorType::Q5_K ? kBlockBytesQ5_K
                                                                                               : kBlockBytesQ6_K;
    const uint8_t* super = row + (b / kKSubBlocks) * bytes;
    const int s = static_cast<int>(b % kKSubBlocks);
    const KSubBlockScales sc = k_sub_block_scales(type, super, s);
    int8_t q8[32];
    k_sub_block_quants(type, super, s, q8);
    for (int e = 0; e < 32; ++e) q[e] = q8[e];
    scale[0] = sc.scale[0];
    scale[1] = sc.scale[1];
    add = -sc.offset;
    return;
  }
  const int64_t bytes = type_row_bytes(type, 32);
  const uint8_t* blk = row + b * bytes;
  uint16_t dh;
  std::memcpy(&dh, blk, 2);
  scale[0] = scale[1] = fp16_to_fp32(dh);
  if (type == TensorType::Q8_0) {
    for (int e = 0; e < 32; ++e) q[e] = static_cast<int8_t>(blk[2 + e]);
    return;
  }
  const bool has_min = type == TensorType::Q4_1 || type == TensorType::Q5_1;
  if (has_min) {
    uint16_t mh;
    std::memcpy(&mh, blk + 2, 2);
    add = fp16_to_fp32(mh);
  }
  const bool five = type == TensorType::Q5_0 || type == TensorType::Q5_1;
  uint32_t qh = 0;
  if (five) std::memcpy(&qh, blk + (has_min ? 4 : 2), 4);
  const uint8_t* qs = blk + (has_min ? 4 : 2) + (five ? 4 : 0);
  const int bias = type == TensorType::Q4_0 ? 8 : type == TensorType::Q5_0 ? 16 : 0;
  for (int j = 0; j < 16; ++j) {
    int lo = qs[j] & 0x0F, hi = qs[j] >> 4;
    if (five) {
      lo |= static_cast<int>((qh >> j) & 1u) << 4;
      hi |= static_cast<int>((qh >> (j + 16)) & 1u) << 4;
    }
    q[j] = lo - bias;
    q[j + 16] = hi - bias;
  }
}

}  // namespace

float quantize_block_int8(const float* x, int8_t* q) { return quantize_block(x, q, 127.0f); }
float quantize_block_int16(const float* x, int16_t* q) { return quantize_block(x, q, 32767.0f); }

bool has_int8_decode_product(TensorType type) {
  switch (type) {
    case TensorType::Q4_0: case TensorType::Q4_1: case TensorType::Q5_0: case TensorType::Q5_1:
    case TensorType::Q8_0: case TensorType::Q4_K: case TensorType::Q5_K: case TensorType::Q6_K:
      return true;
    default:
      return false;
  }
}

bool has_int16_decode_product(TensorType type) {
  switch (type) {
    case TensorType::Q4_0: case TensorType::Q4_1: case TensorType::Q5_0: case TensorType::Q5_1:
      return true;
    default:
      return false;
  }
}

void reference_gemv_rounded_activations(TensorType type, int bits, const void* w, const float* x, float* y, int64_t n,
                                        int64_t in_features, int64_t out_features) {
  const std::string what = "reference_gemv_rounded_activations: ";
  if (bits != 8 && bits != 16) throw std::invalid_argument(what + std::to_string(bits) + "-bit activations (8 or 16)");
  if (!(bits == 8 ? has_int8_decode_product(type) : has_int16_decode_product(type)))
    throw std::invalid_argument(what + "no int" + std::to_string(bits) + " product for " + type_traits(type).name +
                                " weights");
  const int64_t elements = is_k_quant(type) ? kQK_K : 32;
  if (in_features % elements != 0)
    throw std::invalid_argument(what + "in_features " + std::to_string(in_features) + " is not a multiple of " +
                                std::to_string(elements));
  const int64_t blocks = in_features / 32;
  const int64_t row_bytes = type_row_bytes(type, in_features);
  std::vector<int16_t> q(static_cast<size_t>(n * in_features));
  std::vector<float> scale(static_cast<size_t>(n * blocks));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + t * in_features + b * 32;
      int16_t* qb = &q[t * in_features + b * 32];
      if (bits == 16) {
        scale[t * blocks + b] = quantize_block_int16(xb, qb);
      } else {
        int8_t q8[32];
        scale[t * blocks + b] = quantize_block_int8(xb, q8);
        for (int i = 0; i < 32; ++i) qb[i] = q8[i];
      }
    }
  const auto* base = static_cast<const uint8_t*>(w);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t o = 0; o < out_features; ++o) {
      double acc = 0.0;
      for (int64_t b = 0; b < blocks; ++b) {
        int wq[32];
        float wscale[2], add;
        block_as_integers(type, base + o * row_bytes, b, wq, wscale, add);
        const int16_t* qx = &q[t * in_features + b * 32];
        for (int half = 0; half < 2; ++half) {
          int64_t isum = 0;
          for (int e = 16 * half; e < 16 * half + 16; ++e) isum += static_cast<int64_t>(wq[e]) * qx[e];
          acc += static_cast<double>(wscale[half]) * scale[t * blocks + b] * static_cast<double>(isum);
        }
        if (add != 0.0f) {
          double xsum = 0.0;
          for (int i = 0; i < 32; ++i) xsum += x[t * in_features + b * 32 + i];
          acc += static_cast<double>(add) * xsum;
        }
      }
      y[t * out_features + o] = static_cast<float>(acc);
    }
}

}  // namespace bs::kernels
