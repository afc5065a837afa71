// The typed interface of every actor (what it accepts, what it answers), in one
// header, so a wrong message is a compile error. Messages: actors/runtime/messages.h.
//
//   caller -> intake --plan(RequestPlan)--> controller --prefill(RequestPlan)--> layer worker
//   layer worker --load(RequestPlan, target)--> loaders (per tier, a pool) --layer / loadend / loadfail (id)--> layer worker
//   tensor parallel: layer worker --rankopen--> rank workers --rankok--> layer worker (then the loaders are sent);
//     loaders --rankkv(RankKv) / rankend--> rank workers (each its heads, as values) --layer / rankend--> layer worker
//   layer worker --start(PrefillOutcome)--> decoder --decode(id, token)--> worker --logits(id, ...)--> decoder ...
//   decoder --end(id)--> worker (the cache is freed); decoder --release--> intake (the next queued request starts)
//   worker: missed chunks and learnt passages computed alone (background), prefix blocks copied from the cache
//     --kvready--> write-back (RAM put) --store--> ssd writer, and --store--> remote writer
//     (tiers.remote.write_back); RAM evictions --store--> ssd writer (demotion)
//   caller (Runtime::store_document) --document--> worker: the KV of one document, computed alone
//   caller --cancel(id)--> intake (queued: --finish(id)--> decoder) and worker (running: stops at a boundary)
//   tensor parallel: rank 0's compute thread --rankjob(RankJob)--> rank workers (ranks 1..), in its order
//   every actor --register--> inspector; decoder --trace--> inspector
//   the runtime's supervisor monitors every actor and restarts one that died
#pragma once

#include <vector>
#include <mutex>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/runtime/messages.h"

