// loader (a pool per stored tier): streams the KV of a plan's parts that come
// from its tier into the request's load target (actors/runtime/load_target.h: the cache
// the worker allocated and sent with the plan) one layer at a time, all parts of
// layer l before layer l+1, and tells the worker after each layer, so the worker
// computes layer l while this reads l+1. Tensor parallel, each layer is read once:
// rank 0's heads go into the target here, each follower's heads go to that rank's
// worker as a value (RankKv), which copies them into the rank's own cache and tells
// the worker; this loader never writes a follower's memory. Each part is opened here (the controller
// only looked); one that is gone or changed since, or a slice that fails its read
// or checksum (the SSD loader reads each layer slice with one pread, O_DIRECT when
// configured), fails the request's load as recoverable, naming the part (the worker
// then begins the prefill again with that part computed and the others loaded again
// by loaders: no store is ever read on the compute thread). Before each layer it
// looks at the gate: failed (a cancel, another loader's failure, a timeout) — then
// it stops reading. What a loader of a tier below RAM read is promoted into RAM.
// Writes go to the tier's writer (actors/runtime/writer.cpp), never here. Several loaders
// per tier: that many requests' loads proceed at once. Spawned detached: its reads
// block its own thread, not CAF's scheduler. An exception ends the actor; the
// runtime's supervisor fails the requests it held and starts a new one.
#include <algorithm>
#include <chrono>

#include <caf/all.hpp>

#include "actors/runtime/actor_counters.h"
#include "actors/runtime/actors.h"

