// The blend's selection path on the real model. ratio 0 and ratio >= 1 are
// shortcuts in BlendEngine::begin (no token scored), so the mode-invariant tests in
// test_blend.cpp never reach the scoring; these do:
//  - ratios just below 1 and just above 0 through the scoring, against full/reuse;
//  - an oracle that recomputes the layer-1 deviation of every cached token the way
//    the engine's check layer defines it and must pick exactly the engine's tokens;
//  - place_chunk_kv in every layer (K rotated by exactly the offset, V untouched);
//  - a prompt where some chunks hit the cache and some miss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <set>

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

// A second, unrelated prompt (different documents and question).
const std::vector<std::string> kDocs2 = {
    "Marta Quell keeps bees on the island of Sorn. Her hives stand on the southern slope, and each summer she "
    "sells about forty jars of heather honey at the harbour market.",
    "The Sorn ferry leaves the mainland port of Edda twice a day, at seven in the morning and at four in the "
    "afternoon. The crossing takes ninety minutes in calm weather.",
    "In 1954 a storm destroyed the old lighthouse of Sorn. The new lighthouse, built of white concrete, was lit "
    "for the first time on the first of May 1957.",
    "The island school of Sorn has eleven pupils and one teacher, Mr. Oskar Lind, who also plays the organ in "
    "the chapel on Sundays.",
};
const std::string kQuestion2 = "When was the new lighthouse of Sorn lit for the first time?";


double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

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

// These tests pin the selection they reason about: one check at layer 1 (the
// engine's default is gradual filtering over layers 1..6; the tests that check
// several layers say so).
// The deviation rule with one check at layer 1 (the oracles below compute that layer).
BlendOptions one_check_options() {
  BlendOptions o;
  o.selection = Selection::Deviation;
  o.check_layers = {1};
  o.ratio = 0.15f;
  return o;
}

// The real model (fp32 GEMMs: the bounds below are fp32 numerics), a RAM store and
// the engine over them.
struct BlendSetup {
  BlendSetup() : m(testing::shared_model(Precision::F32)), tf(m), engine(tf), from_store(engine, store) {}
  const LlamaModel& m;
  Transformer tf;
  MemoryKvStore store{int64_t{1} << 30};
  BlendEngine engine;
  StoreBackedBlend from_store;

  BlendPrefill run(const RagPrompt& prompt, const BlendOptions& o) { return from_store.prefill(prompt, o); }
  BlendPrefill run(const RagPrompt& prompt, BlendMode mode, float ratio = 0.15f, int min_tokens = 1,
                   Deviation deviation = Deviation::KV) {
    BlendOptions o = one_check_options();
    o.mode = mode;
    o.ratio = ratio;
    o.min_tokens = min_tokens;
    o.deviation = deviation;
    return from_store.prefill(prompt, o);
  }
};

int64_t chunk_tokens(const RagPrompt& p) {
  int64_t n = 0;
  for (const auto& c : p.chunks) n += static_cast<int64_t>(c.size());
  return n;
}

std::vector<int32_t> iota_positions(int64_t begin, int64_t end) {
  std::vector<int32_t> v(static_cast<size_t>(end - begin));
  std::iota(v.begin(), v.end(), static_cast<int32_t>(begin));
  return v;
}

class BlendSelection : public ::testing::Test {
 protected:
  void SetUp() override { REQUIRE_MODEL(); }
};

// Ratios just below 1 go through the scoring (ratio >= 1 would not): with
// H cached tokens, ratio (H - 0.25) / H keeps llround(H - 0.25) = H tokens (all of
// them) and ratio (H - 0.75) / H keeps llround(H - 0.75) = H - 1 tokens (all but
// the one with the smallest deviation). Both must be close to full.
TEST_F(BlendSelection, RatioJustBelowOneThroughTheScoringIsFull) {
  BlendSetup s;
  const auto prompt = make_prompt(s.m, kDocs, kQuestion);
  s.from_store.warm(prompt);
  const int64_t H = chunk_tokens(prompt);
  const auto full = s.run(prompt, BlendMode::Full);
  const auto reuse = s.run(prompt, BlendMode::Reuse);
  const double full_vs_reuse = max_abs_diff(full.logits, reuse.logits);

  // All H kept: the final pass computes every token of the prompt but the (exact,
  // position-0) prefix, i.e. what full computes, up to fp32 summation order.
  const float all_ratio = static_cast<float>((static_cast<double>(H) - 0.25) / static_cast<double>(H));
  ASSERT_LT(all_ratio, 1.0f);
  ASSERT_EQ(std::llround(static_cast<double>(all_ratio) * H), H);
  const auto all = s.run(prompt, BlendMode::Blend, all_ratio);
  EXPECT_EQ(all.stats.candidates_per_check, std::vector<int64_t>{H});  // the scoring ran
  EXPECT_EQ(all.stats.cached_tokens, H);
  EXPECT_EQ(all.stats.recomputed_tokens, H);
  EXPECT_EQ(all.recomputed_positions, iota_positions(prompt.chunk_offset(0), prompt.suffix_offset()));
  const double d_all = max_abs_diff(full.logits, all.logits);
  BlendOptions two_pass = one_check_options();
  two_pass.ratio = all_ratio;
  two_pass.filtering = Filtering::TwoPass;
  two_pass.selection = Selection::Deviation;
  const auto all2 = s.run(prompt, two_pass);
  two_pass.ratio = 1.0f;
  const auto ratio1 = s.run(prompt, two_pass);
  std::printf("[all kept] two-pass vs full %.2e, single vs two-pass %.2e, ratio-1 shortcut vs full %.2e\n",
              max_abs_diff(full.logits, all2.logits), max_abs_diff(all.logits, all2.logits),
              max_abs_diff(full.logits, ratio1.logits));

  // H - 1 kept: one cached token keeps its reused KV.
  const float but_one_ratio = static_cast<float>((static_cast<double>(H) - 0.75) / static_cast<double>(H));
  ASSERT_EQ(std::llround(static_cast<double>(but_one_ratio) * H), H - 1);
  const auto but_one = s.run(prompt, BlendMode::Blend, but_one_ratio);
  EXPECT_EQ(but_one.stats.candidates_per_check, std::vector<int64_t>{H - 1});
  EXPECT_EQ(but_one.stats.recomputed_tokens, H - 1);
  EXPECT_EQ(static_cast<int64_t>(but_one.recomputed_positions.size()), H - 1);
  EXPECT_EQ(but_one.stats.computed_tokens, H - 1 + static_cast<int64_t>(prompt.suffix.size()));
  const double d_but_one = max_abs_diff(full.logits, but_one.logits);

  std::printf("[max |dlogit| vs full] H=%lld: all kept %.2e, all but one %.2e; reuse %.3f\n",
              static_cast<long long>(H), d_all, d_but_one, full_vs_reuse);
  // Measured (AVX2, fp32): all kept 3.2e-5 (asserted < 1e-4), all but one 4.3e-3
  // (asserted < 1e-2), while reuse is 6.76 away from full.
  EXPECT_LT(d_all, 1e-4);
  EXPECT_LT(d_but_one, 1e-2);
}

