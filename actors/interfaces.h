// The typed interface of every actor (what it accepts, what it answers), in one
// header, so a wrong message is a compile error. Messages: actors/messages.h.
//
//   caller -> intake --plan--> controller --load--> loader (ram, ssd)
//                                   |                  | layer / loadend / loadfail
//                                   +----prefill---> layer worker --prefilled--> fusor --start--> decoder
//   decoder --decode--> worker --logits--> decoder ...      fusor --warm--> worker --kvready--> fusor --store--> ssd loader
//   caller (Runtime::store_document) --document--> worker: the KV of one document, computed alone
//   decoder --release--> intake (a slot is free: the next queued request starts); caller --cancel--> intake
//   every actor --register--> inspector; decoder --trace--> inspector
#pragma once

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "actors/messages.h"

namespace bs {

using intake_actor = caf::typed_actor<caf::replies_to<submit_atom, RequestPtr>::with<uint64_t>,
                                      caf::reacts_to<release_atom>, caf::reacts_to<cancel_atom, uint64_t>>;

using controller_actor = caf::typed_actor<caf::reacts_to<plan_atom, RequestPtr>,
                                          caf::reacts_to<profile_atom, std::string, int64_t, double>,
                                          caf::replies_to<get_profile_atom>::with<std::string>>;

using loader_actor = caf::typed_actor<caf::reacts_to<load_atom, RequestPtr>, caf::reacts_to<store_atom, KeyedKv>,
                                      caf::replies_to<flush_atom>::with<bool>>;

using worker_actor = caf::typed_actor<caf::reacts_to<prefill_atom, RequestPtr>,
                                      caf::reacts_to<layer_atom, RequestPtr, int32_t>,
                                      caf::reacts_to<load_end_atom, RequestPtr>,
                                      caf::reacts_to<load_fail_atom, RequestPtr, std::string>,
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

// The handles every actor may need, filled once after all are spawned and before
// the first request (so reads in handlers need no lock).
struct Handles {
  intake_actor intake;
  controller_actor controller;
  loader_actor ram_loader, ssd_loader;  // ssd_loader is invalid when the tier is off
  worker_actor worker;
  fusor_actor fusor;
  decoder_actor decoder;
  inspector_actor inspector;
};
using HandlesPtr = std::shared_ptr<const Handles>;

}  // namespace bs
