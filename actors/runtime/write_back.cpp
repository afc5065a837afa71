// write-back: stores the chunks the worker computed alone for a request that
// missed them (in the compute thread's background, after the first token), and the
// prefix blocks of every prompt (automatic prefix caching: copied from the request's
// cache, actors/runtime/layer_worker.cpp store_prefix_blocks) — in
// RAM, through the SSD writer so they survive a restart, and through the remote
// writer to the storage node (tiers.remote.write_back) so other workers find
// them; the next request with these documents loads them, and so does a plain
// request that pastes their text (the pasted-chunk index learns them). Detached: a
// RAM put is a map insert on the CPU backends, but on a device backend it
// page-locks the entry first (MemoryKvStore's pinner, a driver call); the writes
// are the writers' (their queues are bounded: a full one drops the entry, counted).
// Documents stored and erased through the runtime (POST and DELETE /v1/documents)
// are written here too, so the tiers have one writer outside the background writers:
// a document's caller waits for its answer (which tiers hold it, whether the storage
// node took it), so its writes are made in the handler, not queued.
#include <caf/all.hpp>

#include "actors/runtime/actor_counters.h"
#include "actors/runtime/actors.h"

namespace bs {

write_back_actor::behavior_type write_back(write_back_actor::pointer self, WriteBackEnv env, HandlesRef h,
                                           CountersPtr c) {
  self->set_exception_handler(exit_on_exception(c->name));
  return {
      [=](kv_ready_atom, KeyedKv kk) {
        BusyScope busy(*c, self->mailbox().size());
        if (env.ram) env.ram->put(kk.key, kk.kv);
        // Plain requests that paste this chunk's text find it (a prefix block is only
        // ever the beginning of a prompt: not indexed).
        if (env.pasted && kk.kv && kk.pasted_passage) env.pasted->add(kk.kv->tokens);
        if (env.remote && env.config.remote.write_back) enqueue_write(env.remote_writes, h->remote_writer(), kk);
        if (env.ssd) enqueue_write(env.ssd_writes, h->ssd_writer(), std::move(kk));
      },
      [=](doc_write_atom, DocumentWrite w) -> DocumentWritten {
        BusyScope busy(*c, self->mailbox().size());
        DocumentWritten out;
        out.on_storage_node = w.on_storage_node;
        std::shared_ptr<const ChunkKv> kv = std::move(w.kv);
        if (env.remote && env.config.remote.write_back && !w.on_storage_node) {
          if (!kv) kv = env.tiered->get(w.key);  // held here only: the node gets this node's copy
          // Synchronous (bounded by the remote tier's I/O timeout): the caller learns
          // whether the cluster has the document, unlike write-back's best-effort queue.
          out.on_storage_node = kv && env.remote->put(w.key, kv);
        }
        if (!w.already_stored && kv) env.tiered->put(w.key, std::move(kv));
        for (const auto& t : env.tiers)
          if (t.store != env.remote && t.store->contains(w.key)) out.tiers.push_back(t.name);
        if (env.pasted && (!out.tiers.empty() || out.on_storage_node)) env.pasted->add(w.tokens);
        return out;
      },
      [=](doc_erase_atom, ChunkKey key) -> bool {
        BusyScope busy(*c, self->mailbox().size());
        const bool here = env.tiered->erase(key);
        const bool on_node = env.remote && env.remote->erase(key);
        return here || on_node;
      },
      [=](flush_atom) -> caf::result<bool> {
        BusyScope busy(*c, self->mailbox().size());
        // Each writer handles messages in order: its answer comes after every store
        // sent above. The remote writer's, then the SSD writer's.
        const writer_actor remote = env.remote ? h->remote_writer() : writer_actor{};
        if (!remote) {
          if (env.ssd) return self->delegate(h->ssd_writer(), flush_atom::value);
          return true;
        }
        auto done = self->make_response_promise<bool>();
        const auto bound = std::chrono::seconds(120);
        self->request(remote, bound, flush_atom::value)
            .then(
                [=](bool) mutable {
                  if (env.ssd)
                    done.delegate(h->ssd_writer(), flush_atom::value);
                  else
                    done.deliver(true);
                },
                [=](caf::error& e) mutable { done.deliver(std::move(e)); });
        return done;
      },
  };
}

}  // namespace bs