// A tiny ratio with min_tokens = 1: llround(0.25) = 0, raised to 1, so exactly one
// cached token (the most deviating) is recomputed; the rest is reuse.
TEST_F(BlendSelection, TinyRatioWithMinTokensRecomputesOneTokenAndIsNearReuse) {
  BlendSetup s;
  const auto prompt = make_prompt(s.m, kDocs, kQuestion);
  s.from_store.warm(prompt);
  const int64_t H = chunk_tokens(prompt);
  const auto reuse = s.run(prompt, BlendMode::Reuse);
  const auto full = s.run(prompt, BlendMode::Full);
  const float tiny = static_cast<float>(0.25 / static_cast<double>(H));
  ASSERT_GT(tiny, 0.0f);
  ASSERT_EQ(std::llround(static_cast<double>(tiny) * H), 0);
  const auto one = s.run(prompt, BlendMode::Blend, tiny, /*min_tokens=*/1);
  EXPECT_EQ(one.stats.candidates_per_check, std::vector<int64_t>{1});  // the scoring ran
  EXPECT_EQ(one.stats.recomputed_tokens, 1);
  ASSERT_EQ(one.recomputed_positions.size(), 1u);
  EXPECT_GE(one.recomputed_positions[0], prompt.chunk_offset(0));
  EXPECT_LT(one.recomputed_positions[0], prompt.suffix_offset());
  EXPECT_EQ(one.stats.computed_tokens, 1 + static_cast<int64_t>(prompt.suffix.size()));
  const double d_reuse = max_abs_diff(reuse.logits, one.logits);
  const double d_full = max_abs_diff(full.logits, reuse.logits);
  std::printf("[max |dlogit|] one recomputed vs reuse %.4f (reuse vs full %.3f); KL from reuse %.4f\n", d_reuse,
              d_full, kl_divergence(reuse.logits, one.logits));
  // Measured 0.729 (AVX2, fp32), while reuse is 6.757 from full: the one most
  // deviating token of 209 moves the answer's logits by about a tenth of what
  // separates reuse from full. Asserted: under 2.0 and under 0.3 of that distance
  // (~2.7x margin), and above 1e-2 (its fresh KV did reach the final pass).
  EXPECT_LT(d_reuse, 2.0);
  EXPECT_LT(d_reuse, 0.3 * d_full);
  EXPECT_GT(d_reuse, 1e-2);

  // min_tokens = 0: the same ratio scores and keeps nothing. Two-pass scoring
  // restores the loaded KV: exactly reuse. The single pass keeps the fresh KV of
  // layers 0..1 it computed while scoring: not reuse, but nothing goes beyond.
  BlendOptions o = one_check_options();
  o.mode = BlendMode::Blend;
  o.ratio = tiny;
  o.min_tokens = 0;
  o.filtering = Filtering::TwoPass;
  o.selection = Selection::Deviation;
  const auto none = s.from_store.prefill(prompt, o);
  EXPECT_EQ(none.stats.candidates_per_check, std::vector<int64_t>{0});
  EXPECT_EQ(none.stats.recomputed_tokens, 0);
  EXPECT_LT(max_abs_diff(reuse.logits, none.logits), 1e-5);
  o.filtering = Filtering::SinglePass;
  const auto none1 = s.from_store.prefill(prompt, o);
  EXPECT_EQ(none1.stats.candidates_per_check, std::vector<int64_t>{0});
  EXPECT_EQ(none1.stats.recomputed_tokens, 0);
  EXPECT_EQ(none1.stats.computed_tokens, static_cast<int64_t>(prompt.suffix.size()));
  EXPECT_GT(max_abs_diff(reuse.logits, none1.logits), 1e-3);
}

// The deviation the check layer defines, recomputed here from the public pieces:
// the cache as the loaders leave it (prefix KV at 0, every cached chunk placed with
// place_chunk_kv), layer 0 over every chunk token (cached and missed) with
// run_layer, Q/K/V of layer 1 with project_qkv, and per cached token the squared
// distance of fresh vs placed K and/or V at layer 1, summed over the KV heads.
struct OracleScores {
  std::vector<int32_t> positions;  // cached chunk positions
  std::vector<double> deviation;   // one per position
};

// The cache as the loaders leave it: the stored prefix at 0 and every chunk with
// hit[i] placed at its offset (K rotated there).
KvCache loaded_cache(BlendSetup& s, const RagPrompt& prompt, const std::vector<char>& hit) {
  const auto& c = s.m.config();
  auto cache = s.tf.make_cache(prompt.size());
  auto prefix = s.store.get(s.engine.prefix_key(prompt.prefix));
  EXPECT_TRUE(prefix);
  const int64_t P = static_cast<int64_t>(prompt.prefix.size());
  for (int l = 0; l < c.n_layers; ++l) copy_chunk_layer(prefix->k_layer(l), prefix->v_layer(l), prefix->dtype, P, l, 0, cache);
  for (size_t i = 0; i < prompt.chunks.size(); ++i) {
    if (!hit[i]) continue;
    auto kv = s.store.get(s.engine.chunk_key(prompt.chunks[i]));
    EXPECT_TRUE(kv);
    place_chunk_kv(*kv, prompt.chunk_offset(i), cache, s.m);
  }
  return cache;
}

// The hidden states [rows, dim] of the prompt's tokens at `rows` after layer 0, which
// wrote their K/V into the cache and attended over its keys [0, n_kv).
std::vector<float> after_layer0(BlendSetup& s, const RagPrompt& prompt, const std::vector<int32_t>& rows,
                                KvCache& cache, int64_t n_kv) {
  const auto all = prompt.concatenated();
  const int64_t n = static_cast<int64_t>(rows.size());
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[i] = all[rows[i]];
  std::vector<float> hidden(static_cast<size_t>(n * s.m.config().dim));
  s.tf.embed(ids, hidden.data());
  s.tf.run_layer(0, hidden.data(), rows.data(), n, cache, n_kv);
  return hidden;
}

