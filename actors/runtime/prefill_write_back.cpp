#include "actors/runtime/prefill_write_back.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <span>
#include <string>
#include <utility>

#include <caf/all.hpp>

namespace bs {

std::shared_ptr<const ChunkKv> compute_alone(const WorkerEnv& env, const HandlesRef& h, const BatcherPtr& batcher,
                                             const std::vector<int32_t>& tokens, bool prefix) {
  try {
    if (env.tp) env.tp->dispatch(RankJob{RankJob::Chunk, 0, {}, false, {}, tokens, prefix});
    const LayerWait between = [env, h, &batcher](int) { interleave_decode(env, h, *batcher); };
    return prefix ? env.engine->compute_prefix_kv(tokens, between) : env.engine->compute_chunk_kv(tokens, between);
  } catch (const std::exception& e) {
    if (env.tp) env.tp->fail(e.what());
    throw;
  }
}

void queue_write_back(const WorkerEnv& env, const HandlesRef& h, const BatcherPtr& batcher, const RequestPlan& plan) {
  // One background job per part, so a decode step waits for at most one chunk's
  // compute. The background queue is bounded (ComputeThread): a part refused there is
  // not stored now (counted; computed again at its next miss).
  auto queue = [&](const std::vector<int32_t>& tokens, const ChunkKey& key) {
    if (tokens.empty()) return;
    if (!env.flights.claim(key)) return;  // queued or running for another request
    const bool queued = env.compute->submit(
        [env, h, batcher, tokens, key] {
          if (env.tiered->contains(key) && !env.flights.provisional(key)) return env.flights.release(key);
          try {
            auto kv = compute_alone(env, h, batcher, tokens, false);
            env.flights.computed(key);
            caf::anon_send(h->write_back(), kv_ready_atom::value, KeyedKv{key, std::move(kv)});
          } catch (const std::exception& e) {
            // A cache: the chunk is computed again on its next miss.
            std::fprintf(stderr, "blendserve: the write-back compute of chunk %s failed: %s\n", key.hex().c_str(),
                         e.what());
          }
          env.flights.release(key);
        },
        ComputeThread::Priority::Background);
    if (!queued) {
      env.flights.release(key);
      env.write_backs_refused.fetch_add(1);
    }
  };
  if (plan.store_missed_chunks)
    for (size_t i = 0; i < plan.prompt.chunks.size(); ++i)
      if (!plan.loaded.chunk_loaded[i]) queue(plan.prompt.chunks[i], plan.chunk_keys[i]);
  // Passages learnt on first sight: computed alone like a document's chunk (the KV the
  // blend was measured on), then stored and indexed for the pasted-passage search.
  for (const auto& tokens : plan.learn) queue(tokens, env.engine->chunk_key(tokens));
}

void store_provisional_chunks(const WorkerEnv& env, const RequestPlan& plan, const KvCache& cache) {
  if (!env.ram || env.tp || !env.backend->host_accessible()) return;
  auto store = [&](const ChunkKey& key, int64_t offset, std::span<const int32_t> tokens) {
    if (tokens.empty() || env.tiered->contains(key)) return;
    try {
      auto kv = env.engine->chunk_in_context(cache, offset, tokens);
      env.flights.mark_provisional(key);
      if (!env.ram->put(key, kv)) return env.flights.unmark_provisional(key);
      if (env.pasted) env.pasted->add(kv->tokens);
    } catch (const std::exception& e) {
      // A cache: the chunk's compute alone stores it.
      std::fprintf(stderr, "blendserve: a provisional entry of chunk %s was not stored: %s\n", key.hex().c_str(),
                   e.what());
    }
  };
  if (!plan.store_missed_chunks) return;
  for (size_t i = 0; i < plan.prompt.chunks.size(); ++i)
    if (!plan.loaded.chunk_loaded[i]) store(plan.chunk_keys[i], plan.prompt.chunk_offset(i), plan.prompt.chunks[i]);
}

void store_prefix_blocks(const WorkerEnv& env, const HandlesRef& h, const BatcherPtr& batcher,
                         std::vector<int32_t> tokens, int64_t block, int64_t first, int64_t tail_end,
                         const DecodeSlotPtr& slot) {
  const int64_t B = block;
  if (B <= 0) return;
  const int64_t end = static_cast<int64_t>(tokens.size()) / B;  // whole blocks
  tail_end = std::clamp<int64_t>(tail_end, 0, static_cast<int64_t>(tokens.size()));
  const bool tail = tail_end % B != 0;
  tokens.resize(static_cast<size_t>(std::max(end * B, tail_end)));
  // Each block to store: its key, first row and rows; the deepest first.
  struct Block {
    ChunkKey key;
    int64_t from, rows;
  };
  std::vector<Block> missing;
  if (tail) {
    const auto keys = env.engine->prefix_block_keys(tokens, B, tail_end);
    if (!env.tiered->contains(keys.back())) missing.push_back({keys.back(), tail_end / B * B, tail_end % B});
  }
  if (end > first) {
    const auto keys = env.engine->prefix_block_keys(tokens, B, end * B);
    for (int64_t j = end - 1; j >= first; --j)
      if (!env.tiered->contains(keys[static_cast<size_t>(j)])) missing.push_back({keys[static_cast<size_t>(j)], j * B, B});
  }
  if (missing.empty()) return;
  auto send = [h](const ChunkKey& key, std::shared_ptr<ChunkKv> kv) {
    caf::anon_send(h->write_back(), kv_ready_atom::value, KeyedKv{key, std::move(kv), false});
  };
  if (env.tp) {
    const bool queued = env.compute->submit(
        [env, h, batcher, tokens = std::move(tokens), missing, send] {
          try {
            const auto whole = compute_alone(env, h, batcher, tokens, true);
            for (const auto& b : missing) send(b.key, slice_rows(*whole, b.from, b.rows));
          } catch (const std::exception& e) {
            // A cache: the blocks are stored by the next prompt that begins with them.
            std::fprintf(stderr, "blendserve: computing a prompt's prefix blocks failed: %s\n", e.what());
          }
        },
        ComputeThread::Priority::Background);
    if (!queued) env.write_backs_refused.fetch_add(1);
    return;
  }
  // The copies: a memcpy per head and layer where the cache is host memory; a device
  // cache's rows cross to the host synchronously, which does not belong on the worker's
  // (CAF scheduler) thread: there they are copied by a background job on the compute
  // thread, which the slot keeps the cache alive for.
  auto copy = [env, tokens = std::move(tokens), missing, send](const KvCache& cache) {
    const auto& cfg = env.model->full_config();
    for (const auto& b : missing) {
      const int64_t m = b.rows;
      auto kv = std::make_shared<ChunkKv>();
      kv->tokens.assign(tokens.begin() + b.from, tokens.begin() + b.from + m);
      kv->n_layers = cfg.n_layers;
      kv->kv_heads = cfg.n_kv_heads;
      kv->head_dim = cfg.head_dim;
      kv->dtype = cache.dtype();
      kv->allocate();
      const int64_t head_bytes = m * cfg.head_dim * kv->elem_bytes();
      for (int l = 0; l < cfg.n_layers; ++l)
        for (int kh = 0; kh < cfg.n_kv_heads; ++kh)
          cache.read_rows_raw(l, kh, b.from, m, kv->k_layer(l) + kh * head_bytes, kv->v_layer(l) + kh * head_bytes);
      send(b.key, std::move(kv));
    }
  };
  if (env.backend->host_accessible()) return copy(slot->cache);
  const bool queued = env.compute->submit([copy, slot] { copy(slot->cache); }, ComputeThread::Priority::Background);
  if (!queued) env.write_backs_refused.fetch_add(1);
}

}  // namespace bs
