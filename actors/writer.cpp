// writer (one per tier that writes to a device: the SSD): stores entries — the
// write-back of missed chunks, demotions from RAM — apart from the tier's loader,
// so a load never waits behind a write and its fsync. Its queue is bounded in bytes
// (tiers.ssd.write_queue): senders go through enqueue_write(), which drops an entry
// that does not fit (counted; the tier is a cache and the chunk is recomputed on a
// later miss) instead of letting the mailbox pin unbounded chunk KV while the disk
// is slow. Spawned detached: its writes block its own thread.
#include <caf/all.hpp>

#include "actors/actor_counters.h"
#include "actors/actors.h"

namespace bs {

bool enqueue_write(RuntimeContext& ctx, const writer_actor& writer, KeyedKv kk) {
  if (!writer || !kk.kv) return false;
  auto& q = ctx.ssd_write_queue;
  const auto bytes = static_cast<int64_t>(kk.kv->bytes());
  // Reserve first, so two senders racing for the last room cannot both get it.
  if (q.bytes.fetch_add(bytes) + bytes > ctx.config.ssd.write_queue_bytes) {
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

writer_actor::behavior_type writer(writer_actor::pointer self, RuntimeContext* ctx, CountersPtr c) {
  self->set_exception_handler(exit_on_exception(c->name));
  return {
      [=](store_atom, KeyedKv kk) {
        BusyScope busy(*c, self->mailbox().size());
        const auto bytes = kk.kv ? static_cast<int64_t>(kk.kv->bytes()) : int64_t{0};
        if (ctx->writer_fault) ctx->writer_fault();  // tests: a slow or failing disk
        // An I/O failure (a full disk) is a later miss; the entry is not kept.
        if (ctx->ssd && kk.kv && !ctx->ssd->contains(kk.key)) ctx->ssd->put(kk.key, kk.kv);
        ctx->ssd_write_queue.bytes.fetch_sub(bytes);
        ctx->ssd_write_queue.written.fetch_add(1);
      },
      [=](flush_atom) -> bool {  // FIFO: every earlier store is done
        BusyScope busy(*c, self->mailbox().size());
        return true;
      },
  };
}

}  // namespace bs
