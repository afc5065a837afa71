// The compute path under concurrent requests: two threads running the model at the
// same time (sharing the model, its packed weights, the oneDNN primitives and the
// backend's RoPE cache) must get exactly what each gets alone.
#include <gtest/gtest.h>

#include <cstring>
#include <latch>
#include <string>
#include <thread>
#include <vector>

#include "model/generate.h"
#include "model/transformer.h"
#include "tests/model_fixture.h"

namespace bs {
namespace {

// About 200+ tokens of plain prose: prefill goes through the oneDNN GEMMs.
std::string long_text(int paragraphs) {
  static const char* kSentences[] = {
      "The river that runs through the old town was once the main road for merchants carrying salt and wool.",
      "In the spring, the water rises quickly, and the lower streets near the bridge are often flooded for days.",
      "Historians believe the first stone bridge was built in the twelfth century by monks from a nearby abbey.",
      "Today the market square hosts a weekly fair where farmers sell cheese, honey, apples and fresh bread.",
      "A small museum beside the town hall keeps maps, coins and letters written by the families who lived here.",
      "Visitors usually arrive by train, walk along the river, and climb the hill to see the ruins of the castle.",
  };
  std::string out;
  for (int p = 0; p < paragraphs; ++p)
    for (const char* s : kSentences) out += std::string(s) + " ";
  return out;
}

std::vector<int32_t> prompt_of(const LlamaModel& m, const std::string& text, size_t min_tokens, size_t max_tokens) {
  auto ids = m.tokenizer().encode(text, true);
  EXPECT_GE(ids.size(), min_tokens);
  if (ids.size() > max_tokens) ids.resize(max_tokens);
  return ids;
}

std::vector<int32_t> generate_greedy(const LlamaModel& m, const std::vector<int32_t>& prompt, int steps) {
  Transformer tf(m);
  auto cache = tf.make_cache(static_cast<int64_t>(prompt.size()) + steps);
  SamplingParams p;
  p.temperature = 0.0f;
  p.max_tokens = steps;
  return generate(tf, cache, prompt, p).tokens;
}

std::vector<float> forward_all(const LlamaModel& m, const std::vector<int32_t>& prompt) {
  Transformer tf(m);
  auto cache = tf.make_cache(static_cast<int64_t>(prompt.size()));
  return tf.forward(prompt, cache, /*all_logits=*/true);
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(ModelConcurrency, ConcurrentGenerationsMatchSolo) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(testing::fast_precision());
  constexpr int kSteps = 24;
  const std::vector<std::vector<int32_t>> prompts = {
      prompt_of(m, "The capital of France is", 4, 64),
      prompt_of(m, long_text(2), 200, 220),
  };
  std::vector<std::vector<int32_t>> solo;
  for (const auto& p : prompts) {
    solo.push_back(generate_greedy(m, p, kSteps));
    EXPECT_EQ(solo.back().size(), static_cast<size_t>(kSteps));
  }
  for (int round = 0; round < 3; ++round) {
    std::vector<std::vector<int32_t>> got(prompts.size());
    std::latch start(static_cast<std::ptrdiff_t>(prompts.size()));
    std::vector<std::thread> threads;
    for (size_t i = 0; i < prompts.size(); ++i)
      threads.emplace_back([&, i] {
        start.arrive_and_wait();
        got[i] = generate_greedy(m, prompts[i], kSteps);
      });
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], solo[i]) << "round " << round << ", prompt " << i;
  }
}

// The same 300-token prefill from two threads at once: the very same primitives run
// concurrently. Every logit must equal the single-thread run bit for bit.
TEST(ModelConcurrency, ConcurrentForwardIsBitExact) {
  REQUIRE_MODEL();
  for (auto precision : {testing::fast_precision(), kernels::Precision::F32}) {
    SCOPED_TRACE(kernels::precision_name(precision));
    const auto& m = testing::shared_model(precision);
    const auto prompt = prompt_of(m, long_text(3), 300, 300);
    ASSERT_EQ(prompt.size(), 300u);
    const auto solo = forward_all(m, prompt);
    ASSERT_EQ(solo.size(), static_cast<size_t>(300 * m.config().vocab));
    for (int round = 0; round < 2; ++round) {
      std::vector<std::vector<float>> got(2);
      std::latch start(2);
      std::vector<std::thread> threads;
      for (int i = 0; i < 2; ++i)
        threads.emplace_back([&, i] {
          start.arrive_and_wait();
          got[i] = forward_all(m, prompt);
        });
      for (auto& t : threads) t.join();
      for (int i = 0; i < 2; ++i) EXPECT_TRUE(bit_equal(got[i], solo)) << "round " << round << ", thread " << i;
    }
    if (precision == kernels::Precision::F32) break;  // fast_precision() was f32 already, or both are done
  }
}

}  // namespace
}  // namespace bs
