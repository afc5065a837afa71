// fusor: the worker fuses recomputed KV into the loaded KV in place, layer by
// layer (the fused cache is the prefill's result); the fusor takes it from
// there: hands it to the decoder, then has the chunks that missed computed
// alone and stores them (RAM, and the SSD writer so they survive a restart). That
// write-back is queued after the first token and runs in the compute thread's
// background, so it never delays a first token. (It fuses nothing itself: the
// name follows DESIGN.md's actor table; the stepping engine of issue 17 moves the
// fusion of loaded and recomputed KV into it.)
#include <caf/all.hpp>

#include "actors/actor_counters.h"
#include "actors/actors.h"

namespace bs {

fusor_actor::behavior_type fusor(fusor_actor::pointer self, RuntimeContext* ctx, HandlesRef h, CountersPtr c) {
  self->set_exception_handler(exit_on_exception(c->name));
  return {
      [=](prefilled_atom, RequestPtr r) {
        BusyScope busy(*c, self->mailbox().size());
        const double t = r->now_s();
        r->add_event({"fusor", "fused cache to decoder", -1, t, t, 0});
        self->send(h->decoder(), start_atom::value, r);
        if (ctx->config.write_back && r->prefill_error.empty() && !r->cancelled.load())
          self->send(h->worker(), warm_atom::value, r);
      },
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
