// What a request's loaders deliver into and the worker computes over, on one rank:
// the cache and the layer gate between them.
//
// Rank 0 (the only rank at tp 1): the layer worker owns the target. It allocates the
// cache from the KV page pool when it launches the prefill, hands the loaders it
// picked a reference in their load message (no table to find it in), and drops it,
// its pages back to the pool, when the request ends. A loader holds its reference
// while it writes, so the memory stays valid for a loader that has not stopped yet.
//
// Tensor parallel, ranks 1..: each follower's rank worker owns that rank's targets
// (RankTarget: a cache from the rank's own pool, the rank's copy events). Loaders
// send it the rank's KV heads of each layer as values (RankKv) and it copies them on
// the rank's copy stream; nothing outside the rank writes its caches. The gate on
// rank 0 counts every rank's delivery: a layer may be computed once every loader
// delivered it to every rank. Plain C++ (no CAF).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/kv_cache.h"

namespace bs {

// The loaders -> worker handshake for one request: layer l may be computed once
// every loader the request was sent to delivered it. A failure (a stored entry that
// failed its read, a loader that died, a cancel, a timeout) fails the gate, and the
// loaders stop at their next layer. The layer worker looks without waiting
// (delivered, failure, loaders_done) and parks a prefill whose layer is not there;
// the waits, each bounded, are for a caller that owns its thread.
class LayerGate {
 public:
  struct LoadFailed : std::runtime_error {
    LoadFailed(const std::string& why, bool recoverable) : std::runtime_error(why), recoverable(recoverable) {}
    // True when only a stored entry failed (its tier dropped it): the prefill begun
    // again with that chunk computed still answers correctly. False when
    // the load itself broke (a loader died, a timeout): the request fails.
    bool recoverable;
  };
  // n_layers to deliver, by each of `loaders` (their actor ids) to each of `ranks`
  // (tensor parallel: rank 0 and every follower; 1 at tp 1).
  void reset(int n_layers, std::vector<uint64_t> loaders, int ranks = 1);
  void arrive(int layer);  // one loader delivered `layer` to one rank
  // That loader ended its work on this request on `rank` (idempotent): no more writes
  // from it there.
  void loader_done(uint64_t loader, int rank = 0);
  // The loader is gone (it died): done on every rank.
  void loader_gone(uint64_t loader);
  // The rank's deliveries will not come (its rank worker died): done for every loader.
  void rank_gone(int rank);
  void fail(const std::string& why, bool recoverable = false);  // the first failure wins
  bool failed() const;                 // loaders look before each layer and stop
  // Without waiting: the failure (why, and whether it is recoverable), if any.
  bool failure(std::string& why, bool& recoverable) const;
  // Without waiting: every loader delivered `layer`.
  bool delivered(int layer) const;
  // Without waiting: no loader writes the cache any more (on any rank).
  bool loaders_done() const;
  // Waits at most `timeout` for `layer`: true when it is there; throws LoadFailed.
  bool wait_for(int layer, std::chrono::steady_clock::duration timeout);
  // Waits at most `timeout` until every loader is done (no loader writes the cache
  // any more): true when they are.
  bool wait_loaders_done_for(std::chrono::steady_clock::duration timeout);
  // The loader was sent this request and has not ended its work on it (on some rank).
  bool holds(uint64_t loader) const;
  int loaders() const;  // loaders the request was sent to
  int ranks() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct Pending {
    uint64_t loader;
    int rank;
    bool operator==(const Pending&) const = default;
  };
  std::vector<int> arrived_;
  std::vector<Pending> pending_;  // (loader, rank) not done yet
  int loaders_ = 0, ranks_ = 1;
  int expected_ = 0;  // deliveries per layer: loaders_ * ranks_
  std::string failure_;
  bool recoverable_ = false;
};

// The device half of the gate. A loader copies a layer on its own copy stream and
// records an event there before it reports the layer; the worker's compute stream
// waits for those events (on the device, the host does not block) before it computes
// the layer, so the copy of layer l+1 runs while layer l computes. On the CPU backends
// copies are done when issued and events are complete when recorded: a no-op there.
class LayerEvents {
 public:
  void add(int layer, std::shared_ptr<kernels::Event> event);
  // The events of `layer` added so far, removed from here.
  std::vector<std::shared_ptr<kernels::Event>> take(int layer);

 private:
  std::mutex mu_;
  std::unordered_map<int, std::vector<std::shared_ptr<kernels::Event>>> by_layer_;
};

struct LoadTarget {
  KvCache cache;   // capacity: the prompt and max_tokens; loaders write their parts' rows
  LayerGate gate;  // which layers every loader delivered to every rank; a failure stops them
  LayerEvents copied;  // per layer, the loaders' copy events (rank 0's backend)
  // Tensor parallel: the ranks the loaders deliver to (rank 0 here, ranks 1.. through
  // their rank workers as values); 1 at tp 1.
  int ranks = 1;
};
using LoadTargetPtr = std::shared_ptr<LoadTarget>;

// A follower rank's half of a load target, owned by that rank's worker actor
// (actors/runtime/rank_worker.cpp): its cache (the rank's KV heads, from the rank's pool) and
// the copy events of what it wrote there. The rank's compute thread holds a reference
// while a prefill job runs over it and waits for a layer's events before computing it.
struct RankTarget {
  KvCache cache;
  LayerEvents copied;
};
using RankTargetPtr = std::shared_ptr<RankTarget>;

}  // namespace bs
