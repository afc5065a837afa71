// What loaders write and the worker computes over, for one request: the cache
// (one per rank, tensor parallel) and the layer gate between them. The layer worker owns both (it allocates the
// cache from the KV page pool when it launches the prefill and drops it, its pages
// back to the pool, when the request ends); it
// publishes the pair in the runtime's LoadTargets under the request id, where the
// request's loaders (told the id by message) find it. A loader holds its own
// reference while it writes, so memory stays valid for a loader that has not
// stopped yet when the worker drops the request. Plain C++ (no CAF).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
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
    // True when only a stored entry failed (its tier dropped it): a prefill from the
    // whole entries still answers correctly, with that chunk as a miss. False when
    // the load itself broke (a loader died, a timeout): the request fails.
    bool recoverable;
  };
  // n_layers to deliver, by each of `loaders` (their actor ids).
  void reset(int n_layers, std::vector<uint64_t> loaders);
  void arrive(int layer);              // one loader delivered `layer`
  void loader_done(uint64_t loader);   // that loader ended its work on this request (idempotent)
  void fail(const std::string& why, bool recoverable = false);  // the first failure wins
  bool failed() const;                 // loaders look before each layer and stop
  // Without waiting: the failure (why, and whether it is recoverable), if any.
  bool failure(std::string& why, bool& recoverable) const;
  // Without waiting: every loader delivered `layer`.
  bool delivered(int layer) const;
  // Without waiting: no loader writes the cache any more.
  bool loaders_done() const;
  // Waits at most `timeout` for `layer`: true when it is there; throws LoadFailed.
  bool wait_for(int layer, std::chrono::steady_clock::duration timeout);
  // Waits at most `timeout` until every loader is done (no loader writes the cache
  // any more): true when they are.
  bool wait_loaders_done_for(std::chrono::steady_clock::duration timeout);
  // The loader was sent this request and has not ended its work on it.
  bool holds(uint64_t loader) const;
  int loaders() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> arrived_;
  std::vector<uint64_t> loaders_;  // not done yet
  int expected_ = 0;
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
  LayerGate gate;  // which layers every loader delivered; a failure stops them
  LayerEvents copied;  // per layer, the loaders' copy events (rank 0's backend)
  // Tensor parallel: the caches of ranks 1.. ([rank - 1]), each holding its KV heads
  // (`cache` is rank 0's); loaders write every rank's slice of a layer before they
  // report it delivered. Empty at tp 1.
  std::vector<KvCache> rank_caches;
};
using LoadTargetPtr = std::shared_ptr<LoadTarget>;

// The worker's load targets by request id (thread-safe): the worker puts and
// erases, loaders find, the supervisor fails the gates a dead loader held.
class LoadTargets {
 public:
  void put(uint64_t id, LoadTargetPtr t);
  LoadTargetPtr find(uint64_t id) const;  // null when the worker dropped the request
  void erase(uint64_t id);
  void clear();
  // Calls f on every target (under the lock: f must not call back into this).
  void for_each(const std::function<void(uint64_t, LoadTarget&)>& f) const;
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, LoadTargetPtr> targets_;
};

}  // namespace bs
