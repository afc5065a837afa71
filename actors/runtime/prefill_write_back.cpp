#include "actors/runtime/prefill_write_back.h"

#include <cstdio>
#include <exception>
#include <span>
#include <string>
#include <utility>

#include <caf/all.hpp>

namespace bs {

std::shared_ptr<const ChunkKv> compute_alone(RuntimeContext* ctx, const HandlesRef& h, const BatcherPtr& batcher,
                                             const std::vector<int32_t>& tokens, bool prefix) {
  try {
    if (ctx->tp) ctx->tp->dispatch(RankJob{RankJob::Chunk, 0, {}, false, {}, tokens, prefix});
    const LayerWait between = [ctx, h, &batcher](int) { interleave_decode(ctx, h, *batcher); };
    return prefix ? ctx->engine->compute_prefix_kv(tokens, between) : ctx->engine->compute_chunk_kv(tokens, between);
  } catch (const std::exception& e) {
    if (ctx->tp) ctx->tp->fail(e.what());
    throw;
  }
}

void queue_write_back(RuntimeContext* ctx, const HandlesRef& h, const BatcherPtr& batcher, const RequestPlan& plan) {
  // One background job per part, so a decode step waits for at most one chunk's
  // compute. The background queue is bounded (ComputeThread): a part refused there is
  // not stored now (counted; computed again at its next miss).
  auto queue = [&](const std::vector<int32_t>& tokens, const ChunkKey& key) {
    if (tokens.empty()) return;
    if (!ctx->flights.claim(key)) return;  // queued or running for another request
    const bool queued = ctx->compute->submit(
        [ctx, h, batcher, tokens, key] {
          if (ctx->tiered->contains(key) && !ctx->flights.provisional(key)) return ctx->flights.release(key);
          try {
            auto kv = compute_alone(ctx, h, batcher, tokens, false);
            ctx->flights.computed(key);
            caf::anon_send(h->write_back(), kv_ready_atom::value, KeyedKv{key, std::move(kv)});
          } catch (const std::exception& e) {
            // A cache: the chunk is computed again on its next miss.
            std::fprintf(stderr, "blendserve: the write-back compute of chunk %s failed: %s\n", key.hex().c_str(),
                         e.what());
          }
          ctx->flights.release(key);
        },
        ComputeThread::Priority::Background);
    if (!queued) {
      ctx->flights.release(key);
      ctx->write_backs_refused.fetch_add(1);
    }
  };
  if (plan.store_missed_chunks)
    for (size_t i = 0; i < plan.prompt.chunks.size(); ++i)
      if (!plan.loaded.chunk_loaded[i]) queue(plan.prompt.chunks[i], plan.chunk_keys[i]);
  // Passages learnt on first sight: computed alone like a document's chunk (the KV the
  // blend was measured on), then stored and indexed for the pasted-passage search.
  for (const auto& tokens : plan.learn) queue(tokens, ctx->engine->chunk_key(tokens));
}

void store_provisional_chunks(RuntimeContext* ctx, const RequestPlan& plan, const KvCache& cache) {
  if (!ctx->ram || ctx->tp || !ctx->backend->host_accessible()) return;
  auto store = [&](const ChunkKey& key, int64_t offset, std::span<const int32_t> tokens) {
    if (tokens.empty() || ctx->tiered->contains(key)) return;
    try {
      auto kv = ctx->engine->chunk_in_context(cache, offset, tokens);
      ctx->flights.mark_provisional(key);
      if (!ctx->ram->put(key, kv)) return ctx->flights.unmark_provisional(key);
      if (ctx->pasted) ctx->pasted->add(kv->tokens);
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

void store_prefix_blocks(RuntimeContext* ctx, const HandlesRef& h, const BatcherPtr& batcher,
                         std::vector<int32_t> tokens, int64_t block, int64_t first, const DecodeSlotPtr& slot) {
  const int64_t B = block;
  if (B <= 0) return;
  const int64_t end = static_cast<int64_t>(tokens.size()) / B;
  if (end <= first) return;
  tokens.resize(static_cast<size_t>(end * B));
  const auto keys = ctx->engine->prefix_block_keys(tokens, B, end);
  std::vector<int64_t> missing;
  for (int64_t j = end - 1; j >= first; --j)
    if (!ctx->tiered->contains(keys[static_cast<size_t>(j)])) missing.push_back(j);
  if (missing.empty()) return;
  auto send = [h](const ChunkKey& key, std::shared_ptr<ChunkKv> kv) {
    caf::anon_send(h->write_back(), kv_ready_atom::value, KeyedKv{key, std::move(kv), false});
  };
  if (ctx->tp) {
    const bool queued = ctx->compute->submit(
        [ctx, h, batcher, tokens = std::move(tokens), keys, missing, B, send] {
          try {
            const auto whole = compute_alone(ctx, h, batcher, tokens, true);
            for (int64_t j : missing) send(keys[static_cast<size_t>(j)], slice_rows(*whole, j * B, B));
          } catch (const std::exception& e) {
            // A cache: the blocks are stored by the next prompt that begins with them.
            std::fprintf(stderr, "blendserve: computing a prompt's prefix blocks failed: %s\n", e.what());
          }
        },
        ComputeThread::Priority::Background);
    if (!queued) ctx->write_backs_refused.fetch_add(1);
    return;
  }
  // The copies: a memcpy per head and layer where the cache is host memory; a device
  // cache's rows cross to the host synchronously, which does not belong on the worker's
  // (CAF scheduler) thread: there they are copied by a background job on the compute
  // thread, which the slot keeps the cache alive for.
  auto copy = [ctx, tokens = std::move(tokens), keys, missing, B, send](const KvCache& cache) {
    const auto& cfg = ctx->model->full_config();
    for (int64_t j : missing) {
      auto kv = std::make_shared<ChunkKv>();
      kv->tokens.assign(tokens.begin() + j * B, tokens.begin() + (j + 1) * B);
      kv->n_layers = cfg.n_layers;
      kv->kv_heads = cfg.n_kv_heads;
      kv->head_dim = cfg.head_dim;
      kv->dtype = cache.dtype();
      kv->allocate();
      const int64_t head_bytes = B * cfg.head_dim * kv->elem_bytes();
      for (int l = 0; l < cfg.n_layers; ++l)
        for (int kh = 0; kh < cfg.n_kv_heads; ++kh)
          cache.read_rows_raw(l, kh, j * B, B, kv->k_layer(l) + kh * head_bytes, kv->v_layer(l) + kh * head_bytes);
      send(keys[static_cast<size_t>(j)], std::move(kv));
    }
  };
  if (ctx->backend->host_accessible()) return copy(slot->cache);
  const bool queued = ctx->compute->submit([copy, slot] { copy(slot->cache); }, ComputeThread::Priority::Background);
  if (!queued) ctx->write_backs_refused.fetch_add(1);
}

}  // namespace bs
