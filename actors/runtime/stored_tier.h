// A stored tier as the runtime lists it (where chunk KV may come from, its loaders,
// what they moved) and the bounded queue in front of a tier's writer. Part of the
// runtime's context (runtime_context.h) and of what the actors are given
// (actor_env.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "storage/kv_store.h"

namespace bs {

// Chunk KV on its way to a tier's writer (the SSD's, the remote tier's): bounded by
// tiers.ssd.write_queue.
struct WriteQueue {
  std::atomic<int64_t> bytes{0};       // queued now
  std::atomic<int64_t> high_water{0};  // the most ever queued at once
  std::atomic<int64_t> dropped{0};     // entries refused because the queue was full (or its writer died)
  std::atomic<int64_t> written{0};     // entries the writer handled
};

// What the tier's loaders moved since start (monotonic; /metrics, the console).
struct TierLoadCounters {
  std::atomic<int64_t> bytes{0};  // K/V bytes loaded into requests' caches
  std::atomic<int64_t> ns{0};     // loader time spent on them (reading and writing into the caches)
  std::atomic<int64_t> loads{0};  // requests' loads finished (stopped and failed ones included)
};

// A stored tier: where chunk KV may come from. RuntimeContext::tiers lists them in
// lookup order (RAM, then SSD, then the remote tier) and a TierId is
// the index. Everything per tier — the controller's lookup and profile, the
// loaders, trace and metrics labels, result counters — follows this list, so a
// tier is added in one place (Runtime's constructor).
struct StoredTier {
  std::string name;                 // "ram", "ssd", "remote": profile sources, metrics labels, actor names
  KvStore* store = nullptr;         // owned by the context
  double start_bytes_per_s = 1e9;   // the controller's estimate until it measured the tier
  int loaders = 1;                  // loader actors: this many requests' loads at once
  std::shared_ptr<TierLoadCounters> load = std::make_shared<TierLoadCounters>();
};

}  // namespace bs
