// What crosses the cluster's control plane: the frontend's request, asked of every
// member once per heartbeat, and the member's report. The link is ours
// (storage/framed_link.h: TLS 1.3 with mutual authentication under the cluster CA,
// or plaintext where the cluster file says so) and the messages are JSON
// (actors/cluster/control_wire.h); chunk KV never travels here (the data plane is
// storage/storage_server.h). Every request also carries a proof of the cluster
// secret bound to its sender, its receiver and its time (actors/config/cluster_secret.h),
// so that a plaintext cluster still answers nobody without the secret.
//
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "actors/config/cluster_secret.h"
#include "actors/cluster/holdings.h"

namespace bs {

// The frontend's request: who asks (`from`), whom (`to`), when, the proof, and the
// holdings it already has of that member (HoldingsDelta: epoch 0 = none).
struct ControlRequest {
  std::string from, to;
  int64_t unix_ms = 0;
  std::string proof;
  uint64_t holdings_epoch = 0, holdings_base = 0;
};

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
  // worker: whether it loads from the cluster's storage nodes (its remote tier)
  bool uses_storage = false;
  // The chunk keys it holds (a worker: RAM and SSD tiers; a storage node: its SSD
  // tier), as a change since what the asker had (actors/cluster/holdings.h)
  HoldingsDelta holdings;
  int64_t chunks_held = 0;
  // storage: its SSD tier
  int64_t store_bytes = 0, store_entries = 0, store_budget = 0;
};

}  // namespace bs
