// Sampling respects temperature, top-k and top-p: draws come only from the allowed
// set, in proportion to their probabilities; the same seed gives the same draws.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/sampling.h"
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

// The pick (kernels/sampling.h), which the device sampler must match, is the sampler's
// former std::discrete_distribution arithmetic: for random logits, settings and
// generator states, the same token as that code (kept here as the oracle) from the same
// generator state — ties broken by lower index, which the oracle's partial_sort left
// unspecified, do not occur in random floats.
int32_t oracle_sample(const SamplingParams& p, const float* logits, int64_t vocab, std::mt19937_64& rng) {
  if (p.temperature <= 0.0f) return argmax(logits, vocab);
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  int64_t keep = vocab;
  if (p.top_k > 0 && p.top_k < vocab) keep = p.top_k;
  const int64_t sort_n = std::min<int64_t>(keep, 1024);
  std::partial_sort(idx.begin(), idx.begin() + sort_n, idx.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  keep = std::min(keep, sort_n);
  const float inv_t = 1.0f / p.temperature;
  std::vector<double> probs(static_cast<size_t>(keep));
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += probs[i] = std::exp((logits[idx[i]] - mx) * inv_t);
  if (p.top_p < 1.0f) {
    double cum = 0;
    int64_t cut = keep;
    for (int64_t i = 0; i < keep; ++i) {
      cum += probs[i] / sum;
      if (cum >= p.top_p) {
        cut = i + 1;
        break;
      }
    }
    probs.resize(static_cast<size_t>(cut));
  }
  std::discrete_distribution<int64_t> dist(probs.begin(), probs.end());
  return idx[dist(rng)];
}

TEST(Sampling, ThePickIsTheFormerDiscreteDistributionArithmetic) {
  std::mt19937 gen(5);
  std::normal_distribution<float> logit(0.0f, 3.0f);
  int compared = 0;
  for (int64_t vocab : {int64_t{2}, int64_t{7}, int64_t{300}, int64_t{5000}}) {
    std::vector<float> l(static_cast<size_t>(vocab));
    for (auto& x : l) x = logit(gen);
    for (float temperature : {0.0f, 0.3f, 1.0f, 1.7f})
      for (int top_k : {0, 1, 5, 2000})
        for (float top_p : {1.0f, 0.9f, 0.5f}) {
          SamplingParams p;
          p.temperature = temperature;
          p.top_k = top_k;
          p.top_p = top_p;
          std::mt19937_64 a(compared), b(compared);
          for (int step = 0; step < 20; ++step) {
            const int32_t want = oracle_sample(p, l.data(), vocab, a);
            const kernels::SampleRow row{temperature, top_p, top_k,
                                         temperature > 0 ? kernels::uniform_draw(b) : 0.0};
            EXPECT_EQ(kernels::pick_token(l.data(), vocab, row), want)
                << "vocab " << vocab << " T " << temperature << " top_k " << top_k << " top_p " << top_p;
            a = b;  // the oracle skips its draw when one candidate is left; the pick always draws
            ++compared;
          }
        }
  }
  EXPECT_EQ(compared, 4 * 4 * 4 * 3 * 20);
}

// The runtime's path: the draw made when the step is asked for, the pick later (on the
// device or here) — the same tokens as sampling on the spot.
TEST(Sampling, ADrawMadeAheadPicksTheSameTokens) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_p = 0.95f;
  p.seed = 9;
  const auto l = logits_of(kProbs);
  Sampler now(p), ahead(p);
  for (int i = 0; i < 200; ++i) {
    const kernels::SampleRow row = ahead.next_row();
    EXPECT_EQ(kernels::pick_token(l.data(), static_cast<int64_t>(l.size()), row),
              now.sample(l.data(), static_cast<int64_t>(l.size())));
  }
}

}  // namespace
}  // namespace bs
