#include "blend/store_backed_blend.h"

#include <chrono>
#include <stdexcept>

namespace bs {

StoreBackedBlend::StoreBackedBlend(const BlendEngine& engine, KvStore& store) : engine_(engine), store_(store) {
  if (engine.transformer().comm())
    throw std::invalid_argument(
        "StoreBackedBlend serves one rank; a tensor-parallel prefill takes its plan from the leader");
}

BlendPrefill StoreBackedBlend::prefill(const RagPrompt& prompt, const BlendOptions& opt, int64_t extra_capacity,
                                       int64_t logit_rows, const LayerWait& between_layers, KvCache* into) const {
  using clock_type = std::chrono::steady_clock;
  const auto t_start = clock_type::now();
  engine_.validate(prompt, opt, extra_capacity, logit_rows);
  if (into && into->capacity < prompt.size() + extra_capacity)
    throw std::invalid_argument("blend: the given cache does not fit the prompt and its answer");
  KvCache cache = into ? std::move(*into) : engine_.transformer().make_cache(prompt.size() + extra_capacity);
  cache.length = 0;
  bool prefix_hit = false;
  const PrefillPlan plan = read_stored(prompt, opt, cache, &prefix_hit);
  const double load = std::chrono::duration<double>(clock_type::now() - t_start).count();
  BlendPrefill r = engine_.prefill_planned(prompt, plan, cache, opt, between_layers, logit_rows, t_start);
  r.stats.prefix_hit = prefix_hit;
  r.stats.load_seconds += load;
  r.stats.total_seconds = std::chrono::duration<double>(clock_type::now() - t_start).count();
  return r;
}

PrefillPlan StoreBackedBlend::read_stored(const RagPrompt& prompt, const BlendOptions& opt, KvCache& cache,
                                          bool* prefix_hit) const {
  const auto& c = engine_.transformer().model().config();
  const int64_t P = static_cast<int64_t>(prompt.prefix.size());
  if (cache.capacity < prompt.size()) throw std::invalid_argument("blend: the cache does not fit the prompt");
  PrefillPlan plan;
  plan.chunk_loaded.assign(prompt.chunks.size(), 0);
  if (prefix_hit) *prefix_hit = false;
  if (opt.mode == BlendMode::Full) return plan;
  // Exact prefix: KV valid as stored, no recompute.
  if (P > 0) {
    const auto key = engine_.prefix_key(prompt.prefix);
    auto kv = store_.get(key);
    if (kv && kv->tokens == prompt.prefix && kv->n_layers == c.n_layers) {
      if (prefix_hit) *prefix_hit = true;
    } else {
      kv = engine_.compute_prefix_kv(prompt.prefix);
      store_.put(key, kv);
    }
    for (int l = 0; l < c.n_layers; ++l) copy_chunk_layer(kv->k_layer(l), kv->v_layer(l), kv->dtype, P, l, 0, cache);
    plan.prefix_cached = P;
  }
  if (opt.mode == BlendMode::Prefix) return plan;
  for (size_t i = 0; i < prompt.chunks.size(); ++i) {
    const auto& chunk = prompt.chunks[i];
    auto kv = store_.get(engine_.chunk_key(chunk));
    // A hash collision or a stale entry must never be used as this chunk's KV.
    if (!kv || kv->tokens != chunk || kv->n_layers != c.n_layers || kv->kv_heads != c.n_kv_heads ||
        kv->head_dim != c.head_dim)
      continue;
    const int64_t off = prompt.chunk_offset(i);
    for (int l = 0; l < c.n_layers; ++l)
      copy_chunk_layer(kv->k_layer(l), kv->v_layer(l), kv->dtype, kv->length(), l, off, cache);
    plan.chunk_loaded[i] = 1;
  }
  return plan;
}

void StoreBackedBlend::warm(const RagPrompt& prompt) const {
  if (!prompt.prefix.empty()) {
    const auto key = engine_.prefix_key(prompt.prefix);
    if (!store_.contains(key)) store_.put(key, engine_.compute_prefix_kv(prompt.prefix));
  }
  for (const auto& chunk : prompt.chunks) {
    if (chunk.empty()) continue;  // nothing to store; the others still are
    const auto key = engine_.chunk_key(chunk);
    if (!store_.contains(key)) store_.put(key, engine_.compute_chunk_kv(chunk));
  }
}

}  // namespace bs
