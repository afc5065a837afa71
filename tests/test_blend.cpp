// CacheBlend on the real model: position repair, the mode invariants (ratio 1 =
// full, ratio 0 = reuse), cache hits across reorderings and repeats, misses.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <numeric>

#include "blend/blend_engine.h"
#include "blend/store_backed_blend.h"
#include "storage/memory_store.h"
#include "blend/rag_prompt.h"
#include "model/generate.h"
#include "tests/blend_fixture.h"
#include "tests/model_fixture.h"

namespace bs {
namespace {

using kernels::Precision;

using testing::kDocs;
using testing::kQuestion;
using testing::make_prompt;

std::vector<int32_t> greedy_after(const Transformer& tf, BlendPrefill& pre, int steps) {
  SamplingParams p;
  p.max_tokens = steps;
  // decode_from stops at end-of-turn; collect ids.
  return decode_from(tf, pre.cache, pre.logits, p).tokens;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

// The real model on a backend precision, a RAM store and the engine over them.
struct BlendSetup {
  explicit BlendSetup(Precision precision) : m(testing::shared_model(precision)), tf(m), engine(tf), from_store(engine, store) {}
  const LlamaModel& m;
  Transformer tf;
  MemoryKvStore store{int64_t{1} << 30};
  BlendEngine engine;
  StoreBackedBlend from_store;
};

// KL(P || Q) of the softmaxes, in nats.
double kl_divergence(const std::vector<float>& p, const std::vector<float>& q) {
  auto log_sum_exp = [](const std::vector<float>& x) {
    const double mx = *std::max_element(x.begin(), x.end());
    double s = 0;
    for (float v : x) s += std::exp(v - mx);
    return mx + std::log(s);
  };
  const double lp = log_sum_exp(p), lq = log_sum_exp(q);
  double kl = 0;
  for (size_t i = 0; i < p.size(); ++i) kl += std::exp(p[i] - lp) * ((p[i] - lp) - (q[i] - lq));
  return kl;
}

TEST(DeltaRope, RotatingStoredKeysEqualsRopeAtTheNewPosition) {
  auto cpu = kernels::make_cpu_backend();
  LlamaConfig cfg;
  cfg.head_dim = 64;
  cfg.rope_theta = 100000.0f;
  for (const char* scaling : {"none", "llama3"}) {
    cfg.rope_scaling.type = scaling;
    cfg.rope_scaling.factor = 8.0f;
    cfg.rope_scaling.original_context = 2048;
    const auto table = cpu->prepare_rope(make_rope_table(cfg));
    const int64_t m = 40;
    std::vector<float> x(m * 64);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37 * static_cast<double>(i)) * 2.0f;
    for (int32_t p : {1, 57, 1000, 7000}) {
      std::vector<int32_t> base(m), at_p(m), delta(m, p);
      std::iota(base.begin(), base.end(), 0);
      std::iota(at_p.begin(), at_p.end(), p);
      auto stored = x, direct = x;
      cpu->rope(stored.data(), base.data(), m, 1, *table);  // K as stored: positions 0..m-1
      cpu->rope(stored.data(), delta.data(), m, 1, *table);  // repaired to p..p+m-1
      cpu->rope(direct.data(), at_p.data(), m, 1, *table);   // computed at p..p+m-1
      // fp32 cos/sin: the error grows with the angle, ~1e-6 relative per radian step
      EXPECT_LT(max_abs_diff(stored, direct), 2e-4) << scaling << " p=" << p;
    }
  }
}

TEST(DeltaRope, Llama3ScalingSlowsOnlyLongWavelengths) {
  LlamaConfig cfg;
  cfg.head_dim = 128;
  cfg.rope_theta = 500000.0f;
  const auto plain = make_rope_table(cfg);
  cfg.rope_scaling = RopeScaling{"llama3", 8.0f, 1.0f, 4.0f, 8192};
  const auto scaled = make_rope_table(cfg);
  // Highest frequency (wavelength 2π < 8192/4): unchanged. Lowest: divided by 8.
  EXPECT_FLOAT_EQ(scaled.inv_freq.front(), plain.inv_freq.front());
  EXPECT_NEAR(scaled.inv_freq.back(), plain.inv_freq.back() / 8.0f, 1e-12);
  for (size_t i = 0; i < plain.inv_freq.size(); ++i) {
    EXPECT_LE(scaled.inv_freq[i], plain.inv_freq[i] * (1 + 1e-6));
    EXPECT_GE(scaled.inv_freq[i], plain.inv_freq[i] / 8.0f * (1 - 1e-6));
  }
}

TEST(DeltaRope, StoredChunkPlacedAnywhereMatchesLayerZeroKeysInPlace) {
  REQUIRE_MODEL();
  BlendSetup setup(Precision::F32);
  const auto& m = setup.m;
  const Transformer& tf = setup.tf;
  const BlendEngine& engine = setup.engine;
  const auto& c = m.config();
  const auto chunk = m.tokenizer().encode(kDocs[0], false);
  const int64_t len = static_cast<int64_t>(chunk.size());
  auto kv = engine.compute_chunk_kv(chunk);
  for (int64_t p : {0, 5, 300, 2000}) {
    auto cache = tf.make_cache(p + len);
    place_chunk_kv(*kv, p, cache, m);
    // Layer 0 K depends on the token and its position only: compute it in place.
    std::vector<float> hidden(len * c.dim), q(len * c.q_dim()), k(len * c.kv_dim()), v(len * c.kv_dim());
    std::vector<int32_t> pos(len);
    std::iota(pos.begin(), pos.end(), static_cast<int32_t>(p));
    tf.embed(chunk, hidden.data());
    tf.project_qkv(0, hidden.data(), pos.data(), len, q.data(), k.data(), v.data());
    double err = 0;
    for (int64_t t = 0; t < len; ++t)
      for (int h = 0; h < c.n_kv_heads; ++h)
        for (int d = 0; d < c.head_dim; ++d)
          err = std::max(err, static_cast<double>(std::fabs(cache.k_at(0, h, p + t)[d] -
                                                            k[t * c.kv_dim() + h * c.head_dim + d])));
    EXPECT_LT(err, 1e-3) << "offset " << p;  // |K| is O(10); fp32 rotation error
  }
}

class BlendModes : public ::testing::Test {
 protected:
  void SetUp() override { REQUIRE_MODEL(); }
};

TEST_F(BlendModes, RatioOneEqualsFullAndRatioZeroEqualsReuse) {
  BlendSetup setup(Precision::F32);
  const auto& m = setup.m;
  const Transformer& tf = setup.tf;
  const StoreBackedBlend& from_store = setup.from_store;
  const auto prompt = make_prompt(m, kDocs);
  from_store.warm(prompt);
  auto run = [&](BlendMode mode, float ratio) {
    BlendOptions o;
    o.mode = mode;
    o.ratio = ratio;
    return from_store.prefill(prompt, o, 24);
  };
  auto full = run(BlendMode::Full, 0), blend1 = run(BlendMode::Blend, 1.0f);
  auto reuse = run(BlendMode::Reuse, 0), blend0 = run(BlendMode::Blend, 0.0f);
  EXPECT_EQ(blend1.stats.recomputed_tokens, blend1.stats.cached_tokens);
  EXPECT_EQ(blend0.stats.recomputed_tokens, 0);
  EXPECT_LT(max_abs_diff(full.logits, blend1.logits), 1e-3);
  EXPECT_LT(max_abs_diff(reuse.logits, blend0.logits), 1e-5);
  EXPECT_EQ(greedy_after(tf, full, 24), greedy_after(tf, blend1, 24));
  EXPECT_EQ(greedy_after(tf, reuse, 24), greedy_after(tf, blend0, 24));
  // reuse ignores cross-chunk attention; it must actually differ from full here
  EXPECT_GT(max_abs_diff(full.logits, reuse.logits), 0.05);
}

TEST_F(BlendModes, BlendAnswersAndIsCloserToFullThanReuse) {
  BlendSetup setup(testing::fast_precision());
  const auto& m = setup.m;
  const Transformer& tf = setup.tf;
  const StoreBackedBlend& from_store = setup.from_store;
  const auto prompt = make_prompt(m, kDocs);
  from_store.warm(prompt);
  BlendOptions o;
  o.mode = BlendMode::Full;
  auto full = from_store.prefill(prompt, o, 16);
  o.mode = BlendMode::Reuse;
  auto reuse = from_store.prefill(prompt, o, 16);
  o.mode = BlendMode::Blend;
  o.ratio = 0.15f;
  auto blend = from_store.prefill(prompt, o, 16);
  const int64_t cached = blend.stats.cached_tokens;
  EXPECT_EQ(blend.stats.recomputed_tokens, std::llround(0.15 * cached));
  EXPECT_EQ(blend.stats.chunks_hit, static_cast<int>(kDocs.size()));
  EXPECT_TRUE(blend.stats.prefix_hit);
  // KL from full's first-token distribution: blend must beat reuse clearly
  // (measured on this prompt: reuse 0.142, blend 0.069 single-pass, f32 path).
  const double kl_blend = kl_divergence(full.logits, blend.logits), kl_reuse = kl_divergence(full.logits, reuse.logits);
  std::printf("[first-token KL from full] reuse %.4f, blend %.4f\n", kl_reuse, kl_blend);
  EXPECT_LT(kl_blend, 0.75 * kl_reuse);
  SamplingParams p;
  p.max_tokens = 16;
  const auto full_text = decode_from(tf, full.cache, full.logits, p).text;
  EXPECT_NE(full_text.find("1873"), std::string::npos) << full_text;
  // The answer reads the right passage (a year of the Velmor document, not 1902 or
  // 1898 from the others). Which of its two years it names is a coin toss near the
  // full answer: measured (AVX2, fp32) 1873 at r = 0.10 in both filterings and at
  // 0.15 two-pass, 1861 at 0.15 single-pass and at 0.20-0.25 in both, while the KL
  // keeps falling (0.066 -> 0.057) — so the year itself is not asserted.
  auto text = decode_from(tf, blend.cache, blend.logits, p).text;
  EXPECT_NE(text.find("Velmor"), std::string::npos) << text;
  EXPECT_TRUE(text.find("1873") != std::string::npos || text.find("1861") != std::string::npos) << text;
}

TEST_F(BlendModes, ReorderedDocumentsAndRepeatedRequestsHitEveryChunk) {
  BlendSetup setup(testing::fast_precision());
  const auto& m = setup.m;
  const StoreBackedBlend& from_store = setup.from_store;
  const auto first = make_prompt(m, kDocs);
  from_store.warm(first);
  std::vector<std::string> reordered = {kDocs[3], kDocs[1], kDocs[0], kDocs[2]};
  const auto second = make_prompt(m, reordered);
  // the same document is the same chunk wherever it lands
  EXPECT_EQ(first.chunks[0], second.chunks[2]);
  BlendOptions o;
  for (int rep = 0; rep < 2; ++rep) {  // the same request twice
    auto r = from_store.prefill(second, o, 8);
    EXPECT_EQ(r.stats.chunks_hit, 4);
    EXPECT_TRUE(r.stats.prefix_hit);
    EXPECT_EQ(r.stats.cached_tokens, r.stats.chunk_tokens);
  }
}

TEST_F(BlendModes, AllChunksMissingComputesLikeFull) {
  BlendSetup setup(Precision::F32);
  const auto& m = setup.m;
  const Transformer& tf = setup.tf;
  const StoreBackedBlend& from_store = setup.from_store;
  const auto prompt = make_prompt(m, kDocs);
  BlendOptions o;
  auto r = from_store.prefill(prompt, o, 16);  // empty store
  EXPECT_EQ(r.stats.chunks_hit, 0);
  EXPECT_FALSE(r.stats.prefix_hit);
  EXPECT_EQ(r.stats.computed_tokens, prompt.size() - static_cast<int64_t>(prompt.prefix.size()));
  o.mode = BlendMode::Full;
  auto full = from_store.prefill(prompt, o, 16);
  EXPECT_LT(max_abs_diff(full.logits, r.logits), 1e-3);
  EXPECT_EQ(greedy_after(tf, full, 16), greedy_after(tf, r, 16));
}

TEST_F(BlendModes, GradualFilteringNarrowsToTheRatio) {
  BlendSetup setup(testing::fast_precision());
  const auto& m = setup.m;
  const StoreBackedBlend& from_store = setup.from_store;
  const auto prompt = make_prompt(m, kDocs);
  from_store.warm(prompt);
  BlendOptions o;
  o.selection = Selection::Deviation;  // gradual filtering is the deviation rule's
  o.check_layers = {1, 2, 3};
  o.ratio = 0.2f;
  auto r = from_store.prefill(prompt, o, 8);
  const int64_t H = r.stats.cached_tokens;
  ASSERT_EQ(r.stats.candidates_per_check.size(), 3u);
  EXPECT_EQ(r.stats.candidates_per_check[0], std::llround((0.2 + 0.8 * 2 / 3.0) * H));
  EXPECT_EQ(r.stats.candidates_per_check[1], std::llround((0.2 + 0.8 / 3.0) * H));
  EXPECT_EQ(r.stats.candidates_per_check[2], std::llround(0.2 * H));
  EXPECT_EQ(r.stats.recomputed_tokens, std::llround(0.2 * H));
  // selected positions are inside the chunks
  for (int32_t p : r.recomputed_positions) {
    EXPECT_GE(p, static_cast<int32_t>(prompt.prefix.size()));
    EXPECT_LT(p, prompt.suffix_offset());
  }
  o.schedule = {0.9f, 0.5f};
  auto s = from_store.prefill(prompt, o, 8);
  EXPECT_EQ(s.stats.candidates_per_check[0], std::llround(0.9 * H));
}

TEST_F(BlendModes, RejectsBadOptionsAndOversizedPrompts) {
  BlendSetup setup(testing::fast_precision());
  const auto& m = setup.m;
  const StoreBackedBlend& from_store = setup.from_store;
  const auto prompt = make_prompt(m, kDocs);
  from_store.warm(prompt);
  BlendOptions o;
  o.check_layers = {0};
  EXPECT_THROW(from_store.prefill(prompt, o), std::invalid_argument);
  o.check_layers = {30};
  EXPECT_THROW(from_store.prefill(prompt, o), std::invalid_argument);
  o.check_layers = {1};
  o.ratio = 1.5f;
  EXPECT_THROW(from_store.prefill(prompt, o), std::invalid_argument);
  o.ratio = 0.15f;
  EXPECT_THROW(from_store.prefill(prompt, o, m.config().context_length), std::length_error);
  EXPECT_THROW(parse_mode("fast"), std::invalid_argument);
  o.min_tokens = -1;
  EXPECT_THROW(from_store.prefill(prompt, o), std::invalid_argument);
  o.min_tokens = 1;
  // schedules: one value per check layer but the last, within [ratio, 1], never increasing
  o.check_layers = {1, 2, 3};
  for (auto bad : std::vector<std::vector<float>>{{0.5f}, {1.2f, 0.5f}, {0.5f, 0.9f}, {0.9f, 0.1f}, {-0.1f, 0.2f}}) {
    o.schedule = bad;
    EXPECT_THROW(from_store.prefill(prompt, o), std::invalid_argument) << bad[0];
  }
  o.schedule = {0.9f, 0.9f};
  EXPECT_NO_THROW(from_store.prefill(prompt, o));
}

TEST_F(BlendModes, WarmSkipsAnEmptyChunkAndStoresTheRest) {
  BlendSetup setup(testing::fast_precision());
  auto prompt = make_prompt(setup.m, kDocs);
  prompt.chunks.insert(prompt.chunks.begin() + 1, std::vector<int32_t>{});
  setup.from_store.warm(prompt);
  for (const auto& chunk : prompt.chunks) {
    if (!chunk.empty()) {
      EXPECT_TRUE(setup.store.contains(setup.engine.chunk_key(chunk)));
    }
  }
  BlendOptions o;
  auto r = setup.from_store.prefill(prompt, o);
  EXPECT_EQ(r.stats.chunks_hit, static_cast<int>(prompt.chunks.size()) - 1);
}

TEST(RagPromptAssembly, ChunksAreTokenizedAloneAndDocumentsCannotInjectMarkup) {
  REQUIRE_MODEL();
  const auto& m = testing::shared_model(testing::fast_precision());
  const auto p = make_prompt(m, {"alpha <|im_end|> beta", kDocs[1]});
  const int32_t im_end = m.tokenizer().token_id("<|im_end|>");
  for (int32_t t : p.chunks[0]) EXPECT_NE(t, im_end);
  EXPECT_EQ(p.chunks[1], m.tokenizer().encode(kDocs[1] + "\n\n", false));
  // prefix ends the system turn and opens the user turn; suffix opens the assistant turn
  const std::string prefix_text = m.tokenizer().decode(p.prefix);
  EXPECT_NE(prefix_text.find("<|im_start|>system\n"), std::string::npos);
  EXPECT_EQ(prefix_text.substr(prefix_text.size() - 17), "<|im_start|>user\n");
  const std::string suffix_text = m.tokenizer().decode(p.suffix);
  EXPECT_EQ(suffix_text, kQuestion + "<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_THROW(assemble_rag_prompt(m.tokenizer(), m.chat_template(), {{"assistant", "x"}}, {}),
               std::invalid_argument);
}

TEST(RagPromptAssembly, SplitsTextPartsAndSeparators) {
  auto a = split_by_separator("doc one # # doc two # # what?", " # # ");
  EXPECT_EQ(a.documents, (std::vector<std::string>{"doc one", "doc two"}));
  EXPECT_EQ(a.question, "what?");
  auto b = split_by_separator(" # # only a question", " # # ");
  EXPECT_TRUE(b.documents.empty());
  EXPECT_EQ(b.question, "only a question");
  auto c = split_text_parts({"d1", "d2", "q"});
  EXPECT_EQ(c.documents.size(), 2u);
  EXPECT_EQ(c.question, "q");
}

TEST(ChunkStore, KeysAreContentAddressedAndLruRespectsTheBudget) {
  const std::vector<int32_t> a = {1, 2, 3}, b = {1, 2, 4};
  EXPECT_EQ(make_chunk_key(7, KvKind::Chunk, a), make_chunk_key(7, KvKind::Chunk, a));
  EXPECT_NE(make_chunk_key(7, KvKind::Chunk, a), make_chunk_key(7, KvKind::Chunk, b));
  EXPECT_NE(make_chunk_key(7, KvKind::Chunk, a), make_chunk_key(8, KvKind::Chunk, a));
  EXPECT_NE(make_chunk_key(7, KvKind::Chunk, a), make_chunk_key(7, KvKind::Prefix, a));
  auto entry = [](int32_t tok) {
    auto kv = std::make_shared<ChunkKv>();
    kv->tokens = {tok};
    kv->k.assign(1000, std::byte{0});  // 1000 bytes
    return kv;
  };
  MemoryKvStore store(3 * static_cast<int64_t>(entry(0)->bytes()));
  for (int32_t t = 0; t < 3; ++t) EXPECT_TRUE(store.put(make_chunk_key(0, KvKind::Chunk, std::vector{t}), entry(t)));
  ASSERT_NE(store.get(make_chunk_key(0, KvKind::Chunk, std::vector{0})), nullptr);  // 0 becomes most recent
  store.put(make_chunk_key(0, KvKind::Chunk, std::vector{3}), entry(3));           // evicts 1
  EXPECT_EQ(store.get(make_chunk_key(0, KvKind::Chunk, std::vector{1})), nullptr);
  EXPECT_NE(store.get(make_chunk_key(0, KvKind::Chunk, std::vector{0})), nullptr);
  EXPECT_EQ(store.stats().entries, 3);
  EXPECT_LE(store.stats().bytes, store.budget());
  auto huge = std::make_shared<ChunkKv>();
  huge->k.assign(40000, std::byte{0});
  EXPECT_FALSE(store.put(make_chunk_key(0, KvKind::Chunk, std::vector{9}), huge));
}

}  // namespace
}  // namespace bs
