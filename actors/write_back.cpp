// write-back: stores the chunks the worker computed alone for a request that
// missed them (in the compute thread's background, after the first token) — in
// RAM, and through the SSD writer so they survive a restart; the next request
// with these documents loads them. It only passes messages: a RAM put is a map
// insert, and the SSD write is the writer's (its queue is bounded: a full one
// drops the entry, counted).
#include <caf/all.hpp>

#include "actors/actor_counters.h"
#include "actors/actors.h"

namespace bs {

write_back_actor::behavior_type write_back(write_back_actor::pointer self, RuntimeContext* ctx, HandlesRef h,
                                           CountersPtr c) {
  self->set_exception_handler(exit_on_exception(c->name));
  return {
      [=](kv_ready_atom, KeyedKv kk) {
        BusyScope busy(*c, self->mailbox().size());
        if (ctx->ram) ctx->ram->put(kk.key, kk.kv);
        if (ctx->ssd) enqueue_write(*ctx, h->ssd_writer(), std::move(kk));
      },
      [=](flush_atom) -> caf::result<bool> {
        BusyScope busy(*c, self->mailbox().size());
        // The SSD writer handles messages in order: its answer comes after every
        // store sent above.
        if (ctx->ssd) return self->delegate(h->ssd_writer(), flush_atom::value);
        return true;
      },
  };
}

}  // namespace bs
