// Sampling respects temperature, top-k and top-p: draws come only from the allowed
// set, in proportion to their probabilities; the same seed gives the same draws.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "model/generate.h"

namespace bs {
namespace {

// Logits whose softmax (temperature 1) is exactly `probs`.
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

std::map<int32_t, int> draw(const SamplingParams& p, const std::vector<float>& logits, int n) {
  Sampler s(p);
  std::map<int32_t, int> counts;
  for (int i = 0; i < n; ++i) ++counts[s.sample(logits.data(), static_cast<int64_t>(logits.size()))];
  return counts;
}

const std::vector<double> kProbs = {0.05, 0.4, 0.02, 0.3, 0.03, 0.2};  // ranks: 1, 3, 5, 0, 4, 2

TEST(Sampling, GreedyIsArgmax) {
  const auto l = logits_of(kProbs);
  SamplingParams p;  // temperature 0
  EXPECT_EQ(draw(p, l, 50), (std::map<int32_t, int>{{1, 50}}));
  EXPECT_EQ(argmax(l.data(), static_cast<int64_t>(l.size())), 1);
}

TEST(Sampling, TopKKeepsTheKMostLikely) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  p.seed = 7;
  const auto counts = draw(p, logits_of(kProbs), 4000);
  ASSERT_EQ(counts.size(), 2u);
  // renormalized: 0.4 / 0.7 and 0.3 / 0.7
  EXPECT_NEAR(counts.at(1) / 4000.0, 0.4 / 0.7, 0.03);
  EXPECT_NEAR(counts.at(3) / 4000.0, 0.3 / 0.7, 0.03);
}

TEST(Sampling, TopPKeepsTheSmallestNucleus) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.75f;  // 0.4 + 0.3 = 0.7 < 0.75, + 0.2 = 0.9: tokens 1, 3, 5
  p.seed = 11;
  const auto counts = draw(p, logits_of(kProbs), 6000);
  ASSERT_EQ(counts.size(), 3u);
  EXPECT_TRUE(counts.count(1) && counts.count(3) && counts.count(5));
  EXPECT_NEAR(counts.at(5) / 6000.0, 0.2 / 0.9, 0.03);
  p.top_p = 0.35f;  // the top token alone (0.4) reaches it
  EXPECT_EQ(draw(p, logits_of(kProbs), 200).size(), 1u);
}

TEST(Sampling, TemperatureSharpensAndSeedsRepeat) {
  SamplingParams p;
  p.temperature = 0.25f;  // p^4 renormalized: token 1 gets 0.4^4 / sum ≈ 0.71
  p.seed = 3;
  const auto l = logits_of(kProbs);
  const auto counts = draw(p, l, 4000);
  double z = 0;
  for (double q : kProbs) z += std::pow(q, 4);
  EXPECT_NEAR(counts.at(1) / 4000.0, std::pow(0.4, 4) / z, 0.03);
  EXPECT_EQ(draw(p, l, 300), draw(p, l, 300));
  p.seed = 4;
  EXPECT_NE(draw(p, l, 300), (draw(SamplingParams{0.25f, 1.0f, 0, 3, 256, {}}, l, 300)));
}

}  // namespace
}  // namespace bs