namespace bs {
namespace {

using clock_type = std::chrono::steady_clock;

void load_request(loader_actor::pointer self, const LoaderEnv& env, const HandlesRef& h, TierId tier,
                  const RequestPlan& r, const LoadTargetPtr& target, kernels::Stream& copy_stream) {
  const uint64_t me = self->id();
  // Stored chunks hold every KV head, whatever the tensor-parallel degree; each of
  // the target's ranks gets rank_heads of them (a contiguous run of the layer).
  const auto& cfg = env.model->full_config();
  const int ranks = std::max(target->ranks, 1);
  const int rank_heads = cfg.n_kv_heads / ranks;
  const StoredTier& stored = env.tiers[static_cast<size_t>(tier)];
  const std::string actor = "loader-" + stored.name;
  const auto trace = env.traces.find(r.id);
  // The followers' workers, told when this loader is done with the request: nothing
  // more of it comes to them (they tell the worker, after what they were sent).
  std::vector<rank_worker_actor> followers;
  for (int k = 1; k < ranks; ++k) followers.push_back(h->rank_worker(k));
  auto end = [&] {
    for (const auto& f : followers)
      if (f) self->send(f, rank_load_end_atom::value, r.id, me);
    self->send(h->worker(), load_end_atom::value, r.id, me);
  };
  const bool promote = env.ram && stored.store != env.ram;
  struct Part {
    int32_t index;  // in the plan's parts
    int64_t offset, length;
    ChunkKey key;
    std::unique_ptr<LayerReader> reader;
    std::shared_ptr<ChunkKv> staged;  // below RAM: what was read, for promotion
  };
  std::vector<Part> parts;
  for (size_t i = 0; i < r.parts(); ++i) {
    if (r.part_tier(i) != tier) continue;
    const auto tokens = r.part_tokens(i);
    auto reader = stored.store->open_layers(r.part_key(i));
    if (!reader || !std::ranges::equal(reader->tokens(), tokens) || reader->n_layers() != cfg.n_layers ||
        reader->kv_heads() != cfg.n_kv_heads || reader->head_dim() != cfg.head_dim) {
      self->send(h->worker(), load_fail_atom::value, r.id, static_cast<int32_t>(i),
                 "chunk " + r.part_key(i).hex() + " is no longer in the " + stored.name + " tier");
      return end();
    }
    Part p{static_cast<int32_t>(i), r.part_offset(i), static_cast<int64_t>(tokens.size()), r.part_key(i), std::move(reader), nullptr};
    if (promote) {  // staged whole
      auto kv = std::make_shared<ChunkKv>();
      kv->tokens.assign(tokens.begin(), tokens.end());
      kv->n_layers = cfg.n_layers;
      kv->kv_heads = cfg.n_kv_heads;
      kv->head_dim = cfg.head_dim;
      kv->dtype = p.reader->dtype();
      kv->allocate();
      p.staged = std::move(kv);
    }
    parts.push_back(std::move(p));
  }

  // Without promotion one reusable slice buffer suffices.
  thread_local std::vector<std::byte> slice;
  int64_t bytes = 0;
  double busy = 0;
  bool failed = false, stopped = false;
  std::vector<RankKv> to_ranks(followers.size());
  for (int l = 0; l < cfg.n_layers && !failed; ++l) {
    if (target->gate.failed()) {
      // Nobody will compute this request's layers: stop reading.
      trace->add_event({actor, "load stopped", l, trace->now_s(), trace->now_s(), 0});
      stopped = true;
      break;
    }
    if (env.fault && *env.fault) (*env.fault)(stored.name, l);  // tests: a loader that throws here
    const auto t0 = clock_type::now();
    const double begin = trace->now_s();
    int64_t layer_bytes = 0;
    for (auto& out : to_ranks) out = RankKv{r.id, l, me, {}};
    for (auto& p : parts) {
      auto& reader = *p.reader;
      const std::byte* k = reader.k_view(l);
      const std::byte* v = reader.v_view(l);
      if (!k || !v) {
        std::byte *sk, *sv;
        if (p.staged) {
          sk = p.staged->k_layer(l);
          sv = p.staged->v_layer(l);
        } else {
          const size_t layer_bytes = static_cast<size_t>(reader.layer_bytes());
          if (slice.size() < 2 * layer_bytes) slice.resize(2 * layer_bytes);
          sk = slice.data();
          sv = slice.data() + layer_bytes;
        }
        if (!reader.read_layer(l, sk, sv)) {
          failed = true;
          self->send(h->worker(), load_fail_atom::value, r.id, p.index,
                     "chunk " + p.key.hex() + " layer " + std::to_string(l) + " failed its read or checksum");
          break;
        }
        k = sk;
        v = sv;
      }
      // Read once: rank 0's heads into its cache on this loader's copy stream, each
      // follower's heads (the next runs of the layer) copied out as a value.
      copy_chunk_layer(k, v, reader.dtype(), p.length, l, p.offset, target->cache, 0, &copy_stream);
      const size_t head_bytes = static_cast<size_t>(reader.layer_bytes()) / static_cast<size_t>(cfg.n_kv_heads);
      const size_t run = head_bytes * static_cast<size_t>(rank_heads);
      for (size_t f = 0; f < to_ranks.size(); ++f) {
        const size_t from = (f + 1) * run;
        const auto* kc = reinterpret_cast<const char*>(k) + from;
        const auto* vc = reinterpret_cast<const char*>(v) + from;
        to_ranks[f].parts.push_back(RankKvPart{p.offset, p.length, static_cast<int32_t>(reader.dtype()),
                                               std::vector<char>(kc, kc + run), std::vector<char>(vc, vc + run)});
      }
      layer_bytes += 2 * reader.layer_bytes();
    }
    if (failed) break;
    for (size_t f = 0; f < to_ranks.size(); ++f)
      if (followers[f]) self->send(followers[f], rank_kv_atom::value, std::move(to_ranks[f]));
    // The worker's compute waits for this event before layer l (on the device).
    auto copied = std::shared_ptr<kernels::Event>(env.backend->make_event());
    env.backend->record(*copied, &copy_stream);
    target->copied.add(l, copied);
    busy += std::chrono::duration<double>(clock_type::now() - t0).count();
    bytes += layer_bytes;
    trace->add_event({actor, "load", l, begin, trace->now_s(), layer_bytes});
    self->send(h->worker(), layer_atom::value, r.id, static_cast<int32_t>(l));
  }
  // The copies are done before the loader says so: once it has, the worker may give
  // the cache's pages to another request.
  {
    const auto drained = env.backend->make_event();
    env.backend->record(*drained, &copy_stream);
    env.backend->synchronize(*drained);
  }
  // The KV is in the request's cache now: release the pinned RAM entries (an
  // evicted one is freed now, not when the request ends) and the opened files.
  for (auto& p : parts) p.reader.reset();
  end();
  stored.load->bytes.fetch_add(bytes);
  stored.load->ns.fetch_add(static_cast<int64_t>(busy * 1e9));
  stored.load->loads.fetch_add(1);
  if (failed || stopped) return;
  self->send(h->controller(), profile_atom::value, stored.name, bytes, busy);
  // Promotion: the next request finds these chunks in RAM.
  if (promote)
    for (auto& p : parts) env.ram->put(p.key, std::move(p.staged));
}

}  // namespace

loader_actor::behavior_type loader(loader_actor::pointer self, LoaderEnv env, HandlesRef h, TierId tier,
                                   CountersPtr c) {
  self->set_exception_handler(exit_on_exception(c->name));
  // This loader's copies into device memory go on its own stream (kernels/device_memory.h).
  std::shared_ptr<kernels::Stream> copy_stream = env.backend->make_stream();
  return {
      [=](load_atom, const RequestPlan& r, const LoadTargetPtr& target) {
        BusyScope busy(*c, self->mailbox().size());
        load_request(self, env, h, tier, r, target, *copy_stream);
      },
  };
}

}  // namespace bs
