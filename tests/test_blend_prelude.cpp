// Chunks computed behind a prelude (BlendEngine's chunk_prelude) on the real model:
//  - the stored KV is the chunk's rows of a plain forward over prelude + chunk,
//    rotated back to positions 0..m-1 (placed at p it is those rows again), in
//    every layer, K and V;
//  - the prelude is part of the chunk key (never served to an engine with another
//    prelude or none); prefixes are computed alone and keyed as before;
//  - a blend request over prelude-computed chunks answers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "blend/blend_engine.h"
#include "blend/store_backed_blend.h"
#include "blend/rag_prompt.h"
#include "model/generate.h"
#include "storage/memory_store.h"
#include "tests/blend_fixture.h"
#include "tests/model_fixture.h"

namespace bs {
namespace {

using kernels::Precision;
using testing::kDocs;
using testing::kQuestion;
using testing::make_prompt;

class BlendPrelude : public ::testing::Test {
 protected:
  void SetUp() override { REQUIRE_MODEL(); }
};

TEST_F(BlendPrelude, StoredKvIsTheChunksRowsBehindThePreludeInEveryLayer) {
  const LlamaModel& m = testing::shared_model(Precision::F32);
  Transformer tf(m);
  const auto prelude = m.tokenizer().encode("<|im_start|>system\n", true);
  ASSERT_GE(prelude.size(), 2u);
  BlendEngine engine(tf, prelude);
  const auto chunk = m.tokenizer().encode(kDocs[0], false);
  const int64_t p = static_cast<int64_t>(prelude.size()), mlen = static_cast<int64_t>(chunk.size());

  const auto kv = engine.compute_chunk_kv(chunk);
  ASSERT_EQ(kv->tokens, chunk);  // the prelude is not part of the entry

  // Oracle: a plain forward over prelude + chunk.
  std::vector<int32_t> both(prelude);
  both.insert(both.end(), chunk.begin(), chunk.end());
  auto in_place = tf.make_cache(p + mlen);
  tf.forward(both, in_place);
  // Placed at p (rotated by +p), the stored KV must be those rows.
  auto placed = tf.make_cache(p + mlen);
  place_chunk_kv(*kv, p, placed, m);
  const auto& c = m.config();
  double k_err = 0, v_err = 0, k_scale = 0;
  for (int l = 0; l < c.n_layers; ++l)
    for (int h = 0; h < c.n_kv_heads; ++h)
      for (int64_t i = p; i < p + mlen; ++i)
        for (int d = 0; d < c.head_dim; ++d) {
          k_err = std::max(k_err, static_cast<double>(std::fabs(placed.k_at(l, h, i)[d] - in_place.k_at(l, h, i)[d])));
          v_err = std::max(v_err, static_cast<double>(std::fabs(placed.v_at(l, h, i)[d] - in_place.v_at(l, h, i)[d])));
          k_scale = std::max(k_scale, static_cast<double>(std::fabs(in_place.k_at(l, h, i)[d])));
        }
  std::printf("[prelude KV vs in place] K max err %.2e (scale %.1f), V max err %.2e\n", k_err, k_scale, v_err);
  // V is copied (bit for bit); K went through R(-p) then R(+p): fp32 rounding only.
  EXPECT_EQ(v_err, 0.0);
  EXPECT_LT(k_err, 1e-5 * k_scale);

  // And it differs from the chunk computed alone (the prelude changed the KV).
  BlendEngine alone(tf);
  const auto kv_alone = alone.compute_chunk_kv(chunk);
  double diff = 0;
  const auto v = kv->v_fp32(), v_alone = kv_alone->v_fp32();
  for (size_t i = 0; i < v.size(); ++i) diff = std::max(diff, static_cast<double>(std::fabs(v[i] - v_alone[i])));
  EXPECT_GT(diff, 1e-2);
}

TEST_F(BlendPrelude, ThePreludeIsPartOfTheChunkKeyAndPrefixesAreComputedAlone) {
  const LlamaModel& m = testing::shared_model(Precision::F32);
  Transformer tf(m);
  MemoryKvStore store(int64_t{1} << 30);
  const auto prelude = m.tokenizer().encode("<|im_start|>system\n", true);
  BlendEngine none(tf), with(tf, prelude), other(tf, m.tokenizer().encode("<|im_start|>user\n", true));
  const auto chunk = m.tokenizer().encode(kDocs[1], false);
  EXPECT_NE(none.chunk_key(chunk), with.chunk_key(chunk));
  EXPECT_NE(with.chunk_key(chunk), other.chunk_key(chunk));
  EXPECT_EQ(none.prefix_key(chunk), with.prefix_key(chunk));
  // Prelude tokens moved into the chunk are another key (the length is hashed).
  std::vector<int32_t> longer(prelude.end() - 1, prelude.end());
  longer.insert(longer.end(), chunk.begin(), chunk.end());
  BlendEngine shorter(tf, std::vector<int32_t>(prelude.begin(), prelude.end() - 1));
  EXPECT_NE(shorter.chunk_key(longer), with.chunk_key(chunk));

  // An engine without a prelude stored every chunk: the engine with one misses them
  // all (computes in place), never using KV computed another way.
  const auto prompt = make_prompt(m, kDocs, kQuestion);
  StoreBackedBlend(none, store).warm(prompt);
  BlendOptions o;
  o.ratio = 0.15f;
  const auto r = StoreBackedBlend(with, store).prefill(prompt, o);
  EXPECT_EQ(r.stats.chunks_hit, 0);
  EXPECT_TRUE(r.stats.prefix_hit);  // the prefix is keyed and computed alike
  // The prefix it would store is the prefix computed alone.
  const auto pk = with.compute_prefix_kv(prompt.prefix);
  const auto stored = store.get(with.prefix_key(prompt.prefix));
  ASSERT_TRUE(stored);
  EXPECT_EQ(pk->k, stored->k);
  EXPECT_EQ(pk->v, stored->v);
}

// The KV dtype is part of every chunk and prefix key: chunks stored from an f32
// cache are never served to an f16 one, nor the other way; each dtype finds its own
// entries, stored in its own dtype at half the bytes, and the half-precision blend
// answers as the f32 one does (logits within the rounding of K/V).
TEST_F(BlendPrelude, TheKvDtypeIsPartOfTheKeyAndEntriesKeepTheirDtype) {
  const LlamaModel& m32 = testing::shared_model(Precision::F32);
  const LlamaModel& m16 = testing::shared_model(Precision::F32, kernels::TensorType::F16);
  EXPECT_NE(m32.fingerprint(), m16.fingerprint());
  Transformer tf32(m32), tf16(m16);
  BlendEngine e32(tf32), e16(tf16);
  MemoryKvStore store(int64_t{1} << 30);
  const auto prompt = make_prompt(m32, kDocs, kQuestion);
  for (const auto& chunk : prompt.chunks) EXPECT_NE(e32.chunk_key(chunk), e16.chunk_key(chunk));
  EXPECT_NE(e32.prefix_key(prompt.prefix), e16.prefix_key(prompt.prefix));

  BlendOptions o;
  o.ratio = 0.15f;
  StoreBackedBlend(e32, store).warm(prompt);
  const auto r16_cold = StoreBackedBlend(e16, store).prefill(prompt, o, 8);
  EXPECT_EQ(r16_cold.stats.chunks_hit, 0) << "f32 chunks served to an f16 cache";
  EXPECT_FALSE(r16_cold.stats.prefix_hit);
  StoreBackedBlend(e16, store).warm(prompt);
  for (const auto& chunk : prompt.chunks) {
    const auto a = store.get(e32.chunk_key(chunk)), b = store.get(e16.chunk_key(chunk));
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->dtype, kernels::TensorType::F32);
    EXPECT_EQ(b->dtype, kernels::TensorType::F16);
    EXPECT_EQ(b->k.size() * 2, a->k.size()) << "a 16-bit entry holds half the bytes";
    // Its values are the f32 entry's rounded (the chunk computed in an f16 cache
    // differs a little more: every layer read rounded K/V), within f16 resolution.
    const auto ka = a->k_fp32(), kb = b->k_fp32();
    double err = 0, mag = 0;
    for (size_t i = 0; i < ka.size(); ++i) {
      err = std::max(err, static_cast<double>(std::fabs(ka[i] - kb[i])));
      mag = std::max(mag, static_cast<double>(std::fabs(ka[i])));
    }
    EXPECT_LT(err, 0.02 * mag);
  }
  const auto r32 = StoreBackedBlend(e32, store).prefill(prompt, o, 8);
  const auto r16 = StoreBackedBlend(e16, store).prefill(prompt, o, 8);
  EXPECT_EQ(r32.stats.chunks_hit, static_cast<int>(prompt.chunks.size()));
  EXPECT_EQ(r16.stats.chunks_hit, static_cast<int>(prompt.chunks.size()));
  EXPECT_TRUE(r32.stats.prefix_hit && r16.stats.prefix_hit);
  EXPECT_EQ(r16.cache.dtype(), kernels::TensorType::F16);
  const int64_t V = m32.config().vocab;
  ASSERT_EQ(r32.logits.size(), static_cast<size_t>(V));
  double max_d = 0;
  for (int64_t i = 0; i < V; ++i) max_d = std::max(max_d, static_cast<double>(std::fabs(r32.logits[i] - r16.logits[i])));
  std::printf("[blend, f16 KV vs f32 KV] first-token max |dlogit| %.4f\n", max_d);
  EXPECT_LT(max_d, 0.5);
  const auto top = [&](const std::vector<float>& l) { return std::max_element(l.begin(), l.begin() + V) - l.begin(); };
  EXPECT_EQ(top(r32.logits), top(r16.logits));
}

TEST_F(BlendPrelude, BlendOverPreludeChunksAnswers) {
  const LlamaModel& m = testing::shared_model(Precision::F32);
  Transformer tf(m);
  MemoryKvStore store(int64_t{1} << 30);
  BlendEngine engine(tf, m.tokenizer().encode("<|im_start|>system\n", true));
  StoreBackedBlend from_store(engine, store);
  const auto prompt = make_prompt(m, kDocs, kQuestion);
  from_store.warm(prompt);
  BlendOptions o;
  o.mode = BlendMode::Full;
  auto full = from_store.prefill(prompt, o, 16);
  o.mode = BlendMode::Blend;
  o.ratio = 0.15f;
  auto blend = from_store.prefill(prompt, o, 16);
  EXPECT_EQ(blend.stats.chunks_hit, static_cast<int>(kDocs.size()));
  SamplingParams sp;
  sp.max_tokens = 16;
  const auto text = decode_from(tf, blend.cache, blend.logits, sp).text;
  std::printf("[blend over prelude chunks] %s\n", text.c_str());
  EXPECT_NE(text.find("1873"), std::string::npos) << text;
}

}  // namespace
}  // namespace bs
