// The forward pass against llama.cpp (an implementation we did not write), run on
// an F32 export of the same weights: tests/fixtures/golden_logits.json, made by
// tools/make_golden.py. Then the fast bf16 path against our fp32 path.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>

#include "model/generate.h"
#include "model/transformer.h"
#include "tests/model_fixture.h"

namespace bs {
namespace {

using kernels::Precision;
using json = nlohmann::json;

struct GoldenPrompt {
  std::string text;
  std::vector<int32_t> ids;
  std::vector<float> final_logits;
  std::vector<int32_t> greedy32;
  std::vector<int32_t> position_top1;
};

const std::vector<GoldenPrompt>& golden() {
  static std::vector<GoldenPrompt> prompts = [] {
    std::vector<GoldenPrompt> out;
    const std::string dir = BLENDSERVE_FIXTURES;
    auto j = json::parse(testing::read_file(dir + "/golden_logits.json"));
    for (const auto& p : j.at("prompts")) {
      GoldenPrompt g;
      g.text = p.at("text").get<std::string>();
      g.ids = p.at("ids").get<std::vector<int32_t>>();
      g.greedy32 = p.at("greedy32").get<std::vector<int32_t>>();
      g.position_top1 = p.at("position_top1").get<std::vector<int32_t>>();
      const std::string raw = testing::read_file(dir + "/" + p.at("final_logits_file").get<std::string>());
      g.final_logits.resize(raw.size() / 4);
      std::memcpy(g.final_logits.data(), raw.data(), raw.size());
      out.push_back(std::move(g));
    }
    return out;
  }();
  return prompts;
}

std::vector<float> all_logits(const LlamaModel& m, const std::vector<int32_t>& ids) {
  Transformer tf(m);
  auto cache = tf.make_cache(static_cast<int64_t>(ids.size()));
  return tf.forward(ids, cache, /*all_logits=*/true);
}

std::vector<int32_t> greedy(const LlamaModel& m, const std::vector<int32_t>& ids, int steps) {
  Transformer tf(m);
  auto cache = tf.make_cache(static_cast<int64_t>(ids.size()) + steps);
  auto logits = tf.forward(ids, cache);
  std::vector<int32_t> out;
  for (int i = 0; i < steps; ++i) {
    const int32_t next = argmax(logits.data(), m.config().vocab);
    out.push_back(next);
    if (i + 1 < steps) logits = tf.forward(std::span<const int32_t>(&next, 1), cache);
  }
  return out;
}

TEST(ModelGolden, FixturePromptsTokenizeIdentically) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(Precision::F32);
  ASSERT_GE(golden().size(), 5u);
  for (const auto& g : golden()) EXPECT_EQ(m.tokenizer().encode(g.text, true), g.ids) << g.text;
}

// Tolerance on the final-position logits of the fp32 path vs llama.cpp fp32:
// max |Δ| < 1e-3 (measured 5e-5; logits span about ±30); sums run in different orders.
TEST(ModelGolden, Fp32FinalLogitsMatchReference) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(Precision::F32);
  for (const auto& g : golden()) {
    Transformer tf(m);
    auto cache = tf.make_cache(static_cast<int64_t>(g.ids.size()));
    auto logits = tf.forward(g.ids, cache);
    ASSERT_EQ(logits.size(), g.final_logits.size());
    double max_diff = 0;
    for (size_t i = 0; i < logits.size(); ++i)
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(logits[i] - g.final_logits[i])));
    EXPECT_LT(max_diff, 1e-3) << g.text.substr(0, 60);
    EXPECT_EQ(argmax(logits.data(), m.config().vocab), argmax(g.final_logits.data(), m.config().vocab));
    std::printf("[fp32 vs llama.cpp] %zu tokens: max |dlogit| = %.5f\n", g.ids.size(), max_diff);
  }
}

TEST(ModelGolden, Fp32GreedyContinuationsMatchReference) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(Precision::F32);
  for (const auto& g : golden()) EXPECT_EQ(greedy(m, g.ids, 32), g.greedy32) << g.text.substr(0, 60);
}

TEST(ModelGolden, Fp32TeacherForcedTop1MatchesReference) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(Precision::F32);
  const int64_t V = m.config().vocab;
  int64_t agree = 0, total = 0;
  for (const auto& g : golden()) {
    auto logits = all_logits(m, g.ids);
    ASSERT_EQ(g.position_top1.size(), g.ids.size());
    for (size_t t = 0; t < g.ids.size(); ++t, ++total) agree += argmax(&logits[t * V], V) == g.position_top1[t];
  }
  std::printf("[fp32 vs llama.cpp] teacher-forced top-1: %lld / %lld\n", static_cast<long long>(agree),
              static_cast<long long>(total));
  EXPECT_GE(static_cast<double>(agree) / static_cast<double>(total), 0.999);
}

