// The Bloom filter workers report their held chunk keys in: no false negatives,
// the false-positive rate it was sized for, bounded size, and a malformed report
// refused.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "storage/key_bloom.h"

namespace bs {
namespace {

std::vector<ChunkKey> random_keys(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<ChunkKey> keys(n);
  for (auto& k : keys) k = {rng(), rng()};
  return keys;
}

TEST(KeyBloom, HoldsEveryKeyAddedAndFewOthers) {
  const auto held = random_keys(5000, 1);
  auto bloom = KeyBloom::sized_for(static_cast<int64_t>(held.size()), 0.01);
  for (const auto& k : held) bloom.add(k);
  for (const auto& k : held) ASSERT_TRUE(bloom.may_contain(k));
  EXPECT_EQ(bloom.keys_added(), 5000);
  int false_positives = 0;
  const auto others = random_keys(100000, 2);
  for (const auto& k : others) false_positives += bloom.may_contain(k);
  const double rate = false_positives / 100000.0;
  EXPECT_LT(rate, 0.02) << "sized for 1%";
  EXPECT_GT(rate, 0.0005) << "a filter this small cannot be exact; sizing is off";
}

TEST(KeyBloom, EmptyFilterHoldsNothing) {
  KeyBloom none;
  EXPECT_FALSE(none.may_contain({1, 2}));
  auto sized = KeyBloom::sized_for(0);
  EXPECT_EQ(sized.bits(), 64);
  EXPECT_FALSE(sized.may_contain({1, 2}));
}

TEST(KeyBloom, SizeIsBoundedAndRoundTripsThroughItsWords) {
  auto big = KeyBloom::sized_for(int64_t{1} << 30, 0.01, 1 << 16);
  EXPECT_EQ(big.bits(), 1 << 16);
  auto bloom = KeyBloom::sized_for(100);
  const auto keys = random_keys(100, 3);
  for (const auto& k : keys) bloom.add(k);
  KeyBloom copy(bloom.words(), bloom.probes());
  for (const auto& k : keys) EXPECT_TRUE(copy.may_contain(k));
}

TEST(KeyBloom, MalformedReportIsRefused) {
  EXPECT_THROW(KeyBloom({}, 3), std::invalid_argument);
  EXPECT_THROW(KeyBloom({1}, 0), std::invalid_argument);
  EXPECT_THROW(KeyBloom({1}, 17), std::invalid_argument);
  EXPECT_THROW(KeyBloom::sized_for(10, 0.0), std::invalid_argument);
}

}  // namespace
}  // namespace bs
