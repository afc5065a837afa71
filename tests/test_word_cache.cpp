// model/word_cache.h: what is kept comes back whole, a word too long is not kept, and
// the cache never grows past its bound.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/word_cache.h"

namespace {

using bs::WordCache;

TEST(WordCache, AKeptWordsTokensAreAppendedWhole) {
  WordCache c;
  std::vector<int32_t> out = {9};
  EXPECT_FALSE(c.find(" the", out));
  const int32_t ids[] = {4, 5, 6};
  c.add(" the", ids, 3);
  c.add(" the", ids, 1);  // the first kept stays: a word has one tokenization
  EXPECT_TRUE(c.find(" the", out));
  EXPECT_EQ(out, (std::vector<int32_t>{9, 4, 5, 6}));
  EXPECT_FALSE(c.find(" th", out));
  EXPECT_EQ(c.size(), 1u);
}

TEST(WordCache, LongWordsAreNotKeptAndTheCacheStaysBounded) {
  WordCache c;
  const int32_t id = 1;
  c.add(std::string(WordCache::kMaxWordBytes + 1, 'x'), &id, 1);
  EXPECT_EQ(c.size(), 0u);
  for (size_t i = 0; i < WordCache::kMaxWords + 10; ++i) {
    c.add("w" + std::to_string(i), &id, 1);
    ASSERT_LE(c.size(), WordCache::kMaxWords);
  }
  std::vector<int32_t> out;
  EXPECT_TRUE(c.find("w" + std::to_string(WordCache::kMaxWords + 9), out));  // kept after the cache emptied
}

}  // namespace
