// Every message the runtime's actors exchange, in one place: atoms name the
// messages, and the payload types are declared here. Requests travel as values:
// ids, RequestPlan, PrefillOutcome and DecodeStep (actors/runtime/plan.h), RankJob and
// RankKv (actors/runtime/rank_job.h) — each
// serializable through its inspect overload and registered with the actor system
// by add_runtime_message_types(), so a plan (and what a follower rank is sent) can
// cross nodes. Payloads that never leave rank 0's process are declared
// allowed-unsafe instead: KV buffers (KeyedKv, shared chunk KV on its way to a tier;
// the load target the worker hands its loaders), a prefill's compute state between the
// worker and its compute job (PrefillWorkPtr) and the inspector's counters. Typed
// interfaces: actors/runtime/interfaces.h.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_system_config.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/typed_response_promise.hpp>

#include "actors/runtime/actor_counters.h"
#include "actors/runtime/load_target.h"
#include "actors/runtime/plan.h"
#include "actors/runtime/rank_job.h"
#include "actors/runtime/request.h"
#include "storage/chunk_kv.h"

namespace bs {

// A prefill's compute state on its way between the layer worker and its step job on
// the compute thread (actors/runtime/layer_worker.cpp): one owner at a time.
struct PrefillWork;
using PrefillWorkPtr = std::shared_ptr<PrefillWork>;

// A chunk's KV with its key, for write-back and demotion.
struct KeyedKv {
  ChunkKey key;
  std::shared_ptr<const ChunkKv> kv;
  // A chunk, which plain requests that paste its text find (blend/pasted_chunks.h); a
  // prefix block is not a passage: only a prompt that begins with it uses it.
  bool pasted_passage = true;
};

// A document's KV computed for Runtime::store_document, sent by the compute job
// back to the worker, which answers the caller in its own context.
struct DocumentKv {
  caf::typed_response_promise<KeyedKv> reply;
  KeyedKv kv;         // kv.kv is null when the compute failed
  std::string error;  // why it failed
};

// A document to store (Runtime::store_document, to the write-back actor, which owns
// the writes of the tiers): its KV, computed or fetched by the caller (null: it is
// held here already), whether this node's tiers hold it already and whether the
// storage node does. The answer says where it is now.
struct DocumentWrite {
  ChunkKey key;
  std::shared_ptr<const ChunkKv> kv;
  std::vector<int32_t> tokens;  // for the pasted-passage index
  bool already_stored = false;
  bool on_storage_node = false;
};
struct DocumentWritten {
  std::vector<std::string> tiers;  // this node's tiers that hold it
  bool on_storage_node = false;
};

// intake
using submit_atom = caf::atom_constant<caf::atom("submit")>;      // (request id) -> request id: its record is in the RequestBook
using release_atom = caf::atom_constant<caf::atom("release")>;    // (request id): it ended; its slot and pages go back (intake)
using reconcile_atom = caf::atom_constant<caf::atom("reconcile")>;// (): a restarted intake rebuilds its slot and page ledger
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;      // (request id): intake: leaves the queue; worker: stops at a boundary
using expire_atom = caf::atom_constant<caf::atom("expire")>;      // (request id, stage): limits.max_request_seconds passed (intake to itself)
using resume_atom = caf::atom_constant<caf::atom("resume")>;      // (): a restart's admission pause is over (intake to itself)
// controller
using plan_atom = caf::atom_constant<caf::atom("plan")>;          // (RequestPlan): where each part comes from, at which ratio
using profile_atom = caf::atom_constant<caf::atom("profile")>;    // (source, units, seconds): bytes for a tier, row-layers for "compute"
using get_profile_atom = caf::atom_constant<caf::atom("getprof")>;// () -> profile JSON
// loaders and writers
using load_atom = caf::atom_constant<caf::atom("load")>;          // (RequestPlan, LoadTargetPtr): stream this tier's parts into the target
using store_atom = caf::atom_constant<caf::atom("store")>;        // (KeyedKv): write to this tier
using flush_atom = caf::atom_constant<caf::atom("flush")>;        // () -> true once earlier stores are done
// layer worker
using prefill_atom = caf::atom_constant<caf::atom("prefill")>;    // (RequestPlan): run it
using layer_atom = caf::atom_constant<caf::atom("layer")>;        // (request id, layer): one loader delivered a layer
using load_end_atom = caf::atom_constant<caf::atom("loadend")>;   // (request id, loader id): that loader is done with the request
using load_fail_atom = caf::atom_constant<caf::atom("loadfail")>; // (request id, part, why): a stored entry failed its read
using loader_down_atom = caf::atom_constant<caf::atom("loaderdn")>;// (loader id, why): it died; its loads will not come (supervisor -> worker)
using rank_down_atom = caf::atom_constant<caf::atom("rankdn")>;   // (rank, why): its rank worker died with its loads (supervisor -> worker)
using stepped_atom = caf::atom_constant<caf::atom("stepped")>;    // (request id, PrefillWorkPtr): a prefill's step job ended; its work back
using tick_atom = caf::atom_constant<caf::atom("tick")>;          // (): look at parked and stopping prefills
using decode_atom = caf::atom_constant<caf::atom("decode")>;      // (request id, DecodeAsk): one decode step
using end_atom = caf::atom_constant<caf::atom("end")>;            // (request id): the request ended, its cache is freed
using document_atom = caf::atom_constant<caf::atom("document")>;  // (tokens) -> KeyedKv: a document's KV computed alone
using document_done_atom = caf::atom_constant<caf::atom("docdone")>; // (DocumentKv): that compute ended
// rank worker (tensor parallel)
using rank_job_atom = caf::atom_constant<caf::atom("rankjob")>; // (RankJob): run it on this rank, in the order sent
using rank_open_atom = caf::atom_constant<caf::atom("rankopen")>; // (request id, capacity): a cache for its loads on this rank
using rank_opened_atom = caf::atom_constant<caf::atom("rankok")>; // (request id, rank, ok): it has one (false: no pages free yet)
using rank_kv_atom = caf::atom_constant<caf::atom("rankkv")>;     // (RankKv): one layer of this rank's heads, from a loader
using rank_load_end_atom = caf::atom_constant<caf::atom("rankend")>; // loader -> rank: (request id, loader id); rank -> worker: (.., rank)
// write-back
using kv_ready_atom = caf::atom_constant<caf::atom("kvready")>;   // (KeyedKv): a chunk computed for write-back
using doc_write_atom = caf::atom_constant<caf::atom("docwrite")>; // (DocumentWrite) -> DocumentWritten: store a document
using doc_erase_atom = caf::atom_constant<caf::atom("docerase")>; // (ChunkKey) -> bool: erase it here and on the storage node
// decoder
using start_atom = caf::atom_constant<caf::atom("start")>;        // (PrefillOutcome): decode from the prefill's logits (or fail)
using logits_atom = caf::atom_constant<caf::atom("logits")>;      // (request id, DecodeStep): one step's logits
using finish_atom = caf::atom_constant<caf::atom("finish")>;      // (request id): it never ran (cancelled in the queue): finish it
// supervisor
using supervise_atom = caf::atom_constant<caf::atom("supervise")>; // (actor, name): monitor it, restart it when it dies
using fail_atom = caf::atom_constant<caf::atom("fail")>;            // (request id, why): end it with this error now (to the supervisor)
// inspector
using register_atom = caf::atom_constant<caf::atom("register")>;  // (CountersPtr)
using trace_atom = caf::atom_constant<caf::atom("trace")>;        // (trace JSON)
using get_trace_atom = caf::atom_constant<caf::atom("gettrace")>; // (n) -> JSON array of the last n traces
using actors_atom = caf::atom_constant<caf::atom("actors")>;      // () -> JSON table of actors

// Errors at the actor boundary: caf::error in this category, code = RequestErrc.
inline caf::atom_value runtime_error_category() { return caf::atom("blendserve"); }
inline caf::error make_runtime_error(RequestErrc code, std::string message) {
  return caf::error(static_cast<uint8_t>(code), runtime_error_category(), caf::make_message(std::move(message)));
}

// The serializable payloads, under the names other nodes know them by.
inline void add_runtime_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<RequestPlan>("bs::RequestPlan");
  cfg.add_message_type<PrefillOutcome>("bs::PrefillOutcome");
  cfg.add_message_type<DecodeStep>("bs::DecodeStep");
  cfg.add_message_type<DecodeAsk>("bs::DecodeAsk");
  cfg.add_message_type<RankJob>("bs::RankJob");
  cfg.add_message_type<RankKv>("bs::RankKv");
}

}  // namespace bs

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(bs::KeyedKv)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(bs::DocumentKv)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(bs::DocumentWrite)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(bs::DocumentWritten)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(bs::CountersPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(bs::LoadTargetPtr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(bs::PrefillWorkPtr)