OracleScores oracle_layer1_deviation(BlendSetup& s, const RagPrompt& prompt, const std::vector<char>& hit,
                                     Deviation which) {
  const auto& c = s.m.config();
  auto cache = loaded_cache(s, prompt, hit);
  std::vector<int32_t> rows;  // every chunk token, in position order
  std::vector<char> cached_row;
  for (size_t i = 0; i < prompt.chunks.size(); ++i) {
    const int64_t off = prompt.chunk_offset(i), m = static_cast<int64_t>(prompt.chunks[i].size());
    for (int64_t j = 0; j < m; ++j) {
      rows.push_back(static_cast<int32_t>(off + j));
      cached_row.push_back(hit[i]);
    }
  }
  const int64_t n = static_cast<int64_t>(rows.size());
  auto hidden = after_layer0(s, prompt, rows, cache, prompt.suffix_offset());
  const int64_t kvd = c.kv_dim(), hd = c.head_dim;
  std::vector<float> q(static_cast<size_t>(n * c.q_dim())), k(static_cast<size_t>(n * kvd)), v(k.size());
  s.tf.project_qkv(1, hidden.data(), rows.data(), n, q.data(), k.data(), v.data());
  OracleScores out;
  for (int64_t i = 0; i < n; ++i) {
    if (!cached_row[i]) continue;
    double dev = 0;
    for (int h = 0; h < c.n_kv_heads; ++h)
      for (int64_t d = 0; d < hd; ++d) {
        const float dk = k[i * kvd + h * hd + d] - cache.k_at(1, h, rows[i])[d];
        const float dv = v[i * kvd + h * hd + d] - cache.v_at(1, h, rows[i])[d];
        if (which != Deviation::V) dev += static_cast<double>(dk) * dk;
        if (which != Deviation::K) dev += static_cast<double>(dv) * dv;
      }
    out.positions.push_back(rows[i]);
    out.deviation.push_back(dev);
  }
  return out;
}

// The count positions with the largest (largest = true) or smallest deviation, ties
// by position, returned sorted by position.
std::vector<int32_t> extreme_k(const OracleScores& o, int64_t count, bool largest) {
  std::vector<size_t> idx(o.positions.size());
  std::iota(idx.begin(), idx.end(), size_t{0});
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    if (o.deviation[a] != o.deviation[b]) return largest ? o.deviation[a] > o.deviation[b] : o.deviation[a] < o.deviation[b];
    return o.positions[a] < o.positions[b];
  });
  std::vector<int32_t> out;
  for (int64_t i = 0; i < count; ++i) out.push_back(o.positions[idx[i]]);
  std::sort(out.begin(), out.end());
  return out;
}

// The engine's one-shot selection (check layer 1, ratio 0.15; single pass and two
// passes) picks exactly the top-k tokens of the oracle's deviation, for K+V, K and V deviations, with every chunk
// cached and with one chunk missed (its tokens run through layer 0 as context but
// are never candidates).
TEST_F(BlendSelection, SelectedTokensAreTheTopKOfTheLayerOneDeviation) {
  BlendSetup s;
  const auto prompt = make_prompt(s.m, kDocs, kQuestion);
  // Store the prefix and chunks 0, 1, 3; chunk 2 misses until the second half.
  s.from_store.warm(make_prompt(s.m, {kDocs[0], kDocs[1], kDocs[3]}, kQuestion));
  struct Case {
    std::vector<char> hit;
    Deviation deviation;
    const char* name;
  };
  const std::vector<Case> cases = {{{1, 1, 0, 1}, Deviation::KV, "chunk 2 missed, K+V"},
                                   {{1, 1, 1, 1}, Deviation::KV, "all cached, K+V"},
                                   {{1, 1, 1, 1}, Deviation::K, "all cached, K"},
                                   {{1, 1, 1, 1}, Deviation::V, "all cached, V"}};
  for (const auto& cs : cases) {
    SCOPED_TRACE(cs.name);
    if (cs.hit[2]) s.from_store.warm(prompt);
    BlendOptions o = one_check_options();
    o.ratio = 0.15f;
    o.deviation = cs.deviation;
    o.filtering = Filtering::TwoPass;
    o.selection = Selection::Deviation;
  o.selection = Selection::Deviation;
    const auto two = s.run(prompt, o);
    o.filtering = Filtering::SinglePass;
    const auto r = s.run(prompt, o);
    // Both forms score at layer 1 from the same layer-0 state: the same choice.
    EXPECT_EQ(two.recomputed_positions, r.recomputed_positions);
    int hits = 0;
    for (char h : cs.hit) hits += h;
    ASSERT_EQ(r.stats.chunks_hit, hits);
    const auto oracle = oracle_layer1_deviation(s, prompt, cs.hit, cs.deviation);
    const int64_t H = static_cast<int64_t>(oracle.positions.size());
    ASSERT_EQ(H, r.stats.cached_tokens);
    const int64_t count = std::llround(0.15 * H);
    ASSERT_EQ(r.stats.candidates_per_check, std::vector<int64_t>{count});
    const auto top = extreme_k(oracle, count, true), bottom = extreme_k(oracle, count, false);
    EXPECT_EQ(r.recomputed_positions, top);
    // The oracle discriminates: the least deviating tokens (what a reversed
    // comparator would pick) are a different set, and the scores are not all equal.
    EXPECT_NE(bottom, top);
    std::set<double> distinct(oracle.deviation.begin(), oracle.deviation.end());
    EXPECT_GT(distinct.size(), oracle.deviation.size() / 2);
    const auto [lo, hi] = std::minmax_element(oracle.deviation.begin(), oracle.deviation.end());
    std::printf("[layer-1 deviation, %s] H=%lld k=%lld min %.3g max %.3g\n", cs.name, static_cast<long long>(H),
                static_cast<long long>(count), *lo, *hi);
  }
}

