// loader (one per tier): streams the KV of a request's chunks from its tier into
// the request's cache one layer at a time, all chunks of layer l before layer
// l+1, and tells the worker after each layer, so the worker computes layer l
// while this reads l+1. The SSD loader reads each layer slice with one pread
// (O_DIRECT when configured) and verifies its checksum; a failed slice fails the
// request's load as recoverable (the worker then redoes the prefill from whole
// entries, where the bad file is a miss). Before each layer it looks at the
// request: cancelled, or its gate failed (another loader's failure, a timeout) —
// then it stops reading. What the SSD loader read is promoted into RAM. Writes go
// to the tier's writer (actors/writer.cpp), never here. Spawned detached: its
// reads block its own thread, not CAF's scheduler. An exception ends the actor;
// the runtime's supervisor fails the requests it held and starts a new one.
#include <chrono>

#include <caf/all.hpp>

#include "actors/actor_counters.h"
#include "actors/actors.h"

namespace bs {
namespace {

using clock_type = std::chrono::steady_clock;

void load_request(loader_actor::pointer self, RuntimeContext* ctx, const HandlesRef& h, Tier tier, const RequestPtr& r) {
  const uint64_t me = self->id();
  const auto& cfg = ctx->model->config();
  const size_t nchunks = r->prompt.chunks.size();
  struct Part {
    size_t index;  // chunk index, or nchunks for the prefix
    int64_t offset, length;
    ChunkKey key;
    std::shared_ptr<ChunkKv> staged;  // SSD: what was read, for promotion to RAM
  };
  std::vector<Part> parts;
  auto add = [&](size_t i, Tier t, int64_t offset, const std::vector<int32_t>& tokens, const ChunkKey& key) {
    if (t != tier) return;
    Part p{i, offset, static_cast<int64_t>(tokens.size()), key, nullptr};
    if (tier != Tier::Ram && ctx->ram) {  // staged whole, for promotion
      auto kv = std::make_shared<ChunkKv>();
      kv->tokens = tokens;
      kv->n_layers = cfg.n_layers;
      kv->kv_heads = cfg.n_kv_heads;
      kv->head_dim = cfg.head_dim;
      kv->k.resize(static_cast<size_t>(cfg.n_layers) * kv->layer_stride());
      kv->v.resize(kv->k.size());
      p.staged = std::move(kv);
    }
    parts.push_back(std::move(p));
  };
  if (r->plan.prefix_loaded) add(nchunks, r->prefix_tier, 0, r->prompt.prefix, r->prefix_key);
  for (size_t i = 0; i < nchunks; ++i)
    add(i, r->chunk_tier[i], r->prompt.chunk_offset(i), r->prompt.chunks[i], r->chunk_keys[i]);

  const std::string actor = std::string("loader-") + tier_name(tier);
  // Without a RAM tier nothing is promoted: one reusable slice buffer suffices.
  thread_local std::vector<float> slice;
  int64_t bytes = 0;
  double busy = 0;
  bool failed = false, stopped = false;
  for (int l = 0; l < cfg.n_layers && !failed; ++l) {
    if (r->cancelled.load() || r->gate.failed()) {
      // Nobody will compute this request's layers: stop reading.
      r->add_event({actor, "load stopped", l, r->now_s(), r->now_s(), 0});
      stopped = true;
      break;
    }
    if (ctx->loader_fault) ctx->loader_fault(tier, l);  // tests: a loader that throws here
    const auto t0 = clock_type::now();
    const double begin = r->now_s();
    int64_t layer_bytes = 0;
    for (auto& p : parts) {
      auto& reader = *r->readers[p.index];
      const float* k = reader.k_view(l);
      const float* v = reader.v_view(l);
      if (!k || !v) {
        float *sk, *sv;
        if (p.staged) {
          sk = p.staged->k.data() + l * p.staged->layer_stride();
          sv = p.staged->v.data() + l * p.staged->layer_stride();
        } else {
          const size_t floats = static_cast<size_t>(reader.layer_floats());
          if (slice.size() < 2 * floats) slice.resize(2 * floats);
          sk = slice.data();
          sv = slice.data() + floats;
        }
        if (!reader.read_layer(l, sk, sv)) {
          failed = true;
          self->send(h->worker(), load_fail_atom::value, r,
                     "chunk " + p.key.hex() + " layer " + std::to_string(l) + " failed its read or checksum");
          break;
        }
        k = sk;
        v = sv;
      }
      copy_chunk_layer(k, v, p.length, l, p.offset, r->cache);
      layer_bytes += 2 * p.length * cfg.kv_dim() * static_cast<int64_t>(sizeof(float));
    }
    if (failed) break;
    busy += std::chrono::duration<double>(clock_type::now() - t0).count();
    bytes += layer_bytes;
    r->add_event({actor, "load", l, begin, r->now_s(), layer_bytes});
    self->send(h->worker(), layer_atom::value, r, static_cast<int32_t>(l));
  }
  // The KV is in the request's cache now: release the pinned RAM entries (an
  // evicted one is freed now, not when the request ends) and the opened files.
  for (auto& p : parts) r->readers[p.index].reset();
  self->send(h->worker(), load_end_atom::value, r, me);
  if (failed || stopped) return;
  self->send(h->controller(), profile_atom::value, std::string(tier_name(tier)), bytes, busy);
  // Promotion: the next request finds these chunks in RAM.
  if (tier != Tier::Ram && ctx->ram)
    for (auto& p : parts)
      if (p.staged) ctx->ram->put(p.key, std::move(p.staged));
}

}  // namespace

loader_actor::behavior_type loader(loader_actor::pointer self, RuntimeContext* ctx, HandlesRef h, Tier tier,
                                   CountersPtr c) {
  self->set_exception_handler(exit_on_exception(c->name));
  return {
      [=](load_atom, RequestPtr r) {
        BusyScope busy(*c, self->mailbox().size());
        load_request(self, ctx, h, tier, r);
      },
  };
}

}  // namespace bs
