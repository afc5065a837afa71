// The typed interface of every actor (what it accepts, what it answers), in one
// header, so a wrong message is a compile error. Messages: actors/messages.h.
//
//   caller -> intake --plan--> controller --load--> loader (ram, ssd)
//                                   |                  | layer / loadend / loadfail
//                                   +----prefill---> layer worker --prefilled--> fusor --start--> decoder
//   decoder --decode--> worker --logits--> decoder ...      fusor --warm--> worker --kvready--> fusor --store--> ssd writer
//   caller (Runtime::store_document) --document--> worker: the KV of one document, computed alone
//   decoder --release--> intake (a slot is free: the next queued request starts); caller --cancel--> intake
//   every actor --register--> inspector; decoder --trace--> inspector
//   the runtime's supervisor monitors every actor and restarts one that died
#pragma once

#include <array>
#include <mutex>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/messages.h"

namespace bs {

using intake_actor = caf::typed_actor<caf::replies_to<submit_atom, RequestPtr>::with<uint64_t>,
                                      caf::reacts_to<release_atom>, caf::reacts_to<cancel_atom, uint64_t>>;

using controller_actor = caf::typed_actor<caf::reacts_to<plan_atom, RequestPtr>,
                                          caf::reacts_to<profile_atom, std::string, int64_t, double>,
                                          caf::replies_to<get_profile_atom>::with<std::string>>;

// load: stream a request's parts from this tier into its cache, layer by layer.
using loader_actor = caf::typed_actor<caf::reacts_to<load_atom, RequestPtr>>;

// One tier's writes, apart from its reads (a write never delays a load). store:
// write one entry; flush: answers once every store before it is written.
using writer_actor = caf::typed_actor<caf::reacts_to<store_atom, KeyedKv>, caf::replies_to<flush_atom>::with<bool>>;

using worker_actor = caf::typed_actor<caf::reacts_to<prefill_atom, RequestPtr>,
                                      caf::reacts_to<layer_atom, RequestPtr, int32_t>,
                                      caf::reacts_to<load_end_atom, RequestPtr, uint64_t>,
                                      caf::reacts_to<load_fail_atom, RequestPtr, std::string>,
                                      caf::reacts_to<stepped_atom, uint64_t>, caf::reacts_to<tick_atom>,
                                      caf::reacts_to<decode_atom, RequestPtr, int32_t>,
                                      caf::reacts_to<warm_atom, RequestPtr>,
                                      caf::replies_to<document_atom, std::vector<int32_t>>::with<KeyedKv>,
                                      caf::reacts_to<document_done_atom, DocumentKv>>;

// flush: answers once every store it forwarded before is written.
using fusor_actor = caf::typed_actor<caf::reacts_to<prefilled_atom, RequestPtr>, caf::reacts_to<kv_ready_atom, KeyedKv>,
                                     caf::replies_to<flush_atom>::with<bool>>;

using decoder_actor = caf::typed_actor<caf::reacts_to<start_atom, RequestPtr>, caf::reacts_to<logits_atom, RequestPtr>>;

using inspector_actor = caf::typed_actor<caf::reacts_to<register_atom, CountersPtr>, caf::reacts_to<trace_atom, std::string>,
                                         caf::replies_to<get_trace_atom, int32_t>::with<std::string>,
                                         caf::replies_to<actors_atom>::with<std::string>>;

// Monitors the actors it is told about; one that dies is handed to the runtime's
// restart hook (actors/actors.h: SupervisorHooks) and its successor is monitored.
using supervisor_actor = caf::typed_actor<caf::reacts_to<supervise_atom, caf::actor, std::string>>;

// The actors of one runtime. Loaders are indexed by their tier (Tier::Ram, Tier::Ssd);
// an invalid handle is a tier that is off.
struct ActorSet {
  intake_actor intake;
  controller_actor controller;
  std::array<loader_actor, kStoredTiers> loaders;
  writer_actor ssd_writer;  // invalid when the SSD tier is off
  worker_actor worker;
  fusor_actor fusor;
  decoder_actor decoder;
  inspector_actor inspector;
};

// The handles every actor may need. Filled after spawning; the supervisor replaces
// an actor that died with a new one (Runtime), so every read copies the handle
// under a lock and a send never sees a half-written handle.
class Handles {
 public:
  intake_actor intake() const { return read(&ActorSet::intake); }
  controller_actor controller() const { return read(&ActorSet::controller); }
  loader_actor loader(Tier t) const {
    std::lock_guard<std::mutex> lock(mu_);
    return set_.loaders[static_cast<size_t>(t)];
  }
  writer_actor ssd_writer() const { return read(&ActorSet::ssd_writer); }
  worker_actor worker() const { return read(&ActorSet::worker); }
  fusor_actor fusor() const { return read(&ActorSet::fusor); }
  decoder_actor decoder() const { return read(&ActorSet::decoder); }
  inspector_actor inspector() const { return read(&ActorSet::inspector); }
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