// The query-aware scores at check layer 1, recomputed from the public pieces as the
// engine's single pass defines them: every cached chunk placed, layer 0 over every
// chunk and suffix token, Q/K/V of layer 1; the deviation read against the placed
// rows, then every computed row's K/V stored; the attention the suffix's query rows
// pay each position at layer 1 (the backend's attention_mass, tested against its
// definition in test_kernels); per cached token: that weight (attention) or the
// weight times the deviation's norm (impact).
OracleScores oracle_layer1_query_aware(BlendSetup& s, const RagPrompt& prompt, Selection rule) {
  const auto& c = s.m.config();
  const int64_t N = prompt.size(), P = static_cast<int64_t>(prompt.prefix.size());
  const int64_t S = static_cast<int64_t>(prompt.suffix.size());
  auto cache = loaded_cache(s, prompt, std::vector<char>(prompt.chunks.size(), 1));
  const auto rows = iota_positions(P, N);  // every chunk token, then the suffix
  const int64_t n = static_cast<int64_t>(rows.size());
  auto hidden = after_layer0(s, prompt, rows, cache, N);
  const int64_t kvd = c.kv_dim(), qd = c.q_dim();
  std::vector<float> q(static_cast<size_t>(n * qd)), k(static_cast<size_t>(n * kvd)), v(k.size());
  s.tf.project_qkv(1, hidden.data(), rows.data(), n, q.data(), k.data(), v.data());
  std::vector<double> dev(static_cast<size_t>(n - S));
  s.m.backend().kv_deviation(cache.view(1), rows.data(), k.data(), v.data(), n - S, Deviation::KV, dev.data());
  s.tf.store_kv(1, rows.data(), n, k.data(), v.data(), cache);
  std::vector<double> mass(static_cast<size_t>(N));
  s.m.backend().attention_mass(q.data() + (n - S) * qd, rows.data() + (n - S), cache.view(1), S, c.n_heads, N,
                               1.0f / std::sqrt(static_cast<float>(c.head_dim)), mass.data());
  OracleScores out;
  for (int64_t i = 0; i < n - S; ++i) {
    const double w = mass[static_cast<size_t>(rows[i])];
    out.positions.push_back(rows[i]);
    out.deviation.push_back(rule == Selection::Impact ? w * std::sqrt(dev[static_cast<size_t>(i)]) : w);
  }
  return out;
}

// The query-aware rules at one check (layer 1, ratio 0.15, every chunk cached) pick
// exactly the oracle's top-k, a set other than the deviation's; the question's rows
// attend unevenly (the scores discriminate), and the trace names the rule.
TEST_F(BlendSelection, QueryAwareRulesPickTheTopKOfTheQuestionsAttentionAtLayerOne) {
  BlendSetup s;
  const auto prompt = make_prompt(s.m, kDocs, kQuestion);
  s.from_store.warm(prompt);
  BlendOptions o = one_check_options();
  const auto by_deviation = s.run(prompt, o);
  EXPECT_EQ(by_deviation.stats.selection, "deviation");
  for (Selection rule : {Selection::Attention, Selection::Impact}) {
    SCOPED_TRACE(selection_name(rule));
    o.selection = rule;
    const auto r = s.run(prompt, o);
    EXPECT_EQ(r.stats.selection, selection_name(rule));
    const auto oracle = oracle_layer1_query_aware(s, prompt, rule);
    const int64_t H = static_cast<int64_t>(oracle.positions.size());
    ASSERT_EQ(H, r.stats.cached_tokens);
    const int64_t count = std::llround(0.15 * H);
    const auto top = extreme_k(oracle, count, true);
    EXPECT_EQ(r.recomputed_positions, top);
    EXPECT_NE(r.recomputed_positions, by_deviation.recomputed_positions);
    EXPECT_NE(extreme_k(oracle, count, false), top);
    std::set<double> distinct(oracle.deviation.begin(), oracle.deviation.end());
    EXPECT_GT(distinct.size(), oracle.deviation.size() / 2);
  }
}

// Selection::QueryFirst's scores, recomputed from the public pieces as the engine
// defines them: every chunk placed, the question's rows alone (the suffix) run
// through every layer over that cache (each layer's K/V stored, then attention and
// MLP); at each layer the attention the question pays each key (attention_mass),
// normalized over the cached tokens; a cached token's score is the sum over layers
// from_layer..last.
OracleScores oracle_query_first(BlendSetup& s, const RagPrompt& prompt, int from_layer = 0) {
  const auto& c = s.m.config();
  const int64_t N = prompt.size(), S = static_cast<int64_t>(prompt.suffix.size());
  auto cache = loaded_cache(s, prompt, std::vector<char>(prompt.chunks.size(), 1));
  const auto rows = iota_positions(N - S, N);
  const auto all = prompt.concatenated();
  std::vector<int32_t> ids(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) ids[i] = all[rows[i]];
  std::vector<float> hidden(static_cast<size_t>(S * c.dim));
  s.tf.embed(ids, hidden.data());
  const int64_t kvd = c.kv_dim(), qd = c.q_dim();
  std::vector<float> q(static_cast<size_t>(S * qd)), k(static_cast<size_t>(S * kvd)), v(k.size());
  const auto cached = iota_positions(prompt.chunk_offset(0), N - S);
  OracleScores out;
  out.positions = cached;
  out.deviation.assign(cached.size(), 0.0);
  std::vector<double> mass(static_cast<size_t>(N));
  for (int l = 0; l < c.n_layers; ++l) {
    s.tf.project_qkv(l, hidden.data(), rows.data(), S, q.data(), k.data(), v.data());
    s.tf.store_kv(l, rows.data(), S, k.data(), v.data(), cache);
    s.m.backend().attention_mass(q.data(), rows.data(), cache.view(l), S, c.n_heads, N,
                                 1.0f / std::sqrt(static_cast<float>(c.head_dim)), mass.data());
    double total = 0;
    for (int32_t p : cached) total += mass[static_cast<size_t>(p)];
    if (l >= from_layer)
      for (size_t i = 0; i < cached.size(); ++i) out.deviation[i] += mass[static_cast<size_t>(cached[i])] / total;
    s.tf.attend_and_mlp(l, hidden.data(), q.data(), rows.data(), S, cache, N);
  }
  return out;
}

