// rank worker (one per tensor-parallel follower rank, actors/runtime/tp_ranks.h): the rank's
// side of every request's load and the door to its compute thread.
//
// It owns the rank's load targets (RankTarget, actors/runtime/load_target.h): rank 0's worker
// opens one per prefill (a cache from this rank's own KV page pool; the answer says
// whether the pages were there), the loaders send this rank's KV heads of each layer
// as values (RankKv), and it copies them into the cache on the rank's copy stream,
// records the rank's event and tells rank 0's worker the layer is delivered here.
// Nothing outside the rank writes its caches.
//
// It takes the jobs rank 0 sends, in rank 0's order, and runs each on the rank's
// compute thread, which owns the rank's requests once prefilled (caches, prefill
// state); a prefill job is given the request's target. It decides nothing: what runs,
// and every choice inside a job, is rank 0's. An End drops the target (a load value
// that comes after it finds none and is dropped). Spawned detached: a copy to a
// device may block its thread, never CAF's scheduler.
#include <caf/all.hpp>

#include "actors/runtime/actor_counters.h"
#include "actors/runtime/actors.h"

namespace bs {

namespace {

struct RankWorkerState {
  std::unordered_map<uint64_t, RankTargetPtr> targets;
  std::shared_ptr<kernels::Stream> copy_stream;
};

}  // namespace

rank_worker_actor::behavior_type rank_worker(rank_worker_actor::pointer self, TpRanks* tp, HandlesRef h,
                                             int rank, CountersPtr c) {
  self->set_exception_handler(exit_on_exception(c->name));
  auto st = std::make_shared<RankWorkerState>();
  RankFollower& me = tp->follower(rank);
  st->copy_stream = me.backend().make_stream();
  return {
      [=, &me](rank_job_atom, RankJob& job) {
        BusyScope busy(*c, self->mailbox().size());
        RankTargetPtr target;
        if (auto it = st->targets.find(job.id); it != st->targets.end()) {
          target = it->second;
          // The request's cache leaves this table at its End (the compute thread keeps
          // its own reference for as long as it needs it).
          if (job.kind == RankJob::End) st->targets.erase(it);
        }
        // Shutting down: the job will not run (rank 0 stopped computing too).
        if (!me.compute().submit([&me, job = std::move(job), target] { me.execute(job, target); }))
          tp->job_done(rank);
      },
      [=, &me](rank_open_atom, uint64_t id, int64_t capacity) {
        BusyScope busy(*c, self->mailbox().size());
        bool ok = st->targets.count(id) > 0;
        if (!ok) {
          // The pages of ended requests may still be going back on this rank (their
          // End runs on the compute thread): rank 0 asks again.
          auto cache = me.kv_pool().try_make_cache(capacity);
          if (cache) {
            auto t = std::make_shared<RankTarget>();
            t->cache = std::move(*cache);
            st->targets.emplace(id, std::move(t));
            ok = true;
          }
        }
        self->send(h->worker(), rank_opened_atom::value, id, static_cast<int32_t>(rank), ok);
      },
      [=, &me](rank_kv_atom, const RankKv& kv) {
        BusyScope busy(*c, self->mailbox().size());
        auto it = st->targets.find(kv.id);
        if (it == st->targets.end()) return;  // the request ended: nobody computes this layer here
        RankTarget& t = *it->second;
        for (const auto& p : kv.parts) {
          const auto dtype = static_cast<kernels::TensorType>(p.dtype);
          const size_t want = static_cast<size_t>(t.cache.kv_heads) * static_cast<size_t>(p.length) *
                              static_cast<size_t>(t.cache.head_dim) * kernels::kv_dtype_bytes(dtype);
          if (p.k.size() != want || p.v.size() != want)
            throw std::invalid_argument("rank " + std::to_string(rank) + ": a load of " + std::to_string(p.k.size()) +
                                        " bytes for " + std::to_string(want));
          copy_chunk_layer(reinterpret_cast<const std::byte*>(p.k.data()),
                           reinterpret_cast<const std::byte*>(p.v.data()), dtype, p.length, kv.layer, p.offset,
                           t.cache, 0, st->copy_stream.get());
        }
        // This rank's compute waits for the event before the layer; the bytes of the
        // message are done with once it completed (a host backend: at once).
        auto copied = std::shared_ptr<kernels::Event>(me.backend().make_event());
        me.backend().record(*copied, st->copy_stream.get());
        me.backend().synchronize(*copied);
        t.copied.add(kv.layer, copied);
        self->send(h->worker(), layer_atom::value, kv.id, kv.layer);
      },
      [=](rank_load_end_atom, uint64_t id, uint64_t loader) {
        BusyScope busy(*c, self->mailbox().size());
        // After every value the loader sent (one sender: in order): no more writes from it.
        self->send(h->worker(), rank_load_end_atom::value, id, loader, static_cast<int32_t>(rank));
      },
  };
}

}  // namespace bs
