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

}  // namespace bs::test