// query-first picks exactly the oracle's top-k (a set other than the deviation's and
// than the bottom k), reports its rule, one selection, and recomputes the chosen
// tokens in every layer (row_layers: final pass only); with every cached token
// chosen it computes what full computes.
TEST_F(BlendSelection, QueryFirstPicksTheTopKOfTheQuestionsAttentionOverEveryLayer) {
  BlendSetup s;
  const auto& c = s.m.config();
  const auto prompt = make_prompt(s.m, kDocs, kQuestion);
  s.from_store.warm(prompt);
  const int64_t H = chunk_tokens(prompt), S = static_cast<int64_t>(prompt.suffix.size());
  BlendOptions o;
  o.selection = Selection::Deviation;
  o.ratio = 0.15f;
  const auto by_deviation = s.run(prompt, o);
  o.selection = Selection::QueryFirst;
  const auto r = s.run(prompt, o);
  EXPECT_EQ(r.stats.selection, "query-first");
  const auto oracle = oracle_query_first(s, prompt);
  ASSERT_EQ(static_cast<int64_t>(oracle.positions.size()), H);
  ASSERT_EQ(r.stats.cached_tokens, H);
  const int64_t count = std::llround(0.15 * H);
  const auto top = extreme_k(oracle, count, true);
  EXPECT_EQ(r.recomputed_positions, top);
  EXPECT_EQ(r.stats.candidates_per_check, std::vector<int64_t>{count});
  EXPECT_EQ(r.stats.row_layers, (count + S) * c.n_layers);
  EXPECT_NE(r.recomputed_positions, by_deviation.recomputed_positions);
  EXPECT_NE(extreme_k(oracle, count, false), top);
  std::set<double> distinct(oracle.deviation.begin(), oracle.deviation.end());
  EXPECT_GT(distinct.size(), oracle.deviation.size() / 2);
  // The per-chunk counts add up to the choice.
  int64_t per_chunk = 0;
  for (int64_t n : r.stats.recomputed_per_chunk) per_chunk += n;
  EXPECT_EQ(per_chunk, count);

  // Its quality lies between reuse and full, nearer full (first-token KL).
  const auto full = s.run(prompt, BlendMode::Full);
  const auto reuse = s.run(prompt, BlendMode::Reuse);
  const double kl = kl_divergence(full.logits, r.logits), kl_reuse = kl_divergence(full.logits, reuse.logits);
  std::printf("[query-first r 0.15] KL %.4f, reuse %.4f, deviation %.4f\n", kl, kl_reuse,
              kl_divergence(full.logits, by_deviation.logits));
  EXPECT_LT(kl, kl_reuse);

  // Every cached token chosen (through the scoring, not the ratio-1 shortcut): the
  // final pass computes every token but the exact prefix, as full does.
  o.ratio = static_cast<float>((static_cast<double>(H) - 0.25) / static_cast<double>(H));
  const auto all = s.run(prompt, o);
  EXPECT_EQ(all.recomputed_positions, iota_positions(prompt.chunk_offset(0), prompt.suffix_offset()));
  EXPECT_LT(max_abs_diff(full.logits, all.logits), 1e-4);
}

// query_first_from_layer leaves the layers before it out of the sum: the choice is the
// oracle's top-k over the layers from there on, another set than over every layer; a
// layer past the model's last scores the last alone; a negative one is refused.
TEST_F(BlendSelection, QueryFirstFromLayerSumsOnlyTheLayersFromThere) {
  BlendSetup s;
  const auto& c = s.m.config();
  const auto prompt = make_prompt(s.m, kDocs, kQuestion);
  s.from_store.warm(prompt);
  const int64_t H = chunk_tokens(prompt);
  const int64_t count = std::llround(0.15 * H);
  BlendOptions o;
  o.selection = Selection::QueryFirst;
  o.ratio = 0.15f;
  o.query_first_from_layer = 0;
  const auto every = s.run(prompt, o);
  for (int from : {2, c.n_layers - 1}) {
    SCOPED_TRACE(from);
    o.query_first_from_layer = from;
    const auto r = s.run(prompt, o);
    EXPECT_EQ(r.recomputed_positions, extreme_k(oracle_query_first(s, prompt, from), count, true));
    EXPECT_NE(r.recomputed_positions, every.recomputed_positions);
  }
  o.query_first_from_layer = c.n_layers + 5;
  EXPECT_EQ(s.run(prompt, o).recomputed_positions,
            extreme_k(oracle_query_first(s, prompt, c.n_layers - 1), count, true));
  o.query_first_from_layer = -1;
  EXPECT_THROW(s.run(prompt, o), std::invalid_argument);
}

// The query-aware rules read the question, not a continuation scored after it: a
// prompt with answer tokens appended and their logits asked for (an eval's teacher
// forcing) recomputes exactly the tokens the question alone does, while deviation is
// blind to the suffix either way. Before, the appended answer steered the choice.
TEST_F(BlendSelection, QueryAwareRulesIgnoreAScoredContinuation) {
  BlendSetup s;
  const auto prompt = make_prompt(s.m, kDocs, kQuestion);
  s.from_store.warm(prompt);
  RagPrompt forced = prompt;
  const auto answer = s.m.tokenizer().encode(" The Eiffel Tower is in Paris and it is 330 metres tall.", false);
  forced.suffix.insert(forced.suffix.end(), answer.begin(), answer.end());
  const int64_t rows = static_cast<int64_t>(answer.size()) + 1;
  for (Selection rule : {Selection::Impact, Selection::Attention, Selection::QueryFirst}) {
    SCOPED_TRACE(selection_name(rule));
    BlendOptions o;
    o.selection = rule;
    o.ratio = 0.15f;
    const auto alone = s.from_store.prefill(prompt, o);
    const auto scored = s.from_store.prefill(forced, o, 0, rows);
    EXPECT_EQ(scored.recomputed_positions, alone.recomputed_positions);
    // The continuation's first row is the question's last: the same logits.
    const int64_t V = s.m.config().vocab;
    const std::vector<float> first(scored.logits.begin(), scored.logits.begin() + V);
    EXPECT_LT(max_abs_diff(first, alone.logits), 1e-3);
    // Scoring the continuation as the question (one logit row) does change the choice.
    const auto as_question = s.from_store.prefill(forced, o);
    EXPECT_NE(as_question.recomputed_positions, alone.recomputed_positions);
  }
}

