// Test helper: reproducible random inputs and a scale-aware error measure, shared by
// the kernel tests (CPU variants, attention masks, CUDA ops).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace bs::test {

// n normal values, mean 0, standard deviation `scale`, from `seed`.
inline std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// max |a-b| / (max |b| + eps): a scale-aware error measure for whole outputs.
inline double rel_max_err(const std::vector<float>& a, const std::vector<float>& b) {
  double err = 0, mag = 1e-12;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, static_cast<double>(std::fabs(a[i] - b[i])));
    mag = std::max(mag, static_cast<double>(std::fabs(b[i])));
  }
  return err / mag;
}

// rows x cols weights of a ggml block type as random stored blocks: every quant, packed
// scale and high-bit byte uniformly random, the fp16 scale fields finite and of random
// sign (magnitude 2^-14 .. 2^-6, so products stay in fp32's comfortable range). For
// the types a test quantizer would need a search to produce (Q5_0, Q5_1, the K-quants),
// whose dequantization tests/test_dequant.cpp checks against gguf-py bit for bit.
// `block_bytes` and `scale_at` (offsets of the fp16 fields in a block) describe the type.
inline std::vector<uint8_t> random_blocks(int64_t rows, int64_t cols, int64_t block_elements, int64_t block_bytes,
                                          std::vector<int> scale_at, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t blocks = rows * (cols / block_elements);
  std::vector<uint8_t> out(static_cast<size_t>(blocks * block_bytes));
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  for (int64_t b = 0; b < blocks; ++b)
    for (int at : scale_at) {
      // fp16: sign, exponent 1..9 (2^-14 .. 2^-6), random mantissa
      const uint16_t h = static_cast<uint16_t>((rng() & 0x8000u) | ((1u + rng() % 9u) << 10) | (rng() & 0x3ffu));
      out[static_cast<size_t>(b * block_bytes + at)] = static_cast<uint8_t>(h & 0xff);
      out[static_cast<size_t>(b * block_bytes + at + 1)] = static_cast<uint8_t>(h >> 8);
    }
  return out;
}

}  // namespace bs::test
