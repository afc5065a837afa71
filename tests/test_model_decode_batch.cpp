// Transformer::decode_step, the batched decode step of continuous batching: B
// sequences of different lengths and contents advance by one token each in one
// [B, dim] batch. Every row must be bit-identical to forward() of that token alone
// (logits and the K/V written), so a request decodes to the same tokens whoever it
// shares its steps with; a full cache refuses the whole step and changes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/transformer.h"
#include "tests/model_fixture.h"

namespace bs {
namespace {

// Sequence i: a different text, cut to a different length (2 .. ~150 tokens).
std::vector<int32_t> prompt_for(const LlamaModel& m, int i) {
  static const char* kTexts[] = {
      "The river that runs through the old town was once the main road for merchants carrying salt and wool. "
      "In the spring, the water rises quickly, and the lower streets near the bridge are often flooded for days.",
      "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
      "Question: what is the boiling point of water at sea level? Answer:",
      "Historians believe the first stone bridge was built in the twelfth century by monks from a nearby abbey. "
      "Today the market square hosts a weekly fair where farmers sell cheese, honey, apples and fresh bread. "
      "A small museum beside the town hall keeps maps, coins and letters written by the families who lived here.",
      "1, 2, 3, 5, 8, 13, 21, 34, 55, 89,",
      "Hello!",
  };
  constexpr int kCount = sizeof(kTexts) / sizeof(kTexts[0]);
  auto ids = m.tokenizer().encode(std::string(kTexts[i % kCount]) + std::string(static_cast<size_t>(i / kCount), ' ') +
                                      kTexts[(i + 1) % kCount],
                                  true);
  const size_t keep = std::min(ids.size(), static_cast<size_t>(2 + (i * 37) % 150));
  ids.resize(keep);
  return ids;
}

int32_t argmax(const float* row, int64_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// The K/V rows [0, length) of every layer and head, and the length.
void expect_same_kv(const KvCache& a, const KvCache& b, const std::string& what) {
  ASSERT_EQ(a.length, b.length) << what;
  const size_t n = static_cast<size_t>(a.length * a.head_dim);
  std::vector<float> ak(n), av(n), bk(n), bv(n);
  for (int l = 0; l < a.n_layers; ++l)
    for (int h = 0; h < a.kv_heads; ++h) {
      a.read_rows(l, h, 0, a.length, ak.data(), av.data());
      b.read_rows(l, h, 0, b.length, bk.data(), bv.data());
      EXPECT_TRUE(same_bits(ak.data(), bk.data(), n)) << what << " K layer " << l << " head " << h;
      EXPECT_TRUE(same_bits(av.data(), bv.data(), n)) << what << " V layer " << l << " head " << h;
    }
}

// A pool whose free pages were handed back in a shuffled order: caches made from it
// have their pages out of order and interleaved with each other's.
std::shared_ptr<KvPagePool> fragmented_pool(const Transformer& tf, int64_t pages) {
  const auto& c = tf.model().config();
  auto pool = KvPagePool::make(tf.model().backend(), c.n_layers, c.n_kv_heads, c.head_dim, pages);
  std::vector<KvCache> one_page;
  for (int64_t i = 0; i < pages; ++i) one_page.push_back(pool->make_cache(1));
  std::mt19937 rng(7);
  std::shuffle(one_page.begin(), one_page.end(), rng);
  one_page.clear();
  return pool;
}

// B sequences prefilled the same way twice: `solo` decodes one forward() per
// sequence in a cache of its own (pages in order), `batch` one decode_step for all,
// in caches from one fragmented pool (pages out of order and interleaved).
struct Sequences {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<KvCache> solo, batch;
  std::vector<int32_t> next;  // the token each sequence decodes next
};

Sequences prefilled(const Transformer& tf, int B, int64_t room) {
  Sequences s;
  const int64_t vocab = tf.model().config().vocab;
  auto pool = fragmented_pool(tf, B * ((150 + room) / 64 + 2));
  for (int b = 0; b < B; ++b) {
    s.prompts.push_back(prompt_for(tf.model(), b));
    const int64_t n = static_cast<int64_t>(s.prompts.back().size());
    s.solo.push_back(tf.make_cache(n + room));
    s.batch.push_back(pool->make_cache(n + room));
    const auto a = tf.forward(s.prompts.back(), s.solo.back());
    const auto c = tf.forward(s.prompts.back(), s.batch.back());
    EXPECT_TRUE(a.size() == c.size() && same_bits(a.data(), c.data(), a.size()));
    s.next.push_back(argmax(a.data(), vocab));
  }
  return s;
}

TEST(ModelDecodeBatch, RowsAreBitIdenticalToSoloForwards) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(testing::fast_precision());
  Transformer tf(m);
  const int64_t vocab = m.config().vocab;
  const int64_t exact = m.backend().linear_exact_rows();
  // 12: more sequences than one exact linear() takes on the CPU backend (8), so the
  // step runs in parts.
  for (int B : {1, 2, 3, 5, 8, 12}) {
    SCOPED_TRACE("B = " + std::to_string(B) + ", linear_exact_rows = " + std::to_string(exact));
    constexpr int kSteps = 3;
    Sequences s = prefilled(tf, B, kSteps);
    std::vector<int64_t> lengths;
    for (const auto& p : s.prompts) lengths.push_back(static_cast<int64_t>(p.size()));
    std::sort(lengths.begin(), lengths.end());
    if (B > 1) {
      EXPECT_LT(lengths.front(), lengths.back()) << "the sequences must differ in length";
    }
    for (int step = 0; step < kSteps; ++step) {
      std::vector<KvCache*> caches;
      for (auto& c : s.batch) caches.push_back(&c);
      const std::vector<float> got = tf.decode_step(s.next, caches);
      ASSERT_EQ(got.size(), static_cast<size_t>(B * vocab));
      for (int b = 0; b < B; ++b) {
        const int32_t token = s.next[b];
        const std::vector<float> want = tf.forward(std::span<const int32_t>(&token, 1), s.solo[b]);
        ASSERT_EQ(want.size(), static_cast<size_t>(vocab));
        EXPECT_TRUE(same_bits(got.data() + b * vocab, want.data(), static_cast<size_t>(vocab)))
            << "logits of sequence " << b << " (" << s.prompts[b].size() << " prompt tokens) at step " << step;
        expect_same_kv(s.batch[b], s.solo[b], "sequence " + std::to_string(b) + " step " + std::to_string(step));
        s.next[b] = argmax(want.data(), vocab);
      }
    }
  }
}

TEST(ModelDecodeBatch, AFullCacheRefusesTheStepAndChangesNothing) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(testing::fast_precision());
  Transformer tf(m);
  Sequences s = prefilled(tf, 3, 1);
  // Sequence 2 fills its last row: the next step has no room for it.
  {
    const int32_t token = s.next[2];
    tf.forward(std::span<const int32_t>(&token, 1), s.batch[2]);
    ASSERT_EQ(s.batch[2].length, s.batch[2].capacity);
  }
  // Every float of a cache, also the rows past `length` the step would write.
  auto snapshot = [](const KvCache& c) {
    const size_t layer = static_cast<size_t>(c.kv_heads * c.capacity * c.head_dim);
    std::vector<float> kv(2 * layer * static_cast<size_t>(c.n_layers));
    for (int l = 0; l < c.n_layers; ++l)
      c.read_layer(l, c.capacity, kv.data() + 2 * l * layer, kv.data() + (2 * l + 1) * layer);
    return kv;
  };
  std::vector<std::vector<float>> before;
  std::vector<int64_t> lengths;
  for (const auto& c : s.batch) {
    before.push_back(snapshot(c));
    lengths.push_back(c.length);
  }
  std::vector<KvCache*> caches = {&s.batch[0], &s.batch[1], &s.batch[2]};
  EXPECT_THROW(tf.decode_step(s.next, caches), std::length_error);
  for (int b = 0; b < 3; ++b) {
    EXPECT_EQ(s.batch[b].length, lengths[b]) << b;
    const auto after = snapshot(s.batch[b]);  // bytes: rows never written may hold NaN patterns
    EXPECT_TRUE(after.size() == before[b].size() && same_bits(after.data(), before[b].data(), after.size()))
        << "K/V of sequence " << b << " changed";
  }
  // Without the full one the step runs.
  std::vector<KvCache*> two = {&s.batch[0], &s.batch[1]};
  const std::vector<int32_t> tokens = {s.next[0], s.next[1]};
  EXPECT_NO_THROW(tf.decode_step(tokens, two));
  EXPECT_EQ(s.batch[0].length, lengths[0] + 1);
}

TEST(ModelDecodeBatch, BadArgumentsAreRefused) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(testing::fast_precision());
  Transformer tf(m);
  Sequences s = prefilled(tf, 2, 4);
  std::vector<KvCache*> twice = {&s.batch[0], &s.batch[0]};
  EXPECT_THROW(tf.decode_step(s.next, twice), std::invalid_argument);
  std::vector<KvCache*> one = {&s.batch[0]};
  EXPECT_THROW(tf.decode_step(s.next, one), std::invalid_argument);
  EXPECT_THROW(tf.decode_step({}, std::span<KvCache* const>{}), std::invalid_argument);
  std::vector<KvCache*> both = {&s.batch[0], &s.batch[1]};
  const std::vector<int32_t> bad = {0, static_cast<int32_t>(m.config().vocab)};
  EXPECT_THROW(tf.decode_step(bad, both), std::out_of_range);
  EXPECT_EQ(s.batch[0].length, static_cast<int64_t>(s.prompts[0].size()));
  EXPECT_EQ(s.batch[1].length, static_cast<int64_t>(s.prompts[1].size()));
}

}  // namespace
}  // namespace bs