// place_chunk_kv at an offset p > 0, checked in every layer:
//  (1) rows outside [p, p+m) are not touched (no spill, right offset);
//  (2) V is the stored V bit for bit in every layer (V carries no position);
//  (3) K rotated back by -p (an independent double-precision RoPE here) is the
//      stored K in every layer and head: the placement rotated by exactly p,
//      everywhere, with the model's pairing of dimensions;
//  (4) layer 0, where K/V depend only on the token and its position, equals K/V
//      computed in place at positions p..p+m-1 with project_qkv.
TEST_F(BlendSelection, PlacedChunkKvIsTheStoredKvRotatedByTheOffsetInEveryLayer) {
  BlendSetup s;
  const auto& c = s.m.config();
  const auto& rope = s.m.rope().table;
  const auto chunk = document_chunk_tokens(s.m.tokenizer(), kDocs[1]);
  const int64_t m = static_cast<int64_t>(chunk.size());
  auto kv = s.engine.compute_chunk_kv(chunk);
  const auto kv_k = kv->k_fp32(), kv_v = kv->v_fp32();
  const float kSentinel = -12345.0f;
  for (int64_t p : {37, 611}) {
    SCOPED_TRACE("offset " + std::to_string(p));
    auto cache = s.tf.make_cache(p + m + 9);
    for (int l = 0; l < cache.n_layers; ++l)
      for (int h = 0; h < cache.kv_heads; ++h)
        for (int64_t row = 0; row < cache.capacity; ++row) {
          std::fill_n(cache.k_at(l, h, row), cache.head_dim, kSentinel);
          std::fill_n(cache.v_at(l, h, row), cache.head_dim, kSentinel);
        }
    place_chunk_kv(*kv, p, cache, s.m);

    int64_t touched_outside = 0, v_mismatch = 0;
    double k_err = 0, k_max = 0;
    for (int l = 0; l < c.n_layers; ++l)
      for (int h = 0; h < c.n_kv_heads; ++h) {
        for (int64_t row = 0; row < cache.capacity; ++row) {
          if (row >= p && row < p + m) continue;
          for (int d = 0; d < c.head_dim; ++d)
            touched_outside += cache.k_at(l, h, row)[d] != kSentinel || cache.v_at(l, h, row)[d] != kSentinel;
        }
        const float* stored_k = kv_k.data() + l * kv->layer_elements() + static_cast<int64_t>(h) * m * c.head_dim;
        const float* stored_v = kv_v.data() + l * kv->layer_elements() + static_cast<int64_t>(h) * m * c.head_dim;
        for (int64_t t = 0; t < m; ++t)
          v_mismatch += std::memcmp(cache.v_at(l, h, p + t), stored_v + t * c.head_dim, c.head_dim * sizeof(float)) != 0;
        for (int64_t t = 0; t < m; ++t) {
          const float* placed = cache.k_at(l, h, p + t);
          const float* stored = stored_k + t * c.head_dim;
          for (int i = 0; i < c.head_dim / 2; ++i) {
            const bool inter = rope.style == kernels::RopeStyle::Interleaved;
            const int a = inter ? 2 * i : i, b = inter ? 2 * i + 1 : i + c.head_dim / 2;
            const double angle = -static_cast<double>(p) * rope.inv_freq[i];
            const double x0 = placed[a], x1 = placed[b];
            const double back0 = x0 * std::cos(angle) - x1 * std::sin(angle);
            const double back1 = x0 * std::sin(angle) + x1 * std::cos(angle);
            k_err = std::max({k_err, std::fabs(back0 - stored[a]), std::fabs(back1 - stored[b])});
            k_max = std::max({k_max, std::fabs(static_cast<double>(stored[a])), std::fabs(static_cast<double>(stored[b]))});
          }
        }
      }
    EXPECT_EQ(touched_outside, 0);
    EXPECT_EQ(v_mismatch, 0);
    // Measured 5.7e-8 of max |K| (fp32 cos/sin of the angle) at both offsets; a wrong
    // angle, pairing or head gives O(1).
    std::printf("[placed K rotated back by -%lld] max err %.3g, max |K| %.3g, relative %.2e\n",
                static_cast<long long>(p), k_err, k_max, k_err / k_max);
    EXPECT_LT(k_err / k_max, 1e-5);

    std::vector<int32_t> pos(static_cast<size_t>(m));
    std::iota(pos.begin(), pos.end(), static_cast<int32_t>(p));
    std::vector<float> hidden(static_cast<size_t>(m * c.dim)), q(static_cast<size_t>(m * c.q_dim())),
        k(static_cast<size_t>(m * c.kv_dim())), v(k.size());
    s.tf.embed(chunk, hidden.data());
    s.tf.project_qkv(0, hidden.data(), pos.data(), m, q.data(), k.data(), v.data());
    double k0_err = 0, k0_max = 0, v0_err = 0;
    for (int64_t t = 0; t < m; ++t)
      for (int h = 0; h < c.n_kv_heads; ++h)
        for (int d = 0; d < c.head_dim; ++d) {
          const float fk = k[t * c.kv_dim() + h * c.head_dim + d], fv = v[t * c.kv_dim() + h * c.head_dim + d];
          k0_err = std::max(k0_err, static_cast<double>(std::fabs(cache.k_at(0, h, p + t)[d] - fk)));
          k0_max = std::max(k0_max, static_cast<double>(std::fabs(fk)));
          v0_err = std::max(v0_err, static_cast<double>(std::fabs(cache.v_at(0, h, p + t)[d] - fv)));
        }
    std::printf("[layer 0 placed vs in place] K relative %.2e, V max err %.2e\n", k0_err / k0_max, v0_err);
    // Measured K 9.4e-8 relative (two fp32 rotations vs one), V exact (same GEMM).
    EXPECT_LT(k0_err / k0_max, 1e-5);
    EXPECT_LT(v0_err, 1e-6);
  }
}