// The fast path: bf16 GEMMs against our fp32 path, teacher-forced over the fixture
// prompts. Targets: top-1 agreement >= 99% of positions, mean |Δlogit| < 0.15,
// and the final-position logits within 1.0 (max) of fp32.
TEST(ModelGolden, Bf16PathAgreesWithFp32Path) {
  REQUIRE_MODEL();
  if (!testing::shared_backend().supports(Precision::BF16))
    GTEST_SKIP() << "no native bf16 on " << testing::shared_backend().kernel_id() << ": the fast path is f32";
  const auto& f32 = testing::shared_model(Precision::F32);
  const auto& bf16 = testing::shared_model(Precision::BF16);
  const int64_t V = f32.config().vocab;
  int64_t agree = 0, total = 0;
  double sum_abs = 0, max_abs = 0;
  int64_t count = 0;
  for (const auto& g : golden()) {
    auto a = all_logits(f32, g.ids), b = all_logits(bf16, g.ids);
    for (size_t t = 0; t < g.ids.size(); ++t, ++total) {
      agree += argmax(&a[t * V], V) == argmax(&b[t * V], V);
      for (int64_t i = 0; i < V; ++i) {
        const double d = std::fabs(a[t * V + i] - b[t * V + i]);
        sum_abs += d;
        max_abs = std::max(max_abs, d);
        ++count;
      }
    }
  }
  const double rate = static_cast<double>(agree) / static_cast<double>(total);
  std::printf("[bf16 vs fp32] top-1 %.4f over %lld positions; mean |dlogit| %.4f, max %.3f\n", rate,
              static_cast<long long>(total), sum_abs / count, max_abs);
  EXPECT_GE(rate, 0.99);
  EXPECT_LT(sum_abs / count, 0.15);
}

TEST(ModelChat, AnswersTheCapitalOfFrance) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(testing::fast_precision());
  Transformer tf(m);
  auto ids = m.tokenizer().encode(m.chat_template().apply({{"user", "What is the capital of France?"}}, true), true);
  auto cache = tf.make_cache(static_cast<int64_t>(ids.size()) + 64);
  SamplingParams p;
  p.max_tokens = 64;
  auto r = generate(tf, cache, ids, p);
  EXPECT_NE(r.text.find("Paris"), std::string::npos) << r.text;
  EXPECT_EQ(r.finish_reason, "stop");  // ends its turn with <|im_end|>
}

TEST(ModelGenerate, MaxTokensAndStopStrings) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(testing::fast_precision());
  Transformer tf(m);
  auto ids = m.tokenizer().encode("1, 2, 3, 4, 5, 6, 7,", false);
  SamplingParams p;
  p.max_tokens = 5;
  auto cache = tf.make_cache(64);
  auto r = generate(tf, cache, ids, p);
  EXPECT_EQ(r.tokens.size(), 5u);
  EXPECT_EQ(r.finish_reason, "length");
  // Stop string: the counting continues " 8, 9, ..."; stop at "10" and don't include it.
  p.max_tokens = 30;
  p.stop = {"10"};
  auto cache2 = tf.make_cache(64);
  std::string streamed;
  auto r2 = generate(tf, cache2, ids, p, [&](std::string_view s) {
    streamed += s;
    return true;
  });
  EXPECT_EQ(r2.finish_reason, "stop");
  EXPECT_EQ(r2.text.find("10"), std::string::npos) << r2.text;
  EXPECT_NE(r2.text.find("9"), std::string::npos) << r2.text;
  EXPECT_EQ(streamed, r2.text);  // the streamed pieces are exactly the final text
}

TEST(ModelGenerate, SamplingIsSeededAndValid) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(testing::fast_precision());
  Transformer tf(m);
  auto ids = m.tokenizer().encode("Once upon a time", false);
  SamplingParams p;
  p.max_tokens = 12;
  p.temperature = 1.0f;
  p.top_p = 0.9f;
  p.seed = 42;
  auto run = [&](SamplingParams q) {
    auto cache = tf.make_cache(64);
    return generate(tf, cache, ids, q).tokens;
  };
  const auto a = run(p), b = run(p);
  EXPECT_EQ(a, b);  // same seed, same tokens
  p.seed = 43;
  int differing = 0;
  for (int s = 43; s < 47; ++s) {
    p.seed = s;
    differing += run(p) != a;
  }
  EXPECT_GT(differing, 0);  // other seeds explore
  // top_k = 1 is greedy whatever the temperature
  p.top_k = 1;
  SamplingParams g;
  g.max_tokens = 12;
  EXPECT_EQ(run(p), run(g));
}

TEST(ModelGenerate, RejectsPromptsLongerThanTheContext) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(testing::fast_precision());
  Transformer tf(m);
  auto cache = tf.make_cache(8);
  std::vector<int32_t> ids(9, 100);
  EXPECT_THROW(generate(tf, cache, ids, SamplingParams{}), std::length_error);
}

}  // namespace
}  // namespace bs
