#include "storage/key_bloom.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace bs {

KeyBloom KeyBloom::sized_for(int64_t expected_keys, double fp_rate, int64_t max_bits) {
  if (!(fp_rate > 0 && fp_rate < 1)) throw std::invalid_argument("KeyBloom: fp_rate must be in (0, 1)");
  const double n = static_cast<double>(std::max<int64_t>(expected_keys, 1));
  const double ln2 = std::log(2.0);
  double m = std::ceil(-n * std::log(fp_rate) / (ln2 * ln2));
  m = std::clamp(m, 64.0, static_cast<double>(std::max<int64_t>(max_bits, 64)));
  const int64_t words = (static_cast<int64_t>(m) + 63) / 64;
  const int probes = std::clamp(static_cast<int>(std::lround(static_cast<double>(words * 64) / n * ln2)), 1, 16);
  return KeyBloom(std::vector<uint64_t>(static_cast<size_t>(words), 0), probes);
}

KeyBloom::KeyBloom(std::vector<uint64_t> words, int probes) : words_(std::move(words)), probes_(probes) {
  if (words_.empty()) throw std::invalid_argument("KeyBloom: empty bit array");
  if (probes_ < 1 || probes_ > 16) throw std::invalid_argument("KeyBloom: probes must be 1..16");
}

void KeyBloom::add(const ChunkKey& key) {
  if (words_.empty()) return;
  const uint64_t m = static_cast<uint64_t>(bits());
  for (int i = 0; i < probes_; ++i) {
    const uint64_t bit = (key.lo + static_cast<uint64_t>(i) * (key.hi | 1)) % m;
    words_[bit / 64] |= uint64_t{1} << (bit % 64);
  }
  ++added_;
}

bool KeyBloom::may_contain(const ChunkKey& key) const {
  if (words_.empty()) return false;
  const uint64_t m = static_cast<uint64_t>(bits());
  for (int i = 0; i < probes_; ++i) {
    const uint64_t bit = (key.lo + static_cast<uint64_t>(i) * (key.hi | 1)) % m;
    if (!(words_[bit / 64] >> (bit % 64) & 1)) return false;
  }
  return true;
}

}  // namespace bs