// Some chunks cached, some missed, ratio 0.15: the counts add up, only cached tokens
// are selected, and the answer's first-token distribution is closer to full's than
// reuse's is, on two unrelated prompts.
TEST_F(BlendSelection, PartlyCachedPromptCountsAndQuality) {
  BlendSetup s;
  struct Case {
    std::vector<std::string> docs;
    std::string question;
  };
  for (const auto& cs : {Case{kDocs, kQuestion}, Case{kDocs2, kQuestion2}}) {
    SCOPED_TRACE(cs.question);
    const auto prompt = make_prompt(s.m, cs.docs, cs.question);
    // Chunks 0 and 2 are stored; 1 and 3 miss.
    s.from_store.warm(make_prompt(s.m, {cs.docs[0], cs.docs[2]}, cs.question));
    const std::vector<char> hit = {1, 0, 1, 0};
    const auto full = s.run(prompt, BlendMode::Full);
    const auto reuse = s.run(prompt, BlendMode::Reuse);
    const auto blend = s.run(prompt, BlendMode::Blend, 0.15f);
    const auto& st = blend.stats;
    int64_t cached = 0, missed = 0;
    for (size_t i = 0; i < prompt.chunks.size(); ++i) (hit[i] ? cached : missed) += prompt.chunks[i].size();
    const int64_t S = static_cast<int64_t>(prompt.suffix.size());
    EXPECT_EQ(st.chunks, 4);
    EXPECT_EQ(st.chunks_hit, 2);
    EXPECT_TRUE(st.prefix_hit);
    EXPECT_EQ(st.cached_tokens, cached);
    EXPECT_EQ(st.chunk_tokens, cached + missed);
    EXPECT_EQ(st.candidates_per_check, std::vector<int64_t>{std::llround(0.15 * cached)});
    EXPECT_EQ(st.recomputed_tokens, std::llround(0.15 * cached));
    EXPECT_EQ(st.computed_tokens, missed + S + st.recomputed_tokens);
    EXPECT_EQ(reuse.stats.computed_tokens, missed + S);
    ASSERT_EQ(static_cast<int64_t>(blend.recomputed_positions.size()), st.recomputed_tokens);
    EXPECT_TRUE(std::is_sorted(blend.recomputed_positions.begin(), blend.recomputed_positions.end()));
    EXPECT_EQ(std::adjacent_find(blend.recomputed_positions.begin(), blend.recomputed_positions.end()),
              blend.recomputed_positions.end());
    for (int32_t p : blend.recomputed_positions) {
      bool inside_cached = false;
      for (size_t i = 0; i < prompt.chunks.size(); ++i) {
        const int64_t off = prompt.chunk_offset(i);
        inside_cached |= hit[i] && p >= off && p < off + static_cast<int64_t>(prompt.chunks[i].size());
      }
      EXPECT_TRUE(inside_cached) << "recomputed position " << p << " is not in a cached chunk";
    }
    const double kl_blend = kl_divergence(full.logits, blend.logits), kl_reuse = kl_divergence(full.logits, reuse.logits);
    const double d_blend = max_abs_diff(full.logits, blend.logits), d_reuse = max_abs_diff(full.logits, reuse.logits);
    std::printf("[partly cached, vs full] KL reuse %.4f blend %.4f; max |dlogit| reuse %.3f blend %.3f\n", kl_reuse,
                kl_blend, d_reuse, d_blend);
    // Measured (AVX2, fp32) KL reuse 0.109 / blend 0.043 and 0.498 / 0.253: only the
    // ordering is asserted.
    EXPECT_LT(kl_blend, kl_reuse);
  }
}


// Cached positions of the prompt whose K and V in `layer` are bit for bit those of
// `other` (the loaded KV left as reuse leaves it) in every KV head.
int64_t count_identical_rows(const KvCache& a, const KvCache& other, int layer, const std::vector<int32_t>& positions) {
  int64_t same = 0;
  for (int32_t p : positions) {
    bool eq = true;
    for (int h = 0; h < a.kv_heads && eq; ++h)
      eq = std::memcmp(a.k_at(layer, h, p), other.k_at(layer, h, p), a.head_dim * sizeof(float)) == 0 &&
           std::memcmp(a.v_at(layer, h, p), other.v_at(layer, h, p), a.head_dim * sizeof(float)) == 0;
    same += eq;
  }
  return same;
}

// Largest |K - K'| or |V - V'| of one position in one layer over the KV heads.
double row_max_diff(const KvCache& a, const KvCache& b, int layer, int32_t p) {
  double m = 0;
  for (int h = 0; h < a.kv_heads; ++h)
    for (int64_t d = 0; d < a.head_dim; ++d) {
      m = std::max(m, static_cast<double>(std::fabs(a.k_at(layer, h, p)[d] - b.k_at(layer, h, p)[d])));
      m = std::max(m, static_cast<double>(std::fabs(a.v_at(layer, h, p)[d] - b.v_at(layer, h, p)[d])));
    }
  return m;
}

std::vector<int32_t> cached_positions(const RagPrompt& prompt) {
  return iota_positions(prompt.chunk_offset(0), prompt.suffix_offset());
}

// The single pass keeps what it computed while scoring (gradual filtering, check
// layers 1, 2, 3): at layer 1 every cached token has full's KV (layer 0 ran over
// everything with the exact prefix); at layer 2 exactly the survivors of check 1
// have fresh KV and every other cached token still has its loaded KV, bit for bit
// as reuse leaves it; at layer 3 the survivors of check 2; above, the recomputed
// tokens. Two passes restore the loaded KV at the check layer: there only the
// recomputed tokens differ from reuse, in every layer.
TEST_F(BlendSelection, SinglePassKeepsTheKvComputedWhileScoring) {
  BlendSetup s;
  const auto prompt = make_prompt(s.m, kDocs, kQuestion);
  s.from_store.warm(prompt);
  const auto cached = cached_positions(prompt);
  const int64_t H = static_cast<int64_t>(cached.size());
  const int64_t N = prompt.size();
  BlendOptions o = one_check_options();
  o.mode = BlendMode::Full;
  auto full = s.from_store.prefill(prompt, o);
  o.mode = BlendMode::Reuse;
  auto reuse = s.from_store.prefill(prompt, o);
  o.mode = BlendMode::Blend;
  o.ratio = 0.15f;
  o.check_layers = {1, 2, 3};
  auto one = s.from_store.prefill(prompt, o);
  const auto& kept = one.stats.candidates_per_check;
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept[2], std::llround(0.15 * H));
  EXPECT_GT(kept[0], kept[1]);
  EXPECT_GT(kept[1], kept[2]);
  ASSERT_EQ(one.stats.recomputed_tokens, kept[2]);
  ASSERT_EQ(one.cache.length, N);

  double worst_fresh = 0, best_loaded = 1e30;
  for (int32_t p : cached) {
    worst_fresh = std::max(worst_fresh, row_max_diff(one.cache, full.cache, 1, p));
    best_loaded = std::min(best_loaded, row_max_diff(reuse.cache, full.cache, 1, p));
  }
  std::printf("[layer 1 vs full] single pass worst %.2e; loaded KV best %.2e\n", worst_fresh, best_loaded);
  // Measured (AVX2, fp32): fresh within ~1e-5 of full; the loaded KV of every cached
  // token at least ~1e-2 away.
  EXPECT_LT(worst_fresh, 1e-3);
  EXPECT_GT(best_loaded, 10 * worst_fresh);
  EXPECT_EQ(count_identical_rows(one.cache, reuse.cache, 1, cached), 0);
  EXPECT_EQ(count_identical_rows(one.cache, reuse.cache, 2, cached), H - kept[0]);
  EXPECT_EQ(count_identical_rows(one.cache, reuse.cache, 3, cached), H - kept[1]);
  for (int l = 4; l < s.m.config().n_layers; ++l)
    EXPECT_EQ(count_identical_rows(one.cache, reuse.cache, l, cached), H - kept[2]) << "layer " << l;

  o.check_layers = {1};
  o.filtering = Filtering::TwoPass;
  o.selection = Selection::Deviation;
  auto two = s.from_store.prefill(prompt, o);
  const int64_t k2 = two.stats.recomputed_tokens;
  ASSERT_EQ(k2, std::llround(0.15 * H));
  for (int l = 1; l < s.m.config().n_layers; ++l)
    EXPECT_EQ(count_identical_rows(two.cache, reuse.cache, l, cached), H - k2) << "layer " << l;
}