namespace bs {

using intake_actor = caf::typed_actor<caf::replies_to<submit_atom, uint64_t>::with<uint64_t>,
                                      caf::reacts_to<release_atom, uint64_t>, caf::reacts_to<reconcile_atom>,
                                      caf::reacts_to<cancel_atom, uint64_t>,
                                      caf::reacts_to<expire_atom, uint64_t, int32_t>, caf::reacts_to<resume_atom>>;

using controller_actor = caf::typed_actor<caf::reacts_to<plan_atom, RequestPlan>,
                                          caf::reacts_to<profile_atom, std::string, int64_t, double>,
                                          caf::replies_to<get_profile_atom>::with<std::string>>;

// load: stream the plan's parts of this loader's tier into the request's load
// target, layer by layer.
using loader_actor = caf::typed_actor<caf::reacts_to<load_atom, RequestPlan, LoadTargetPtr>>;

// One tier's writes, apart from its reads (a write never delays a load). store:
// write one entry; flush: answers once every store before it is written.
using writer_actor = caf::typed_actor<caf::reacts_to<store_atom, KeyedKv>, caf::replies_to<flush_atom>::with<bool>>;

using worker_actor = caf::typed_actor<caf::reacts_to<prefill_atom, RequestPlan>,
                                      caf::reacts_to<layer_atom, uint64_t, int32_t>,
                                      caf::reacts_to<load_end_atom, uint64_t, uint64_t>,
                                      caf::reacts_to<load_fail_atom, uint64_t, int32_t, std::string>,
                                      caf::reacts_to<rank_opened_atom, uint64_t, int32_t, bool>,
                                      caf::reacts_to<rank_load_end_atom, uint64_t, uint64_t, int32_t>,
                                      caf::reacts_to<loader_down_atom, uint64_t, std::string>,
                                      caf::reacts_to<rank_down_atom, int32_t, std::string>,
                                      caf::reacts_to<stepped_atom, uint64_t, PrefillWorkPtr>, caf::reacts_to<tick_atom>,
                                      caf::reacts_to<cancel_atom, uint64_t>,
                                      caf::reacts_to<decode_atom, uint64_t, DecodeAsk>,
                                      caf::reacts_to<end_atom, uint64_t>,
                                      caf::replies_to<document_atom, std::vector<int32_t>>::with<KeyedKv>,
                                      caf::reacts_to<document_done_atom, DocumentKv>>;

// A tensor-parallel follower rank's jobs, from rank 0 (actors/runtime/tp_ranks.h), and its
// load targets: opened by rank 0's worker, filled by the loaders' values.
using rank_worker_actor =
    caf::typed_actor<caf::reacts_to<rank_job_atom, RankJob>, caf::reacts_to<rank_open_atom, uint64_t, int64_t>,
                     caf::reacts_to<rank_kv_atom, RankKv>, caf::reacts_to<rank_load_end_atom, uint64_t, uint64_t>>;

// Stores what the worker sends for write-back (chunks, learnt passages, prefix blocks)
// in the tiers: RAM itself, the SSD through the SSD writer, the storage node through
// the remote writer (tiers.remote.write_back).
// flush: answers once every store it forwarded before is written (the remote
// writer's, then the SSD writer's).
using write_back_actor =
    caf::typed_actor<caf::reacts_to<kv_ready_atom, KeyedKv>, caf::replies_to<flush_atom>::with<bool>,
                     caf::replies_to<doc_write_atom, DocumentWrite>::with<DocumentWritten>,
                     caf::replies_to<doc_erase_atom, ChunkKey>::with<bool>>;

using decoder_actor = caf::typed_actor<caf::reacts_to<start_atom, PrefillOutcome>,
                                       caf::reacts_to<logits_atom, uint64_t, DecodeStep>,
                                       caf::reacts_to<finish_atom, uint64_t>>;

using inspector_actor = caf::typed_actor<caf::reacts_to<register_atom, CountersPtr>, caf::reacts_to<trace_atom, std::string>,
                                         caf::replies_to<get_trace_atom, int32_t>::with<std::string>,
                                         caf::replies_to<actors_atom>::with<std::string>>;

// Monitors the actors it is told about; one that dies is handed to the runtime's
// restart hook (actors/runtime/actors.h: SupervisorHooks) and its successor is monitored.
// fail: a request ended with an error however far it got (the intake's last resort
// for one that did not stop at its deadline), by the same policy code as a death's.
using supervisor_actor = caf::typed_actor<caf::reacts_to<supervise_atom, caf::actor, std::string>,
                                          caf::reacts_to<fail_atom, uint64_t, std::string>>;

// The actors of one runtime. loaders[tier] is the tier's pool (TierId order of
// RuntimeContext::tiers).
struct ActorSet {
  intake_actor intake;
  controller_actor controller;
  std::vector<std::vector<loader_actor>> loaders;
  writer_actor ssd_writer;  // invalid when the SSD tier is off
  writer_actor remote_writer;  // invalid unless the remote tier is on with write_back
  worker_actor worker;
  std::vector<rank_worker_actor> rank_workers;  // [rank - 1]; empty at tp 1
  write_back_actor write_back;
  decoder_actor decoder;
  inspector_actor inspector;
  supervisor_actor supervisor;  // never restarted: set once, after the others
};

// The handles every actor may need. Filled after spawning; the supervisor replaces
// an actor that died with a new one (Runtime), so every read copies the handle
// under a lock and a send never sees a half-written handle.
class Handles {
 public:
  intake_actor intake() const { return read(&ActorSet::intake); }
  controller_actor controller() const { return read(&ActorSet::controller); }
  // The pool of tier t (empty for a tier without loaders).
  std::vector<loader_actor> loaders(TierId t) const {
    std::lock_guard<std::mutex> lock(mu_);
    return t >= 0 && static_cast<size_t>(t) < set_.loaders.size() ? set_.loaders[static_cast<size_t>(t)]
                                                                  : std::vector<loader_actor>{};
  }
  writer_actor ssd_writer() const { return read(&ActorSet::ssd_writer); }
  writer_actor remote_writer() const { return read(&ActorSet::remote_writer); }
  worker_actor worker() const { return read(&ActorSet::worker); }
  rank_worker_actor rank_worker(int rank) const {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t i = static_cast<size_t>(rank - 1);
    return rank >= 1 && i < set_.rank_workers.size() ? set_.rank_workers[i] : rank_worker_actor{};
  }
  write_back_actor write_back() const { return read(&ActorSet::write_back); }
  decoder_actor decoder() const { return read(&ActorSet::decoder); }
  inspector_actor inspector() const { return read(&ActorSet::inspector); }
  supervisor_actor supervisor() const { return read(&ActorSet::supervisor); }
  ActorSet all() const {
    std::lock_guard<std::mutex> lock(mu_);
    return set_;
  }
  // Changes handles under the lock (spawning, a restart, shutdown).
  template <class F>
  void update(F&& f) {
    std::lock_guard<std::mutex> lock(mu_);
    f(set_);
  }

 private:
  template <class T>
  T read(T ActorSet::*field) const {
    std::lock_guard<std::mutex> lock(mu_);
    return set_.*field;
  }
  mutable std::mutex mu_;
  ActorSet set_;
};

}  // namespace bs
