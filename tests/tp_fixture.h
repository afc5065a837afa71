// Shared by the tensor-parallel tests (tiny model and SmolLM2): greedy generation
// and a blend prefill driven on every rank of a TpGroup the way a leader drives its
// ranks — the caller picks each token from rank 0's logits and hands the same job to
// every rank — with the ranks' results checked against each other.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "blend/blend_engine.h"
#include "blend/rag_prompt.h"
#include "model/generate.h"
#include "model/tp_group.h"

namespace bs::testing {

// Greedy generation of `steps` tokens after `prompt` on every rank of `group`: the
// caller (the leader) picks each token from rank 0's logits and hands it to every
// rank. Returns the tokens and the logits of every step ([steps, vocab]); checks that
// every rank returned bit-identical logits.
struct Generated {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};
inline Generated generate_on(TpGroup& group, const std::vector<int32_t>& prompt, int steps) {
  const int size = group.size();
  std::vector<KvCache> caches;
  const auto capacity = static_cast<int64_t>(prompt.size()) + steps;
  for (int r = 0; r < size; ++r) caches.push_back(group.transformer(r).make_cache(capacity));
  Generated out;
  std::vector<std::vector<float>> logits(static_cast<size_t>(size));
  std::vector<int32_t> next = prompt;
  for (int s = 0; s < steps; ++s) {
    group.run([&](int r) { logits[r] = group.transformer(r).forward(next, caches[r]); });
    for (int r = 1; r < size; ++r)
      EXPECT_EQ(std::memcmp(logits[r].data(), logits[0].data(), logits[0].size() * sizeof(float)), 0)
          << "rank " << r << " of " << size << " differs from rank 0 at step " << s;
    const int32_t t = argmax(logits[0].data(), static_cast<int64_t>(logits[0].size()));
    out.tokens.push_back(t);
    out.logits.push_back(logits[0]);
    next = {t};
  }
  return out;
}

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
  return m;
}

// What one blend prefill did on every rank of a group.
struct BlendRun {
  std::vector<std::shared_ptr<const ChunkKv>> chunks;  // rank 0's: the prefix, then each chunk
  std::vector<std::vector<uint64_t>> digests;         // per rank: BlendStats::check_digests
  std::vector<std::vector<int32_t>> recomputed;       // per rank
  std::vector<std::vector<float>> logits;             // per rank: the prompt's last logits
  std::vector<int32_t> tokens;                        // greedy continuation (the leader's picks)
};

// The stored KV of the prompt's prefix and chunks computed on every rank (each rank
// returns every head, asserted equal), placed into each rank's cache as a loader
// would (its heads), then a blend prefill and a greedy continuation on every rank.
inline BlendRun blend_on(TpGroup& group, const RagPrompt& prompt, const BlendOptions& opt, int answer) {
  const int size = group.size();
  BlendRun out;
  out.digests.resize(size);
  out.recomputed.resize(size);
  out.logits.resize(size);
  std::vector<std::vector<std::shared_ptr<const ChunkKv>>> chunks(static_cast<size_t>(size));
  std::vector<std::unique_ptr<BlendEngine>> engines;
  for (int r = 0; r < size; ++r) engines.push_back(std::make_unique<BlendEngine>(group.transformer(r)));
  group.run([&](int r) {
    chunks[r].push_back(engines[r]->compute_prefix_kv(prompt.prefix));
    for (const auto& c : prompt.chunks) chunks[r].push_back(engines[r]->compute_chunk_kv(c));
  });
  for (int r = 1; r < size; ++r)
    for (size_t i = 0; i < chunks[0].size(); ++i) {
      EXPECT_EQ(chunks[r][i]->kv_heads, group.model(0).full_config().n_kv_heads);
      EXPECT_EQ(chunks[r][i]->k, chunks[0][i]->k) << "rank " << r << " part " << i;
      EXPECT_EQ(chunks[r][i]->v, chunks[0][i]->v) << "rank " << r << " part " << i;
    }
  out.chunks = chunks[0];
  std::vector<KvCache> caches;
  for (int r = 0; r < size; ++r) caches.push_back(group.transformer(r).make_cache(prompt.size() + answer));
  PrefillPlan plan;
  plan.prefix_cached = static_cast<int64_t>(prompt.prefix.size());
  plan.chunk_loaded.assign(prompt.chunks.size(), 1);
  std::vector<int32_t> next;
  group.run([&](int r) {
    const auto& m = group.model(r);
    for (size_t part = 0; part < out.chunks.size(); ++part) {
      const ChunkKv& kv = *out.chunks[part];
      const int64_t offset = part == 0 ? 0 : prompt.chunk_offset(part - 1);
      for (int l = 0; l < kv.n_layers; ++l)
        copy_chunk_layer(kv.k_layer(l), kv.v_layer(l), kv.dtype, kv.length(), l, offset, caches[r], m.first_kv_head());
    }
    BlendPrefill p = engines[r]->prefill_planned(prompt, plan, caches[r], opt, {});
    out.digests[r] = p.stats.check_digests;
    out.recomputed[r] = p.recomputed_positions;
    out.logits[r] = p.logits;
    caches[r] = std::move(p.cache);
  });
  std::vector<std::vector<float>> logits = out.logits;
  for (int s = 0; s < answer; ++s) {
    const int32_t t = argmax(logits[0].data(), static_cast<int64_t>(logits[0].size()));
    out.tokens.push_back(t);
    group.run([&](int r) { logits[r] = group.transformer(r).forward(std::span<const int32_t>(&t, 1), caches[r]); });
  }
  return out;
}

}  // namespace bs::testing