// Per-chunk quotas: the budget round(0.15 H) split over the cached chunks in
// proportion to their sizes (largest remainder), each chunk's share taken from its
// own largest layer-1 deviations (the oracle's), with one chunk missed.
TEST_F(BlendSelection, PerChunkQuotaTakesEachChunksShareFromItsOwnTopDeviations) {
  BlendSetup s;
  const auto prompt = make_prompt(s.m, kDocs, kQuestion);
  s.from_store.warm(make_prompt(s.m, {kDocs[0], kDocs[2], kDocs[3]}, kQuestion));
  const std::vector<char> hit = {1, 0, 1, 1};
  const auto oracle = oracle_layer1_deviation(s, prompt, hit, Deviation::KV);
  const int64_t H = static_cast<int64_t>(oracle.positions.size());
  const int64_t total = std::llround(0.15 * H);
  // Each chunk's share, computed here independently.
  std::vector<int64_t> sizes, share;
  std::vector<double> rem;
  int64_t given = 0;
  for (size_t i = 0; i < prompt.chunks.size(); ++i) {
    sizes.push_back(hit[i] ? static_cast<int64_t>(prompt.chunks[i].size()) : 0);
    const double exact = static_cast<double>(total) * sizes[i] / H;
    share.push_back(static_cast<int64_t>(exact));
    rem.push_back(exact - share.back());
    given += share.back();
  }
  while (given < total) {
    const size_t best = std::max_element(rem.begin(), rem.end()) - rem.begin();
    ++share[best];
    rem[best] = -1;
    ++given;
  }
  std::vector<int32_t> expected;
  for (size_t i = 0; i < prompt.chunks.size(); ++i) {
    if (!hit[i]) continue;
    const int64_t off = prompt.chunk_offset(i), m = static_cast<int64_t>(prompt.chunks[i].size());
    OracleScores mine;
    for (size_t j = 0; j < oracle.positions.size(); ++j)
      if (oracle.positions[j] >= off && oracle.positions[j] < off + m) {
        mine.positions.push_back(oracle.positions[j]);
        mine.deviation.push_back(oracle.deviation[j]);
      }
    const auto top = extreme_k(mine, share[i], true);
    expected.insert(expected.end(), top.begin(), top.end());
  }
  std::sort(expected.begin(), expected.end());
  BlendOptions o = one_check_options();
  o.ratio = 0.15f;
  o.quota = Quota::PerChunk;
  for (Filtering f : {Filtering::SinglePass, Filtering::TwoPass}) {
    SCOPED_TRACE(filtering_name(f));
    o.filtering = f;
    const auto r = s.run(prompt, o);
    EXPECT_EQ(r.stats.candidates_per_check, std::vector<int64_t>{total});
    EXPECT_EQ(r.recomputed_positions, expected);
  }
  // The global top-k of the same deviations is a different set here (otherwise this
  // test could not tell the two apart).
  o.quota = Quota::Global;
  EXPECT_NE(s.run(prompt, o).recomputed_positions, expected);
}

// Chunk-start sinks: the first k tokens of every cached chunk are recomputed and
// count towards the budget; the rest of the budget goes to the largest deviations
// among the other cached tokens. Ratio 0 is still reuse.
TEST_F(BlendSelection, SinkTokensAreRecomputedWithinTheBudget) {
  BlendSetup s;
  const auto prompt = make_prompt(s.m, kDocs, kQuestion);
  s.from_store.warm(prompt);
  const std::vector<char> hit(prompt.chunks.size(), 1);
  const auto oracle = oracle_layer1_deviation(s, prompt, hit, Deviation::KV);
  const int64_t H = static_cast<int64_t>(oracle.positions.size());
  const int k = 2;
  std::set<int32_t> sinks;
  for (size_t i = 0; i < prompt.chunks.size(); ++i)
    for (int j = 0; j < k; ++j) sinks.insert(static_cast<int32_t>(prompt.chunk_offset(i) + j));
  OracleScores rest;
  for (size_t j = 0; j < oracle.positions.size(); ++j)
    if (!sinks.count(oracle.positions[j])) {
      rest.positions.push_back(oracle.positions[j]);
      rest.deviation.push_back(oracle.deviation[j]);
    }
  const int64_t total = std::llround(0.15 * H);
  auto expected = extreme_k(rest, total - static_cast<int64_t>(sinks.size()), true);
  expected.insert(expected.end(), sinks.begin(), sinks.end());
  std::sort(expected.begin(), expected.end());

  BlendOptions o = one_check_options();
  o.ratio = 0.15f;
  o.sink_tokens = k;
  for (Filtering f : {Filtering::SinglePass, Filtering::TwoPass}) {
    SCOPED_TRACE(filtering_name(f));
    o.filtering = f;
    const auto r = s.run(prompt, o);
    EXPECT_EQ(r.stats.recomputed_tokens, total);
    EXPECT_EQ(r.recomputed_positions, expected);
  }
  // A budget smaller than the sinks: only the sinks.
  o.ratio = static_cast<float>(0.25 / static_cast<double>(H));
  o.min_tokens = 0;
  const auto few = s.run(prompt, o);
  EXPECT_EQ(few.recomputed_positions, std::vector<int32_t>(sinks.begin(), sinks.end()));
  // Ratio 0: nothing recomputed, exactly reuse.
  o.ratio = 0.0f;
  const auto zero = s.run(prompt, o);
  EXPECT_TRUE(zero.recomputed_positions.empty());
  EXPECT_LT(max_abs_diff(zero.logits, s.run(prompt, BlendMode::Reuse).logits), 1e-5);
  o.sink_tokens = -1;
  o.ratio = 0.15f;
  EXPECT_THROW(s.run(prompt, o), std::invalid_argument);
}

}  // namespace
}  // namespace bs
