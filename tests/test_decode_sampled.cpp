// The decode path of a device backend, on the CPU: Transformer::decode_step_sampled
// picks each row's next token on the backend (Backend::sample_rows; its default copies
// the logits to the host and picks with kernels/sampling.h) instead of returning the
// logits. The same tokens as decode_step's logits picked with the same draws, greedy and
// sampled rows in one batch, and the caches advance alike. A tiny generated model:
// label "unit", also under ASan+UBSan.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/sampling.h"
#include "model/llama_model.h"
#include "model/transformer.h"
#include "tests/temp_dir.h"
#include "tests/tiny_model.h"

namespace bs {
namespace {

TEST(DecodeSampled, PicksTheTokensTheLogitsGiveWithTheSameDraws) {
  testing::TempDir dir{"bs_decode_sampled"};
  const std::string path = (dir.path() / "tiny.gguf").string();
  testing::tiny_llama_writer("llama", 3).write(path);
  auto backend = kernels::make_cpu_backend();
  LlamaModel model(path, *backend, kernels::Precision::F32, kernels::TensorType::F32);
  Transformer tf(model);
  const int64_t vocab = model.config().vocab;
  const auto& tok = model.tokenizer();
  const std::vector<std::string> prompts = {"hello world and", "the hill and the inn", "on and on at the", "you and i"};
  const int64_t B = static_cast<int64_t>(prompts.size());
  std::vector<KvCache> a, b;
  std::vector<int32_t> next;
  for (const auto& p : prompts) {
    const auto ids = tok.encode(p, false);
    a.push_back(tf.make_cache(64));
    b.push_back(tf.make_cache(64));
    const auto logits = tf.forward(ids, a.back());
    tf.forward(ids, b.back());
    next.push_back(kernels::argmax_logit(logits.data(), vocab));
  }
  std::vector<KvCache*> pa, pb;
  for (int64_t i = 0; i < B; ++i) pa.push_back(&a[i]), pb.push_back(&b[i]);
  std::mt19937_64 rng(42);
  std::vector<int32_t> tokens_a = next, tokens_b = next;
  for (int step = 0; step < 6; ++step) {
    // Row 0 greedy, the others sampled with their own settings and a fresh draw each.
    std::vector<kernels::SampleRow> rows = {{0.0f, 1.0f, 0, 0.0},
                                            {1.0f, 1.0f, 0, kernels::uniform_draw(rng)},
                                            {0.7f, 0.9f, 0, kernels::uniform_draw(rng)},
                                            {1.3f, 1.0f, 5, kernels::uniform_draw(rng)}};
    const auto logits = tf.decode_step(tokens_a, pa);
    for (int64_t i = 0; i < B; ++i) tokens_a[i] = kernels::pick_token(logits.data() + i * vocab, vocab, rows[i]);
    tokens_b = tf.decode_step_sampled(tokens_b, pb, rows);
    EXPECT_EQ(tokens_b, tokens_a) << "step " << step;
    for (int64_t i = 0; i < B; ++i) EXPECT_EQ(b[i].length, a[i].length);
  }
  const std::vector<kernels::SampleRow> too_few(1);
  EXPECT_THROW(tf.decode_step_sampled(tokens_b, pb, too_few), std::invalid_argument);
}

}  // namespace
}  // namespace bs
