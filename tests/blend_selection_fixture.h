// What the selection suites share (test_blend_selection.cpp,
// test_blend_selection_kv.cpp): a second prompt, logits' distances, the one-check
// options, the real model with a RAM store and the engine over it, and the oracle
// that recomputes the layer-1 deviation from the public pieces.
#pragma once

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

namespace bs::selection_test {

using kernels::Precision;

using testing::kDocs;
using testing::kQuestion;
using testing::make_prompt;

// A second, unrelated prompt (different documents and question).
inline const std::vector<std::string> kDocs2 = {
    "Marta Quell keeps bees on the island of Sorn. Her hives stand on the southern slope, and each summer she "
    "sells about forty jars of heather honey at the harbour market.",
    "The Sorn ferry leaves the mainland port of Edda twice a day, at seven in the morning and at four in the "
    "afternoon. The crossing takes ninety minutes in calm weather.",
    "In 1954 a storm destroyed the old lighthouse of Sorn. The new lighthouse, built of white concrete, was lit "
    "for the first time on the first of May 1957.",
    "The island school of Sorn has eleven pupils and one teacher, Mr. Oskar Lind, who also plays the organ in "
    "the chapel on Sundays.",
};
inline const std::string kQuestion2 = "When was the new lighthouse of Sorn lit for the first time?";


inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

// KL(P || Q) of the softmaxes, in nats.
inline double kl_divergence(const std::vector<float>& p, const std::vector<float>& q) {
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
inline BlendOptions one_check_options() {
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

inline int64_t chunk_tokens(const RagPrompt& p) {
  int64_t n = 0;
  for (const auto& c : p.chunks) n += static_cast<int64_t>(c.size());
  return n;
}

inline std::vector<int32_t> iota_positions(int64_t begin, int64_t end) {
  std::vector<int32_t> v(static_cast<size_t>(end - begin));
  std::iota(v.begin(), v.end(), static_cast<int32_t>(begin));
  return v;
}

class BlendSelection : public ::testing::Test {
 protected:
  void SetUp() override { REQUIRE_MODEL(); }
};


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
inline KvCache loaded_cache(BlendSetup& s, const RagPrompt& prompt, const std::vector<char>& hit) {
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
inline std::vector<float> after_layer0(BlendSetup& s, const RagPrompt& prompt, const std::vector<int32_t>& rows,
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

inline OracleScores oracle_layer1_deviation(BlendSetup& s, const RagPrompt& prompt, const std::vector<char>& hit,
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
inline std::vector<int32_t> extreme_k(const OracleScores& o, int64_t count, bool largest) {
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

}  // namespace bs::selection_test
