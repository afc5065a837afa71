// Which worker a cluster frontend sends a request to. KV-aware (the default): the
// up worker that has the least of the request's document KV to compute, counted in
// tokens: what its RAM and SSD tiers hold (the keys of its reports, plus the chunks
// of requests this frontend sent it since: a write-back lands before the next report
// says so) and, for a worker with the remote tier, what an up storage node holds;
// among equals the one that holds more itself (a local load beats a remote one);
// ties, and workers that are full, go by load (requests this frontend has in flight
// there, or what the worker reported queued + running, whichever is larger), then in
// turn. Round robin: in turn among the up workers that are not full (the baseline
// `bench serve` compares against).
//
// A worker's chunk keys depend on its model fingerprint and chunk prelude (its
// report says both), so the keys are computed per worker, exactly as its intake
// would (storage/chunk_kv.h make_chunk_key); a storage node's keys are looked up
// with the same worker's keys. A key a report still lists after its eviction only
// costs a worse choice, never a wrong answer: the worker computes what it lacks.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "actors/cluster/cluster_monitor.h"

namespace bs {

enum class RoutingPolicy { kv_aware, round_robin };
// "kv_aware" | "round_robin"; std::invalid_argument otherwise.
RoutingPolicy parse_routing_policy(const std::string& name);

struct RouteChoice {
  std::string worker;
  int64_t held_tokens = 0;  // the request's document tokens the worker holds (as far as the router knows)
  int64_t storage_tokens = 0;  // and those it does not hold that an up storage node does (it has the remote tier)
  int64_t load = 0;         // its load when chosen
  bool overloaded = false;  // every up worker was full: chosen anyway (it queues or refuses with 503)
};

class RequestRouter {
 public:
  // recent_keys_s: how long chunks of a routed request count as held by its worker
  // without a report saying so.
  explicit RequestRouter(RoutingPolicy policy, double recent_keys_s = 30);

  // chunks: the request's document chunks, as token ids (blend/rag_prompt.h
  // document_chunk_tokens). exclude: workers not to use (one that failed this
  // request). nullopt when no worker is up (outside `exclude`).
  std::optional<RouteChoice> choose(const ClusterView& view, const std::vector<std::vector<int32_t>>& chunks,
                                    const std::set<std::string>& exclude = {});
  // The request went to `worker` (counts in its load until finished()); its chunks
  // count as held there for recent_keys_s.
  void started(const ClusterView& view, const std::string& worker, const std::vector<std::vector<int32_t>>& chunks);
  void finished(const std::string& worker);
  int64_t in_flight(const std::string& worker) const;

 private:
  using clock_type = std::chrono::steady_clock;
  struct Recent {
    std::map<std::pair<uint64_t, uint64_t>, clock_type::time_point> keys;  // key -> until when it counts
  };
  RoutingPolicy policy_;
  std::chrono::duration<double> recent_for_;
  mutable std::mutex mu_;
  std::map<std::string, int64_t> in_flight_;
  std::map<std::string, Recent> recent_;
  uint64_t turn_ = 0;
};

}  // namespace bs
