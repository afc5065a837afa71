// What the CPU kernel tests share (test_kernels*.cpp): test weights in the stored
// encodings (ggml blocks made from fp32 rows, random K-quant blocks, 16-bit rows) and
// the fixture with one CPU backend per kernel variant beside the reference backend.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/isa.h"
#include "kernels/dequant.h"
#include "random_data.h"

namespace bs::kernels::test_ops {

using cpu::CpuIsa;


// Quantize fp32 rows into Q4_1 blocks (the ggml encoding) for test weights.
inline std::vector<uint8_t> quantize_q4_1(const std::vector<float>& w, int64_t rows, int64_t cols) {
  std::vector<uint8_t> out(static_cast<size_t>(rows * cols / 32 * 20));
  uint8_t* p = out.data();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 32; ++b, p += 20) {
      const float* x = &w[r * cols + b * 32];
      float mn = x[0], mx = x[0];
      for (int i = 0; i < 32; ++i) mn = std::min(mn, x[i]), mx = std::max(mx, x[i]);
      const float d = (mx - mn) / 15.0f;
      const uint16_t dh = fp32_to_fp16(d), mh = fp32_to_fp16(mn);
      std::memcpy(p, &dh, 2);
      std::memcpy(p + 2, &mh, 2);
      const float id = d > 0 ? 1.0f / d : 0.0f;
      for (int i = 0; i < 16; ++i) {
        const int lo = std::min(15, static_cast<int>(std::lround((x[i] - mn) * id)));
        const int hi = std::min(15, static_cast<int>(std::lround((x[i + 16] - mn) * id)));
        p[4 + i] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  return out;
}

inline std::vector<uint8_t> quantize_q4_0(const std::vector<float>& w, int64_t rows, int64_t cols) {
  std::vector<uint8_t> out(static_cast<size_t>(rows * cols / 32 * 18));
  uint8_t* p = out.data();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 32; ++b, p += 18) {
      const float* x = &w[r * cols + b * 32];
      float amax = 0, mx = 0;
      for (int i = 0; i < 32; ++i)
        if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), mx = x[i];
      const float d = mx / -8.0f;
      const uint16_t dh = fp32_to_fp16(d);
      std::memcpy(p, &dh, 2);
      const float id = d != 0 ? 1.0f / d : 0.0f;
      for (int i = 0; i < 16; ++i) {
        const int lo = std::min(15, static_cast<int>(x[i] * id + 8.5f));
        const int hi = std::min(15, static_cast<int>(x[i + 16] * id + 8.5f));
        p[2 + i] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  return out;
}

// Random stored blocks of the types without a test quantizer here (Q5_0, Q5_1 and the
// K-quants; test::random_blocks), or nothing for another type.
inline std::vector<uint8_t> random_typed_blocks(TensorType type, int64_t rows, int64_t cols, uint32_t seed) {
  const auto& t = type_traits(type);
  switch (type) {
    case TensorType::Q5_0: case TensorType::Q4_K: case TensorType::Q5_K:
      return test::random_blocks(rows, cols, t.block_elements, t.block_bytes,
                                 type == TensorType::Q5_0 ? std::vector<int>{0} : std::vector<int>{0, 2}, seed);
    case TensorType::Q5_1: return test::random_blocks(rows, cols, 32, t.block_bytes, {0, 2}, seed);
    case TensorType::Q6_K: return test::random_blocks(rows, cols, 256, t.block_bytes, {208}, seed);
    default: return {};
  }
}

// Plain 16-bit encodings of fp32 weights.
inline std::vector<uint8_t> encode_16bit(const std::vector<float>& w, uint16_t (*conv)(float)) {
  std::vector<uint8_t> out(w.size() * 2);
  for (size_t i = 0; i < w.size(); ++i) {
    const uint16_t h = conv(w[i]);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

inline std::vector<uint8_t> quantize_q8_0(const std::vector<float>& w, int64_t rows, int64_t cols) {
  std::vector<uint8_t> out(static_cast<size_t>(rows * cols / 32 * 34));
  uint8_t* p = out.data();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 32; ++b, p += 34) {
      const float* x = &w[r * cols + b * 32];
      float amax = 0;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float d = amax / 127.0f;
      const uint16_t dh = fp32_to_fp16(d);
      std::memcpy(p, &dh, 2);
      for (int i = 0; i < 32; ++i) p[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(std::lround(d > 0 ? x[i] / d : 0)));
    }
  return out;
}

// One CPU backend per kernel variant, against the reference.
class BackendOps : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (GetParam() > cpu::detect_cpu_isa())
      GTEST_SKIP() << "this CPU cannot execute the " << cpu::isa_name(GetParam()) << " kernels";
    cpu = make_cpu_backend_for(GetParam());
  }
  std::unique_ptr<Backend> ref = make_reference_backend();
  std::unique_ptr<Backend> cpu;
};

}  // namespace bs::kernels::test_ops
