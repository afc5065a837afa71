// What the frontend (http/frontend.cpp) reports about the cluster: its members as the
// console and /v1/inspect/cluster show them, the console's snapshot of every node, and
// its own counters as Prometheus text.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "actors/cluster/cluster_monitor.h"
#include "actors/cluster/request_router.h"
#include "http/frontend.h"

namespace bs::http {

// Each member of `view`: name, role, address, up, downs, its last error, the age of
// its last report, and the report (a worker's load and holdings, a storage node's
// tier; `router`'s requests in flight to a worker).
nlohmann::json cluster_members_json(const ClusterView& view, const RequestRouter& router);

// The console's snapshot (GET /v1/inspect/snapshot): the frontend with the members,
// each storage node's tier, and each worker up's own snapshot, asked of it over HTTP
// (2 s bounds; a worker that gives none is marked with an error).
std::string cluster_snapshot(const FrontendOptions& opt, const ClusterView& view, const RequestRouter& router,
                             const std::map<std::string, FrontendWorker>& workers);

// The frontend's counters, written by its HTTP threads under `mu`.
struct FrontendMetrics {
  mutable std::mutex mu;
  std::map<std::string, int64_t> routed, failed;  // per worker: completions sent (retries included), failed
  int64_t retries = 0, refused_no_worker = 0, mid_stream_failures = 0;
  // Document tokens of routed completions: held by the chosen worker, held only by a
  // storage node, all.
  int64_t held_tokens = 0, storage_tokens = 0, request_tokens = 0;
  int64_t heartbeat_failures = 0, forwards_refused = 0;
  // /metrics: the members' up and downs from `view`, then these counters.
  std::string text(const ClusterView& view) const;
};

}  // namespace bs::http
