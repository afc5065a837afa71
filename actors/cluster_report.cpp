#include "actors/cluster_report.h"

#include <algorithm>

#include "actors/runtime.h"
#include "actors/runtime_context.h"
#include "storage/key_bloom.h"

namespace bs {

NodeReport make_worker_report(const Runtime& runtime, const std::string& node) {
  const RuntimeContext& ctx = runtime.context();
  NodeReport r;
  r.node = node;
  r.role = "worker";
  r.in_flight = ctx.in_flight.load();
  r.queued = ctx.queued.load();
  r.max_requests = ctx.config.max_requests;
  r.max_queue = ctx.config.max_queue;
  r.fingerprint = ctx.model->fingerprint();
  r.prelude = ctx.model->tokenizer().encode(ctx.config.chunk_prelude, true);
  std::vector<ChunkKey> keys;
  if (ctx.ram) keys = ctx.ram->keys();
  if (ctx.ssd) {
    auto more = ctx.ssd->keys();
    keys.insert(keys.end(), more.begin(), more.end());
  }
  // A chunk in both tiers counts once.
  std::sort(keys.begin(), keys.end(), [](const ChunkKey& a, const ChunkKey& b) {
    return a.hi != b.hi ? a.hi < b.hi : a.lo < b.lo;
  });
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  // Sized for what is held now with room to grow until the next report.
  auto bloom = KeyBloom::sized_for(static_cast<int64_t>(keys.size()) + 64, 0.01);
  for (const auto& k : keys) bloom.add(k);
  r.bloom_words = bloom.words();
  r.bloom_probes = bloom.probes();
  r.chunks_held = static_cast<int64_t>(keys.size());
  return r;
}

NodeReport make_storage_report(const DiskKvStore& store, const std::string& node) {
  NodeReport r;
  r.node = node;
  r.role = "storage";
  const StoreStats s = store.stats();
  r.store_bytes = s.bytes;
  r.store_entries = s.entries;
  r.store_budget = store.budget();
  return r;
}

}  // namespace bs
