// writer (one per tier that writes to a device: the SSD, and the remote tier's
// storage node): stores entries — the write-back (missed chunks, learnt passages,
// prefix blocks), demotions from RAM to the SSD, pushes to the storage node — apart
// from the tier's loader, so a load never waits behind a write, its fsync or its
// network transfer. Its queue is bounded in bytes (tiers.ssd.write_queue; the remote
// writer's queue has the same limit): senders go through enqueue_write(), which
// drops an entry that does not fit (counted; the tier is
// a cache and the chunk is recomputed on a later miss) instead of letting the mailbox
// pin unbounded chunk KV while the device is slow. Spawned detached: its writes block
// its own thread (the remote store's calls are bounded by its I/O timeout).
#include <caf/all.hpp>

#include "actors/runtime/actor_counters.h"
#include "actors/runtime/actors.h"

namespace bs {

bool enqueue_write(const WriterEnv& w, const writer_actor& writer, KeyedKv kk) {
  if (!writer || !kk.kv) return false;
  WriteQueue& q = *w.queue;
  const auto bytes = static_cast<int64_t>(kk.kv->bytes());
  // Reserve first, so two senders racing for the last room cannot both get it.
  if (q.bytes.fetch_add(bytes) + bytes > w.queue_limit) {
    q.bytes.fetch_sub(bytes);
    q.dropped.fetch_add(1);
    return false;
  }
  const int64_t now = q.bytes.load();
  int64_t high = q.high_water.load();
  while (now > high && !q.high_water.compare_exchange_weak(high, now)) {
  }
  caf::anon_send(writer, store_atom::value, std::move(kk));
  return true;
}

writer_actor::behavior_type writer(writer_actor::pointer self, WriterEnv env, CountersPtr c) {
  self->set_exception_handler(exit_on_exception(c->name));
  return {
      [=](store_atom, KeyedKv kk) {
        BusyScope busy(*c, self->mailbox().size());
        const auto bytes = kk.kv ? static_cast<int64_t>(kk.kv->bytes()) : int64_t{0};
        if (env.fault && *env.fault) (*env.fault)();  // tests: a slow or failing device
        // An I/O failure (a full disk, a storage node away) is a later miss; the
        // entry is not kept.
        if (env.store && kk.kv && !env.store->contains(kk.key)) env.store->put(kk.key, kk.kv);
        env.queue->bytes.fetch_sub(bytes);
        env.queue->written.fetch_add(1);
      },
      [=](flush_atom) -> bool {  // FIFO: every earlier store is done
        BusyScope busy(*c, self->mailbox().size());
        return true;
      },
  };
}

}  // namespace bs
