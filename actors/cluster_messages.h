// What crosses the cluster's control plane (CAF's network layer, libcaf_io's
// middleman): a member's report, asked for by the frontend on every heartbeat, and
// the proof of the cluster secret every such request carries. Values only, each
// serializable through its inspect overload and registered by
// add_cluster_message_types(); chunk KV never travels here (the data plane is
// storage/storage_server.h, Boost.Asio).
//
// Why a proof per request: CAF 0.17's BASP connections are neither encrypted nor
// authenticated, and any peer that reaches the control port can send messages to
// the published actor. The member answers nothing without a fresh HMAC of the
// secret (SHA-256, constant-time compare, at most kProofMaxAge old). That keeps
// the reports (which documents a worker holds) from strangers; it does not stop a
// peer from sending bytes for CAF to deserialize, nor a replay of a seen proof
// within its age: bind the control port to a private address (README "Cluster").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>

#include "actors/cluster_secret.h"

namespace bs {

// (node_report_atom, from, unix_ms, proof) -> NodeReport
using node_report_atom = caf::atom_constant<caf::atom("ndreport")>;
using control_tick_atom = caf::atom_constant<caf::atom("ctltick")>;
using control_connect_atom = caf::atom_constant<caf::atom("ctlconn")>;

// One member's state as the frontend routes by it.
struct NodeReport {
  std::string node;  // the member's name in the cluster config
  std::string role;  // "worker" | "storage"
  // worker: admission (what queue-depth tie breaking and overload use)
  int64_t in_flight = 0, queued = 0, max_requests = 0, max_queue = 0;
  // worker: what its chunk keys are made of (model fingerprint and chunk prelude
  // tokens), so the frontend computes a request's keys as this worker would
  uint64_t fingerprint = 0;
  std::vector<int32_t> prelude;
  // worker: the chunk keys its RAM and SSD tiers hold, as a KeyBloom (words, probes)
  std::vector<uint64_t> bloom_words;
  int32_t bloom_probes = 0;
  int64_t chunks_held = 0;
  // storage: its SSD tier
  int64_t store_bytes = 0, store_entries = 0, store_budget = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, NodeReport& x) {
  return f(caf::meta::type_name("bs::NodeReport"), x.node, x.role, x.in_flight, x.queued, x.max_requests, x.max_queue,
           x.fingerprint, x.prelude, x.bloom_words, x.bloom_probes, x.chunks_held, x.store_bytes, x.store_entries,
           x.store_budget);
}

inline void add_cluster_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<NodeReport>("bs::NodeReport");
}

}  // namespace bs
