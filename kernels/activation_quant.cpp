#include "kernels/activation_quant.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/dequant.h"

namespace bs::kernels {

float quantize_block_int8(const float* x, int8_t* q) {
  float amax = 0.0f;
  for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
  const float inv = 1.0f / scale;
  for (int i = 0; i < 32; ++i) q[i] = static_cast<int8_t>(std::lrintf(x[i] * inv));
  return scale;
}

void reference_gemv_int8_activations(TensorType type, const void* w, const float* x, float* y, int64_t n,
                                     int64_t in_features, int64_t out_features) {
  if (type != TensorType::Q4_0 && type != TensorType::Q4_1)
    throw std::invalid_argument("reference_gemv_int8_activations: Q4_0 or Q4_1 weights only");
  if (in_features % 32 != 0)
    throw std::invalid_argument("reference_gemv_int8_activations: in_features " + std::to_string(in_features) +
                                " is not a multiple of 32");
  const int64_t blocks = in_features / 32;
  const int64_t bbytes = type == TensorType::Q4_1 ? 20 : 18;
  std::vector<int8_t> q(static_cast<size_t>(n * in_features));
  std::vector<float> scale(static_cast<size_t>(n * blocks));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t b = 0; b < blocks; ++b)
      scale[t * blocks + b] = quantize_block_int8(x + t * in_features + b * 32, &q[t * in_features + b * 32]);
  const auto* base = static_cast<const uint8_t*>(w);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t o = 0; o < out_features; ++o) {
      double acc = 0.0;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = base + (o * blocks + b) * bbytes;
        uint16_t dh, mh = 0;
        std::memcpy(&dh, blk, 2);
        if (type == TensorType::Q4_1) std::memcpy(&mh, blk + 2, 2);
        const uint8_t* qs = blk + (type == TensorType::Q4_1 ? 4 : 2);
        const int8_t* qx = &q[t * in_features + b * 32];
        int64_t isum = 0;
        for (int j = 0; j < 16; ++j) {
          const int lo = qs[j] & 0x0F, hi = qs[j] >> 4;
          const int off = type == TensorType::Q4_0 ? 8 : 0;
          isum += static_cast<int64_t>(lo - off) * qx[j] + static_cast<int64_t>(hi - off) * qx[j + 16];
        }
        acc += static_cast<double>(fp16_to_fp32(dh)) * scale[t * blocks + b] * static_cast<double>(isum);
        if (type == TensorType::Q4_1) {
          double xsum = 0.0;
          for (int i = 0; i < 32; ++i) xsum += x[t * in_features + b * 32 + i];
          acc += static_cast<double>(fp16_to_fp32(mh)) * xsum;
        }
      }
      y[t * out_features + o] = static_cast<float>(acc);
    }
}

}  // namespace bs::kernels
